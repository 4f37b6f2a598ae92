// The whole Llama against PyTorch (fixture written by tests/fixtures/gen_llama_fixture.py from the
// Hugging Face Llama math): logits, loss and every parameter gradient; the unit split; sampling.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include "checkpoint/safetensors.h"
#include "models/llama.h"
#include "models/llama_hf.h"
#include "runtime/autograd.h"
#include "runtime/ops.h"
#include "tests/models/model_test_util.h"

using namespace mfsdp;

namespace {

const std::string kFixture = std::string(MFSDP_SOURCE_DIR) + "/tests/fixtures/llama_tiny.safetensors";

struct Fixture {
  SafetensorsFile file{kFixture};
  LlamaConfig cfg;
  int64_t B = 0, T = 0;
  Fixture() {
    auto& m = file.metadata();
    auto geti = [&](const char* k) { return std::stoi(m.at(k)); };
    cfg.n_layer = geti("n_layer");
    cfg.n_head = geti("n_head");
    cfg.n_kv_head = geti("n_kv_head");
    cfg.n_embd = geti("n_embd");
    cfg.intermediate_size = geti("intermediate_size");
    cfg.seq_len = geti("seq_len");
    cfg.vocab_size = geti("vocab_size");
    cfg.tie_embeddings = m.at("tie_embeddings") == "true";
    cfg.norm_eps = std::stod(m.at("norm_eps"));
    cfg.rope_theta = std::stod(m.at("rope_theta"));
    B = file.info("tokens").shape[0];
    T = file.info("tokens").shape[1];
  }
};

}  // namespace

TEST_CASE("Llama forward/backward matches PyTorch on the tiny fixture", "[llama][pytorch]") {
  Fixture fx;
  REQUIRE(fx.cfg.n_kv_head < fx.cfg.n_head);  // the fixture exercises grouped-query attention
  Llama model(fx.cfg);
  model.allocate_local(1);
  load_fixture_weights(fx.file, model);
  Tensor tokens = tokens_tensor(fx.file.read_i32("tokens"), {fx.B, fx.T});
  Tensor targets = tokens_tensor(fx.file.read_i32("targets"), {fx.B, fx.T});

  // Unit by unit, as the engine runs it.
  MicroBatch mb{tokens, targets};
  Tensor x;
  for (int u = 0; u < model.head_unit(); ++u) x = model.forward_unit(u, x, mb, 0);
  Tensor logits = model.logits(x);
  Tensor loss = model.forward_unit(model.head_unit(), x, mb, 0);

  const int64_t V = fx.cfg.vocab_size, Vp = fx.cfg.padded_vocab_size();
  CHECK(rel_error(unpadded_columns(logits.to_vector(), fx.B * fx.T, V, Vp), fx.file.read_f32("logits")) <= 1e-4);
  const float want_loss = fx.file.read_f32("loss")[0];
  CHECK(std::fabs(loss.item() - want_loss) / want_loss <= 1e-4);

  backward(loss);
  for (const auto& p : model.inventory().params) {
    INFO(p.name);
    CHECK(rel_error(model.param(p.name).grad().to_vector(), fx.file.read_f32("grad." + p.name)) <= 1e-3);
  }
}

TEST_CASE("Llama's fused head (head_loss) has the bits of logits + cross_entropy (one chunk)", "[llama][classifier]") {
  Fixture fx;
  Llama model(fx.cfg);
  model.allocate_local(1);
  load_fixture_weights(fx.file, model);
  check_fused_head_bits(model, tokens_tensor(fx.file.read_i32("tokens"), {fx.B, fx.T}),
                        tokens_tensor(fx.file.read_i32("targets"), {fx.B, fx.T}));
}

TEST_CASE("Llama inventory: HF names, roles, units, GQA shapes", "[llama]") {
  LlamaConfig cfg{.n_layer = 2, .n_head = 8, .n_kv_head = 2, .n_embd = 64, .intermediate_size = 176, .vocab_size = 100};
  auto inv = llama_inventory(cfg);
  REQUIRE(inv.unit_names == std::vector<std::string>{"embedding", "layers.0", "layers.1", "head"});
  REQUIRE(inv.params.size() == 1 + 2 * 9 + 2);
  CHECK(inv.params[0].name == "model.embed_tokens.weight");
  CHECK(inv.params[0].shape == std::vector<int64_t>{128, 64});
  const auto& k = inv.params[3];
  CHECK(k.name == "model.layers.0.self_attn.k_proj.weight");
  CHECK(k.shape == std::vector<int64_t>{16, 64});  // n_kv_head * head_dim rows
  CHECK(k.role == ParamRole::matrix);
  CHECK(inv.params[1].role == ParamRole::norm);
  CHECK(inv.params.back().name == "lm_head.weight");
  CHECK(inv.params.back().role == ParamRole::head);
  CHECK(inv.params.back().unit == 3);
  // 2 * (q 64*64 + k,v 2*16*64 + o 64*64 + gate,up,down 3*176*64 + 2 norms 64) + embed/head 2*128*64 + norm 64
  CHECK(cfg.num_params() == 2 * (4096 + 2048 + 4096 + 3 * 11264 + 128) + 2 * 8192 + 64);
  // PaLM FLOPs: every projection and the untied head multiply; the lookup and the norms do not.
  CHECK(cfg.flops_per_token(64) == 6.0 * (cfg.num_params() - 8192 - (2 * 2 * 64 + 64)) + 12.0 * 2 * 64 * 64);
  cfg.n_kv_head = 3;
  CHECK_THROWS_WITH(cfg.validate(), Catch::Contains("model.n_kv_head"));
}

TEST_CASE("Llama sampling is deterministic and greedy at temperature ~0", "[llama]") {
  Fixture fx;
  Llama model(fx.cfg);
  model.allocate_local(1);
  load_fixture_weights(fx.file, model);
  std::vector<int32_t> ctx = {3, 14, 15, 92};
  auto next = sample_tokens(model, ctx, 1, 1e-6f, 0, 7);
  NoGradGuard ng;
  auto logits = model.forward_logits(tokens_tensor(ctx, {1, 4})).to_vector();
  const float* last = logits.data() + 3 * fx.cfg.padded_vocab_size();
  CHECK(next[0] == std::max_element(last, last + fx.cfg.vocab_size) - last);
  CHECK(sample_tokens(model, ctx, 20, 0.8f, 0, 11) == sample_tokens(model, ctx, 20, 0.8f, 0, 11));
}

TEST_CASE("Llama HF directory export/import round trip, sharded checkpoints, config mismatches", "[llama]") {
  namespace fs = std::filesystem;
  Fixture fx;
  NamedTensors params;
  for (const auto& p : llama_inventory(fx.cfg).params) params[p.name] = fx.file.read_f32(p.name);
  const fs::path dir = fs::temp_directory_path() / ("mfsdp_llama_hf_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  export_hf_llama(dir.string(), fx.cfg, params, DType::f32, {{"step", "7"}});
  REQUIRE(fs::is_regular_file(dir / "model.safetensors"));
  REQUIRE(fs::is_regular_file(dir / "config.json"));
  {
    const SafetensorsFile f((dir / "model.safetensors").string());
    CHECK(f.metadata().at("format") == "pt");
    CHECK(f.info("model.embed_tokens.weight").shape == std::vector<int64_t>{96, 64});  // unpadded rows
    CHECK(f.info("model.layers.1.self_attn.k_proj.weight").shape == std::vector<int64_t>{32, 64});
  }
  const nlohmann::json cfg = hf_llama_config_json(fx.cfg);
  CHECK(cfg["num_key_value_heads"] == 2);
  CHECK(cfg["intermediate_size"] == 160);
  CHECK(cfg["architectures"][0] == "LlamaForCausalLM");
  CHECK(import_hf_llama(dir.string(), fx.cfg) == params);

  // The same tensors in two shards listed by model.safetensors.index.json.
  const fs::path sharded = dir / "sharded";
  fs::create_directories(sharded);
  std::vector<NamedArray> a, b;
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  const SafetensorsFile whole((dir / "model.safetensors").string());
  int k = 0;
  for (const auto& name : whole.names()) {
    const char* shard = k++ % 2 ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    (k % 2 ? a : b).push_back(NamedArray{name, whole.info(name).shape, whole.read_f32(name)});
    index["weight_map"][name] = shard;
  }
  write_f32_safetensors((sharded / "model-00001-of-00002.safetensors").string(), a, DType::f32, {{"format", "pt"}});
  write_f32_safetensors((sharded / "model-00002-of-00002.safetensors").string(), b, DType::f32, {{"format", "pt"}});
  write_hf_config((sharded / "model.safetensors.index.json").string(), index);
  write_hf_config((sharded / "config.json").string(), cfg);
  CHECK(import_hf_llama(sharded.string(), fx.cfg) == params);

  LlamaConfig other = fx.cfg;
  other.n_kv_head = 4;
  CHECK_THROWS_WITH(import_hf_llama(sharded.string(), other),
                    Catch::Contains("num_key_value_heads is 2 but model.n_kv_head is 4"));
  other = fx.cfg;
  other.rope_theta = 500000;
  CHECK(hf_llama_config_mismatch(cfg, other).find("rope_theta") != std::string::npos);
  CHECK(hf_llama_config_mismatch(cfg, fx.cfg).empty());
  fs::remove(sharded / "model-00002-of-00002.safetensors");
  CHECK_THROWS_WITH(import_hf_llama(sharded.string(), fx.cfg), Catch::Contains("model-00002-of-00002.safetensors is missing"));
  fs::remove_all(dir);
}
