// The MoE feed-forward op and the MoE model against PyTorch (fixture written by
// tests/fixtures/gen_moe_fixture.py from the Hugging Face Qwen2-MoE math): outputs, auxiliary
// losses and every gradient; routing facts written out by hand (ties, an expert without tokens);
// the inventory's names, roles and counts.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "checkpoint/safetensors.h"
#include "models/moe.h"
#include "runtime/autograd.h"
#include "runtime/ops.h"
#include "runtime/ops_moe.h"
#include "tests/models/model_test_util.h"

using namespace mfsdp;

namespace {

const std::string kFixture = std::string(MFSDP_SOURCE_DIR) + "/tests/fixtures/moe_tiny.safetensors";

Tensor leaf(const SafetensorsFile& f, const std::string& name) {
  Shape shape(f.info(name).shape.begin(), f.info(name).shape.end());
  return Tensor::from_vector(f.read_f32(name), shape).set_requires_grad(true);
}

// One single-layer case of the fixture: its weights as leaves, keyed by their names.
struct LayerCase {
  std::map<std::string, Tensor> w;
  std::vector<SwigluWeights> experts;
  SwigluWeights shared;
  Tensor shared_gate;
  LayerCase(const SafetensorsFile& f, const std::string& prefix, int E, bool with_shared) {
    auto get = [&](const std::string& n) { return w[n] = leaf(f, prefix + "." + n); };
    get("gate.weight");
    for (int e = 0; e < E; ++e) {
      const std::string p = "experts." + std::to_string(e) + ".";
      experts.push_back({get(p + "gate_proj.weight"), get(p + "up_proj.weight"), get(p + "down_proj.weight")});
    }
    if (with_shared) {
      shared = {get("shared_expert.gate_proj.weight"), get("shared_expert.up_proj.weight"),
                get("shared_expert.down_proj.weight")};
      shared_gate = get("shared_expert_gate.weight");
    }
  }
};

MoeConfig fixture_config(const SafetensorsFile& f) {
  const auto& m = f.metadata();
  auto geti = [&](const char* k) { return std::stoi(m.at(k)); };
  MoeConfig c;
  c.n_layer = geti("n_layer");
  c.n_head = geti("n_head");
  c.n_kv_head = geti("n_kv_head");
  c.n_embd = geti("n_embd");
  c.seq_len = geti("seq_len");
  c.vocab_size = geti("vocab_size");
  c.tie_embeddings = m.at("tie_embeddings") == "true";
  c.norm_eps = std::stod(m.at("norm_eps"));
  c.rope_theta = std::stod(m.at("rope_theta"));
  c.num_experts = geti("num_experts");
  c.num_experts_per_tok = geti("num_experts_per_tok");
  c.moe_intermediate_size = geti("moe_intermediate_size");
  c.shared_expert_intermediate_size = geti("shared_expert_intermediate_size");
  c.norm_topk_prob = m.at("norm_topk_prob") == "true";
  c.router_aux_loss_coef = std::stod(m.at("router_aux_loss_coef"));
  c.router_z_loss_coef = std::stod(m.at("router_z_loss_coef"));
  return c;
}

}  // namespace

TEST_CASE("moe_feed_forward matches PyTorch: output, auxiliary losses, every gradient", "[moe][pytorch]") {
  const SafetensorsFile f(kFixture);
  struct Case {
    const char* name;
    int E, k;
    bool norm, shared;
    double aux_w, z_w;
  };
  // the generator's LAYERS
  for (const Case& c : {Case{"layer_a", 4, 2, false, true, 0.5, 0.05}, Case{"layer_b", 6, 3, true, false, 0.2, 0.0}}) {
    INFO(c.name);
    LayerCase L(f, c.name, c.E, c.shared);
    Tensor x = leaf(f, std::string(c.name) + ".x");
    MoeOptions opt{c.k, c.norm, c.aux_w, c.z_w};
    MoeRouting routing;
    Tensor y = moe_feed_forward(x, L.w.at("gate.weight"), L.experts, L.shared, L.shared_gate, opt, &routing);
    CHECK(rel_error(y.to_vector(), f.read_f32(std::string(c.name) + ".y")) <= 1e-4);
    const auto losses = f.read_f32(std::string(c.name) + ".losses");
    CHECK(std::fabs(routing.aux_loss - losses[0]) <= 1e-5 * losses[0]);
    CHECK(std::fabs(routing.z_loss - losses[1]) <= 1e-5 * losses[1]);
    int64_t assigned = 0;
    for (int64_t n : routing.tokens_per_expert) assigned += n;
    CHECK(assigned == x.size(0) * c.k);
    backward(y, leaf(f, std::string(c.name) + ".upstream").detach());
    CHECK(rel_error(x.grad().to_vector(), f.read_f32(std::string(c.name) + ".grad.x")) <= 1e-3);
    for (const auto& [n, t] : L.w) {
      INFO(n);
      CHECK(rel_error(t.grad().to_vector(), f.read_f32(std::string(c.name) + ".grad." + n)) <= 1e-3);
    }
  }
}

TEST_CASE("MoE model forward/backward matches PyTorch on the tiny fixture (auxiliary losses included)",
          "[moe][pytorch]") {
  const SafetensorsFile f(kFixture);
  const MoeConfig cfg = fixture_config(f);
  REQUIRE(cfg.shared_expert_intermediate_size > 0);
  REQUIRE(cfg.router_aux_loss_coef > 0);
  REQUIRE(cfg.router_z_loss_coef > 0);
  MoeTransformer model(cfg);
  model.allocate_local(1);
  load_fixture_weights(f, model);
  const int64_t B = f.info("tokens").shape[0], T = f.info("tokens").shape[1];
  MicroBatch mb{tokens_tensor(f.read_i32("tokens"), {B, T}), tokens_tensor(f.read_i32("targets"), {B, T})};

  // Unit by unit, as the engine runs it (mean loss: divisor 0).
  Tensor x;
  for (int u = 0; u < model.head_unit(); ++u) x = model.forward_unit(u, x, mb, 0);
  Tensor loss = model.forward_unit(model.head_unit(), x, mb, 0);
  const float want_ce = f.read_f32("ce_loss")[0];
  CHECK(std::fabs(loss.item() - want_ce) / want_ce <= 1e-4);
  const auto aux = f.read_f32("aux_loss"), z = f.read_f32("z_loss");
  double objective = loss.item();
  for (int l = 0; l < cfg.n_layer; ++l) {
    CHECK(std::fabs(model.last_routing()[l].aux_loss - aux[l]) <= 1e-4 * aux[l]);
    CHECK(std::fabs(model.last_routing()[l].z_loss - z[l]) <= 1e-4 * z[l]);
    objective += (cfg.router_aux_loss_coef * model.last_routing()[l].aux_loss +
                  cfg.router_z_loss_coef * model.last_routing()[l].z_loss) / cfg.n_layer;
  }
  CHECK(std::fabs(objective - f.read_f32("loss")[0]) <= 1e-4 * f.read_f32("loss")[0]);

  backward(loss);  // the auxiliary losses' gradients enter through the MoE op's backward
  for (const auto& p : model.inventory().params) {
    INFO(p.name);
    CHECK(rel_error(model.param(p.name).grad().to_vector(), f.read_f32("grad." + p.name)) <= 1e-3);
  }
}

TEST_CASE("moe_feed_forward routing: ties go to the lower expert, an expert without tokens gets zero gradients",
          "[moe]") {
  // C = 4, E = 4, x > 0 everywhere: routers 0 and 1 are equal and largest, router 3 is negative.
  const int64_t N = 5, C = 4, I = 3;
  std::vector<float> xv(N * C);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = 0.5f + 0.1f * static_cast<float>(i % 7);
  Tensor x = Tensor::from_vector(xv, {N, C}).set_requires_grad(true);
  Tensor router = Tensor::from_vector({1, 1, 1, 1, 1, 1, 1, 1, 0.5f, 0.5f, 0.5f, 0.5f, -1, -1, -1, -1}, {4, C})
                      .set_requires_grad(true);
  std::vector<SwigluWeights> experts;
  for (int e = 0; e < 4; ++e) {
    auto w = [&](int64_t r, int64_t c, float s) {
      std::vector<float> v(r * c);
      for (size_t i = 0; i < v.size(); ++i) v[i] = s * static_cast<float>((i * 7 + e * 3) % 11) - 0.5f * s;
      return Tensor::from_vector(v, {r, c}).set_requires_grad(true);
    };
    experts.push_back({w(I, C, 0.1f), w(I, C, 0.2f), w(C, I, 0.3f)});
  }
  MoeRouting routing;
  Tensor y = moe_feed_forward(x, router, experts, {}, Tensor(), MoeOptions{1, false, 0, 0}, &routing);
  std::vector<int64_t> all_on_0(4, 0), on_0_and_1(4, 0);
  all_on_0[0] = on_0_and_1[0] = on_0_and_1[1] = N;
  CHECK(routing.tokens_per_expert == all_on_0);  // the tie goes to expert 0
  {  // y = p_0 * expert_0(x), written out with the runtime's dense ops
    NoGradGuard ng;
    Tensor dense = linear(swiglu(linear(x, experts[0].gate), linear(x, experts[0].up)), experts[0].down);
    const auto yd = dense.to_vector(), got = y.to_vector();
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;  // logits: s, s, s/2, -s with s the row sum of x
      for (int64_t c = 0; c < C; ++c) s += xv[n * C + c];
      const double p = 1.0 / (2.0 + std::exp(-0.5 * s) + std::exp(-2.0 * s));
      for (int64_t c = 0; c < C; ++c) CHECK(got[n * C + c] == Approx(p * yd[n * C + c]).epsilon(1e-5));
    }
  }
  MoeRouting top2;
  Tensor y2 = moe_feed_forward(x, router, experts, {}, Tensor(), MoeOptions{2, true, 1.0, 0}, &top2);
  CHECK(top2.tokens_per_expert == on_0_and_1);
  backward(y2, Tensor::from_vector(std::vector<float>(N * C, 1.0f), {N, C}));
  for (int e : {2, 3})
    for (const Tensor* t : {&experts[e].gate, &experts[e].up, &experts[e].down}) {
      REQUIRE(t->grad().defined());
      for (float g : t->grad().to_vector()) CHECK(g == 0.0f);
    }
  for (float g : experts[1].down.grad().to_vector()) CHECK(std::isfinite(g));
  CHECK_THROWS_WITH(moe_feed_forward(x, router, experts, {}, Tensor(), MoeOptions{5, false, 0, 0}),
                    Catch::Contains("[moe_feed_forward] top_k 5 outside [1, 4]"));
  {
    MatmulDTypeScope bf16(DType::bf16);
    CHECK_THROWS_WITH(moe_feed_forward(x, router, experts, {}, Tensor(), MoeOptions{}), Catch::Contains("bf16"));
  }
}

TEST_CASE("MoE inventory: Qwen2-MoE names, roles, units, counts; validation names the field", "[moe]") {
  MoeConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  cfg.n_embd = 64;
  cfg.vocab_size = 100;
  cfg.num_experts = 8;
  cfg.num_experts_per_tok = 2;
  cfg.moe_intermediate_size = 32;
  cfg.shared_expert_intermediate_size = 48;
  const auto inv = moe_inventory(cfg);
  REQUIRE(inv.unit_names == std::vector<std::string>{"embedding", "layers.0", "layers.1", "head"});
  // per layer: 2 norms, 4 attention, router, 8 * 3 experts, 3 shared + its gate
  REQUIRE(inv.params.size() == 1 + 2 * (6 + 1 + 24 + 4) + 2);
  std::map<std::string, ParamSpec> by_name;
  for (const auto& p : inv.params) by_name[p.name] = p;
  const auto& router = by_name.at("model.layers.1.mlp.gate.weight");
  CHECK(router.shape == std::vector<int64_t>{8, 64});
  CHECK(router.role == ParamRole::router);
  CHECK(router.unit == 2);
  CHECK(by_name.at("model.layers.0.mlp.experts.7.down_proj.weight").shape == std::vector<int64_t>{64, 32});
  CHECK(by_name.at("model.layers.0.mlp.experts.7.down_proj.weight").role == ParamRole::matrix);
  CHECK(by_name.at("model.layers.0.mlp.shared_expert.up_proj.weight").shape == std::vector<int64_t>{48, 64});
  CHECK(by_name.at("model.layers.0.mlp.shared_expert_gate.weight").role == ParamRole::router);
  CHECK(by_name.at("model.layers.0.self_attn.k_proj.weight").shape == std::vector<int64_t>{32, 64});
  // attention 2*(64*64) + 2*(32*64), norms 2*64, router 8*64, experts 8*3*32*64, shared 3*48*64 + 64
  const int64_t layer = 2 * 4096 + 2 * 2048 + 128 + 512 + 8 * 3 * 2048 + 3 * 3072 + 64;
  CHECK(cfg.num_params() == 2 * layer + 2 * 128 * 64 + 64);
  CHECK(cfg.num_active_params() == cfg.num_params() - 2 * 6 * 3 * 2048);
  cfg.router_on_muon = true;
  for (const auto& p : moe_inventory(cfg).params)
    if (p.name.ends_with("mlp.gate.weight")) CHECK(p.role == ParamRole::matrix);
  cfg.num_experts_per_tok = 9;
  CHECK_THROWS_WITH(cfg.validate(), Catch::Contains("model.num_experts_per_tok"));
  cfg.num_experts_per_tok = 2;
  cfg.shared_expert_intermediate_size = -1;
  CHECK_THROWS_WITH(cfg.validate(), Catch::Contains("model.shared_expert_intermediate_size"));
}
