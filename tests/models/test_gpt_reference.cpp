// The whole GPT-2 against PyTorch (fixture written by tests/fixtures/gen_gpt2_fixture.py):
// logits, loss, every parameter gradient, and the losses of 5 AdamW steps.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "checkpoint/safetensors.h"
#include "models/gpt.h"
#include "optim/adamw.h"
#include "runtime/autograd.h"
#include "runtime/ops.h"
#include "tests/models/model_test_util.h"

using namespace mfsdp;

namespace {

const std::string kFixture = std::string(MFSDP_SOURCE_DIR) + "/tests/fixtures/gpt2_tiny.safetensors";

struct Fixture {
  SafetensorsFile file{kFixture};
  GPTConfig cfg;
  int64_t B = 0, T = 0;
  Fixture() {
    auto& m = file.metadata();
    auto geti = [&](const char* k) { return std::stoi(m.at(k)); };
    cfg.n_layer = geti("n_layer");
    cfg.n_head = geti("n_head");
    cfg.n_embd = geti("n_embd");
    cfg.seq_len = geti("seq_len");
    cfg.vocab_size = geti("vocab_size");
    cfg.tie_embeddings = m.at("tie_embeddings") == "true" || m.at("tie_embeddings") == "1";
    B = file.info("tokens").shape[0];
    T = file.info("tokens").shape[1];
  }
};

}  // namespace

TEST_CASE("GPT-2 forward/backward matches PyTorch on the tiny fixture", "[model][pytorch]") {
  Fixture fx;
  GPT model(fx.cfg);
  model.allocate_local(1);
  load_fixture_weights(fx.file, model);
  Tensor tokens = tokens_tensor(fx.file.read_i32("tokens"), {fx.B, fx.T});
  Tensor targets = tokens_tensor(fx.file.read_i32("targets"), {fx.B, fx.T});

  Tensor x = model.embed(tokens);
  for (int l = 0; l < fx.cfg.n_layer; ++l) x = model.block(l, x);
  Tensor logits = model.logits(x);
  Tensor loss = cross_entropy(logits, targets.reshape({fx.B * fx.T}), fx.cfg.vocab_size);

  // logits: fixture holds the unpadded [B, T, V] columns
  const int64_t V = fx.cfg.vocab_size, Vp = fx.cfg.padded_vocab_size();
  CHECK(rel_error(unpadded_columns(logits.to_vector(), fx.B * fx.T, V, Vp), fx.file.read_f32("logits")) <= 1e-4);
  const float want_loss = fx.file.read_f32("loss")[0];
  CHECK(std::fabs(loss.item() - want_loss) / want_loss <= 1e-4);

  backward(loss);
  for (const auto& p : model.inventory().params) {
    auto g = model.param(p.name).grad().to_vector();
    auto want = fx.file.read_f32("grad." + p.name);
    INFO(p.name);
    if (p.name.find("c_attn.bias") != std::string::npos) {
      // The key slice [C, 2C) has an analytically zero gradient (softmax shift invariance): compare
      // it absolutely, the rest relatively.
      const int64_t C = fx.cfg.n_embd;
      std::vector<float> gq(g.begin(), g.begin() + C), wq(want.begin(), want.begin() + C);
      std::vector<float> gv(g.begin() + 2 * C, g.end()), wv(want.begin() + 2 * C, want.end());
      CHECK(rel_error(gq, wq) <= 1e-3);
      CHECK(rel_error(gv, wv) <= 1e-3);
      for (int64_t i = C; i < 2 * C; ++i) CHECK(std::fabs(g[i]) <= 1e-6);
    } else {
      CHECK(rel_error(g, want) <= 1e-3);
    }
  }
}

TEST_CASE("GPT-2's fused head (head_loss) has the bits of logits + cross_entropy (one chunk)", "[model][classifier]") {
  Fixture fx;
  GPT model(fx.cfg);
  model.allocate_local(1);
  load_fixture_weights(fx.file, model);
  check_fused_head_bits(model, tokens_tensor(fx.file.read_i32("tokens"), {fx.B, fx.T}),
                        tokens_tensor(fx.file.read_i32("targets"), {fx.B, fx.T}));
}

TEST_CASE("GPT-2 with AdamW reproduces PyTorch's 5 losses", "[model][pytorch]") {
  Fixture fx;
  GPT model(fx.cfg);
  model.allocate_local(1);
  load_fixture_weights(fx.file, model);
  Tensor tokens = tokens_tensor(fx.file.read_i32("tokens"), {fx.B, fx.T});
  Tensor targets = tokens_tensor(fx.file.read_i32("targets"), {fx.B, fx.T});
  auto want = fx.file.read_f32("adamw_losses");
  std::vector<Tensor> m, v;
  for (const auto& p : model.inventory().params) {
    m.push_back(Tensor::zeros(p.shape));
    v.push_back(Tensor::zeros(p.shape));
  }
  AdamWOptions opt;
  opt.beta1 = 0.9;
  opt.beta2 = 0.95;
  opt.eps = 1e-8;
  for (int step = 0; step < 5; ++step) {
    model.local_grads().zero();
    Tensor loss = model.forward_loss(tokens, targets);
    INFO("step " << step << " loss " << loss.item() << " want " << want[step]);
    CHECK(std::fabs(loss.item() - want[step]) <= 1e-4);
    backward(loss);
    size_t i = 0;
    for (const auto& p : model.inventory().params) {
      AdamWOptions o = opt;
      o.weight_decay = p.shape.size() >= 2 ? 0.1 : 0.0;  // the fixture decays only tensors with dim >= 2
      const Tensor& w = model.param(p.name);
      adamw_step_cpu(w.data_f32(), w.grad().data_f32(), m[i].data_f32(), v[i].data_f32(), p.numel(), 1e-2, step + 1, o);
      ++i;
    }
  }
}

TEST_CASE("greedy sampling follows the whole model's argmax", "[model][sampling]") {
  Fixture fx;
  GPT model(fx.cfg);
  model.allocate_local(1);
  load_fixture_weights(fx.file, model);
  std::vector<int32_t> ctx = {3, 17, 42, 8};
  auto next = sample_tokens(model, ctx, 1, 1e-6f, 0, 7);  // temperature ~0: greedy
  NoGradGuard ng;
  auto logits = model.forward_logits(tokens_tensor(ctx, {1, 4})).to_vector();
  const int64_t Vp = fx.cfg.padded_vocab_size();
  int best = 0;
  for (int v = 0; v < fx.cfg.vocab_size; ++v)
    if (logits[3 * Vp + v] > logits[3 * Vp + best]) best = v;
  REQUIRE(next.size() == 1);
  CHECK(next[0] == best);
  // the same seed gives the same continuation; tokens stay inside the vocabulary
  auto a = sample_tokens(model, ctx, 20, 0.8f, 0, 11), b = sample_tokens(model, ctx, 20, 0.8f, 0, 11);
  CHECK(a == b);
  for (int32_t t : a) CHECK((t >= 0 && t < fx.cfg.vocab_size));
}

TEST_CASE("initialisation of any slice has the bits of the whole tensor's", "[model][init]") {
  // The engine initialises only the pieces a rank stores (ShardedEngine::init_parameters): every
  // slice, odd starts and single elements included, must equal the same range of the whole draw.
  GPTConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 8;
  cfg.seq_len = 8;
  cfg.vocab_size = 61;  // padded to 64 rows: the last 3 rows are zero
  const GPT model(cfg);
  for (const ParamSpec& spec : model.inventory().params) {
    const int64_t n = spec.numel();
    std::vector<float> whole(static_cast<size_t>(n));
    model.init_param(spec, 7, 0, n, whole.data());
    for (const auto& [first, count] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 1}, {1, 1}, {1, n - 1}, {n / 2, n - n / 2}, {n - 1, 1}, {3, std::min<int64_t>(n - 3, 5)}}) {
      if (first < 0 || count <= 0 || first + count > n) continue;
      std::vector<float> part(static_cast<size_t>(count));
      model.init_param(spec, 7, first, count, part.data());
      CHECK(std::memcmp(part.data(), whole.data() + first, sizeof(float) * static_cast<size_t>(count)) == 0);
    }
    if (spec.name == "wte.weight") {
      CHECK(whole[static_cast<size_t>(61 * 8 - 1)] != 0.0f);
      for (int64_t i = 61 * 8; i < n; ++i) CHECK(whole[static_cast<size_t>(i)] == 0.0f);
    }
  }
  // Seeds and names choose the stream: another seed gives other values.
  const ParamSpec& wte = model.inventory().params.front();
  float a = 0, b = 0;
  model.init_param(wte, 7, 5, 1, &a);
  model.init_param(wte, 8, 5, 1, &b);
  CHECK(a != b);
}
