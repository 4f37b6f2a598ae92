// HF GPT-2 export/import: layout (transposes, vocab cut), bit-exact round trip, mismatches refused.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <tuple>

#include "models/gpt_hf.h"
#include "checkpoint/safetensors.h"
#include "tests/scratch_dir.h"

using namespace mfsdp;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

struct Scratch : mfsdp::testing::ScratchDir {
  Scratch() : ScratchDir("mfsdp_hf_test") {}
};

// Random parameters in our layout; padded vocabulary rows are zero (as the model keeps them).
NamedTensors random_params(const GPTConfig& cfg, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  NamedTensors out;
  for (const ParamSpec& p : gpt_inventory(cfg).params) {
    std::vector<float> v(static_cast<size_t>(p.numel()));
    for (float& x : v) x = nd(rng);
    if (p.name == "wte.weight" || p.name == "lm_head.weight")
      std::fill(v.begin() + static_cast<int64_t>(cfg.vocab_size) * cfg.n_embd, v.end(), 0.0f);
    out[p.name] = std::move(v);
  }
  return out;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("export writes the HF GPT-2 layout", "[hf_gpt2]") {
  Scratch s;
  GPTConfig cfg;  // 4 layers, 4 heads, width 128, T 64, vocab 65 -> Vp 128
  cfg.n_layer = 2;
  const NamedTensors params = random_params(cfg, 1);
  const std::string p = s.file("m.safetensors");
  export_hf_gpt2(p, cfg, params);
  SafetensorsFile f(p);
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.metadata().at("mfsdp_layout") == "hf-gpt2");
  CHECK(f.metadata().at("n_layer") == "2");
  CHECK(f.metadata().at("vocab_size") == "65");
  CHECK(f.metadata().at("tie_embeddings") == "true");
  CHECK(f.names().size() == gpt_inventory(cfg).params.size());
  CHECK(!f.contains("lm_head.weight"));
  CHECK(f.info("wte.weight").shape == std::vector<int64_t>{65, 128});
  CHECK(f.info("wpe.weight").shape == std::vector<int64_t>{64, 128});
  CHECK(f.info("h.0.attn.c_attn.weight").shape == std::vector<int64_t>{128, 384});
  CHECK(f.info("h.1.mlp.c_fc.weight").shape == std::vector<int64_t>{128, 512});
  CHECK(f.info("h.1.mlp.c_proj.weight").shape == std::vector<int64_t>{512, 128});
  CHECK(f.info("h.0.attn.c_attn.bias").shape == std::vector<int64_t>{384});
  // Conv1D layout: file[i][o] == ours[o][i].
  const auto ours = params.at("h.1.mlp.c_fc.weight");  // [512, 128]
  const auto file = f.read_f32("h.1.mlp.c_fc.weight");  // [128, 512]
  CHECK(file[3 * 512 + 7] == ours[7 * 128 + 3]);
  CHECK(file[127 * 512 + 511] == ours[511 * 128 + 127]);
  const auto wte = f.read_f32("wte.weight");
  CHECK(std::equal(wte.begin(), wte.end(), params.at("wte.weight").begin()));
  CHECK(read_hf_gpt2_config(p).n_layer == 2);
  CHECK(read_hf_gpt2_config(p).tie_embeddings);
}

TEST_CASE("export -> import is bit-exact (tied and untied, f32); bf16 rounds", "[hf_gpt2]") {
  Scratch s;
  for (bool tie : {true, false}) {
    GPTConfig cfg;
    cfg.n_layer = 2;
    cfg.n_head = 2;
    cfg.n_embd = 32;
    cfg.seq_len = 16;
    cfg.vocab_size = 70;  // Vp = 128
    cfg.tie_embeddings = tie;
    const NamedTensors params = random_params(cfg, tie ? 2 : 3);
    const std::string p = s.file(tie ? "tied.safetensors" : "untied.safetensors");
    export_hf_gpt2(p, cfg, params);
    const NamedTensors back = import_hf_gpt2(p, cfg);
    REQUIRE(back.size() == params.size());
    for (const auto& [name, v] : params) {
      INFO(name);
      CHECK(bit_equal(back.at(name), v));
    }
    const std::string pb = s.file("bf16.safetensors");
    export_hf_gpt2(pb, cfg, params, DType::bf16);
    SafetensorsFile fb(pb);
    CHECK(fb.info("h.0.attn.c_proj.weight").dtype == "BF16");
    const NamedTensors back16 = import_hf_gpt2(pb, cfg);
    for (const auto& [name, v] : params)
      for (size_t i = 0; i < v.size(); ++i) {
        if (hf_gpt2_is_conv1d(name)) break;  // layout covered above; compare the plain ones elementwise
        REQUIRE(back16.at(name)[i] == bf16_to_float(float_to_bf16(v[i])));
      }
  }
}

TEST_CASE("import refuses names or shapes that do not match the config", "[hf_gpt2]") {
  Scratch s;
  GPTConfig cfg;
  cfg.n_layer = 2;
  const std::string p = s.file("m.safetensors");
  export_hf_gpt2(p, cfg, random_params(cfg, 4));

  GPTConfig other = cfg;
  other.n_embd = 64;
  other.n_head = 4;
  CHECK_THROWS_WITH(import_hf_gpt2(p, other), Contains(p) && Contains("wte.weight: expected shape [65, 64], file has [65, 128]"));
  other = cfg;
  other.n_layer = 3;
  CHECK_THROWS_WITH(import_hf_gpt2(p, other), Contains("h.2.ln_1.weight: missing from the file"));
  other = cfg;
  other.n_layer = 1;
  CHECK_THROWS_WITH(import_hf_gpt2(p, other), Contains("h.1.ln_1.weight: not a parameter of this config"));
  other = cfg;
  other.tie_embeddings = false;
  CHECK_THROWS_WITH(import_hf_gpt2(p, other), Contains("lm_head.weight: missing from the file"));
  other = cfg;
  other.vocab_size = 66;
  CHECK_THROWS_WITH(import_hf_gpt2(p, other), Contains("wte.weight: expected shape [66, 128], file has [65, 128]"));

  // The example from the issue: an MLP of the wrong width, found at its tensor.
  GPTConfig c128;
  c128.n_layer = 2;
  NamedTensors params = random_params(c128, 5);
  const std::string q = s.file("q.safetensors");
  export_hf_gpt2(q, c128, params);
  SafetensorsFile good(q);
  std::vector<TensorView> views;
  std::vector<std::vector<float>> store;
  for (const std::string& n : good.names()) {
    store.push_back(good.read_f32(n));
    std::vector<int64_t> shape = good.info(n).shape;
    if (n == "h.1.mlp.c_fc.weight") {
      shape = {128, 256};
      store.back().resize(128 * 256);
    }
    views.push_back(TensorView{n, "F32", shape, store.back().data()});
  }
  write_safetensors(q, views, good.metadata());
  CHECK_THROWS_WITH(import_hf_gpt2(q, c128), Contains("h.1.mlp.c_fc.weight: expected shape [128, 512], file has [128, 256]"));

  // Export refuses incomplete or wrongly sized parameter maps.
  params.erase("ln_f.bias");
  CHECK_THROWS_WITH(export_hf_gpt2(s.file("x"), c128, params), Contains("missing parameter 'ln_f.bias'"));
  params = random_params(c128, 6);
  params["wpe.weight"].pop_back();
  CHECK_THROWS_WITH(export_hf_gpt2(s.file("x"), c128, params), Contains("wpe.weight: has 8191 elements"));
  params = random_params(c128, 6);
  params["transformer.wte.weight"] = {};
  CHECK_THROWS_WITH(export_hf_gpt2(s.file("x"), c128, params), Contains("not in the GPT-2 inventory"));
}

TEST_CASE("a config.json that cannot be read says why: not JSON, not UTF-8, not an object", "[hf_gpt2]") {
  Scratch s;
  GPTConfig cfg;
  cfg.n_layer = 1;
  const std::string dir = s.file("hf");
  export_hf_gpt2(dir, cfg, random_params(cfg, 7));
  const std::string config = (fs::path(dir) / "config.json").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"n_layer\": 1,", config + ": not valid JSON: parse error at line 1, column 15"},
      {"{\"name\": \"\xff\"}", config + ": not valid UTF-8 (byte 10)"},
      {"[1, 2]", config + ": a JSON array, not an object of the model's fields"},
      {"\"gpt2\"", config + ": a JSON string, not an object of the model's fields"},
  };
  for (const auto& [text, message] : cases) {
    std::ofstream(config, std::ios::trunc) << text;
    INFO(text);
    CHECK_THROWS_WITH(import_hf_gpt2(dir, cfg), Contains(message));
  }
}

TEST_CASE("import refuses config.json fields that change GPT-2's maths, naming file and field", "[hf_gpt2]") {
  Scratch s;
  GPTConfig cfg;
  cfg.n_layer = 1;
  const NamedTensors params = random_params(cfg, 7);
  const std::string dir = s.file("hf");
  export_hf_gpt2(dir, cfg, params);
  const nlohmann::json exported = nlohmann::json::parse(std::ifstream(fs::path(dir) / "config.json"));
  CHECK(exported.at("layer_norm_epsilon").get<double>() == kGptLayerNormEps);
  const auto import_with = [&](const std::string& key, const nlohmann::json& value) {
    nlohmann::json c = exported;
    c[key] = value;
    write_hf_config((fs::path(dir) / "config.json").string(), c);
    return import_hf_gpt2(dir, cfg);
  };
  // each field that changes the model, set to a value models/gpt.cpp does not implement
  const std::vector<std::tuple<std::string, nlohmann::json, std::string>> refused = {
      {"layer_norm_epsilon", 1e-3, "config.json: layer_norm_epsilon is 0.001 (only GPT-2's 1e-05 is implemented)"},
      {"scale_attn_weights", false, "config.json: scale_attn_weights is false"},
      {"scale_attn_by_inverse_layer_idx", true, "config.json: scale_attn_by_inverse_layer_idx is true"},
      {"add_cross_attention", true, "config.json: add_cross_attention is true"},
      {"activation_function", "gelu", "config.json: activation_function \"gelu\" (only the tanh GELU"},
      {"activation_function", "relu", "config.json: activation_function \"relu\""},
      {"n_inner", 3 * 128, "config.json: n_inner 384 is not 4 * n_embd"},
      {"scale_attn_weights", "yes", "config.json: scale_attn_weights: expected true or false, got \"yes\""},
      {"layer_norm_epsilon", "1e-5", "config.json: layer_norm_epsilon: expected a number, got \"1e-5\""},
  };
  for (const auto& [key, value, message] : refused) {
    INFO(key << " = " << value.dump());
    CHECK_THROWS_WITH(import_with(key, value), Contains("[import_hf_gpt2] " + dir + ": ") && Contains(message));
  }
  // what computes the same function is accepted, and imports the same tensors
  const std::vector<std::pair<std::string, nlohmann::json>> accepted = {
      {"layer_norm_epsilon", 1e-5},        {"activation_function", "gelu_pytorch_tanh"},
      {"activation_function", "gelu_fast"}, {"reorder_and_upcast_attn", true},
      {"scale_attn_weights", true},         {"attn_pdrop", 0.1},
      {"scale_attn_by_inverse_layer_idx", nullptr}};
  for (const auto& [key, value] : accepted) {
    INFO(key << " = " << value.dump());
    CHECK(import_with(key, value) == params);
  }
}
