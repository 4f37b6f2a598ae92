// Training config: shipped configs, the malformed-config corpus, overrides, paths, to_json.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <functional>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "apps/train/train_config.h"
#include "tests/scratch_dir.h"

using namespace mfsdp;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;
using Catch::Matchers::StartsWith;
namespace fs = std::filesystem;

namespace {
const std::string kSrc = MFSDP_SOURCE_DIR;
}

TEST_CASE("the shipped configs load with the documented values", "[config]") {
  const TrainConfig c = load_train_config(kSrc + "/configs/shakespeare_char.json");
  CHECK(c.model.n_layer == 4);
  CHECK(c.model.n_head == 4);
  CHECK(c.model.n_embd == 128);
  CHECK(c.model.seq_len == 64);
  CHECK(c.model.vocab_size == 65);
  CHECK(c.sharding.placement == Placement::matrixfsdp);
  CHECK(c.sharding.backend == CommBackend::mpi);
  CHECK(c.optim.muon.lr == 0.02);
  CHECK(c.optim.adamw.lr == 3e-3);
  CHECK(c.optim.schedule.total_steps == c.training.steps);
  CHECK(c.training.steps == 800);
  CHECK(c.training.micro_batch_size == 12);
  CHECK(!c.training.target_val_loss.has_value());
  CHECK(c.data.tokenizer == "char");
  CHECK(c.data.train.raw == "../data/tiny_shakespeare_char_train.bin");
  CHECK(c.data.train.resolved == fs::weakly_canonical(kSrc + "/data/tiny_shakespeare_char_train.bin").string());
  CHECK(fs::exists(c.data.train.resolved));
  CHECK(fs::exists(c.data.val.resolved));
  CHECK(fs::exists(c.data.tokenizer_path.resolved));
  const GPTConfig g = c.model.gpt();
  CHECK(g.padded_vocab_size() == 128);

  // The bf16 variant is the default job with bf16 gathers, matmuls and Newton-Schulz products and
  // its own run directory, nothing else.
  const TrainConfig b = load_train_config(kSrc + "/configs/shakespeare_char_bf16.json");
  CHECK(b.optim.param_dtype == DType::bf16);
  CHECK(b.optim.muon.ns_dtype == NsDType::bf16);
  nlohmann::json bj = b.to_json(false);
  const nlohmann::json fj = c.to_json(false);
  CHECK(bj["logging"]["run_dir"] == "../runs/shakespeare_char_bf16");
  for (const char* key : {"/precision/param_dtype", "/optimizer/muon/ns_dtype", "/logging/run_dir", "/output/export"})
    bj[nlohmann::json::json_pointer(key)] = fj[nlohmann::json::json_pointer(key)];
  CHECK(bj == fj);

  const TrainConfig t = load_train_config(kSrc + "/configs/tiny_test.json");
  CHECK(t.model.n_layer == 2);
  CHECK(t.model.n_embd == 32);
  CHECK(t.training.steps == 20);
  CHECK(t.output.export_path.resolved.empty());
  CHECK(fs::exists(t.data.train.resolved));
}

TEST_CASE("every malformed config in the corpus fails with its expected message", "[config]") {
  const std::string dir = kSrc + "/tests/config/bad_configs";
  std::ifstream f(dir + "/expected.json");
  const auto expected = nlohmann::json::parse(f);
  REQUIRE(expected.size() >= 12);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".json" && e.path().filename() != "expected.json") ++files;
  CHECK(files == expected.size());  // every corpus file has an expectation
  for (auto it = expected.begin(); it != expected.end(); ++it) {
    const std::string path = dir + "/" + it.key();
    INFO(it.key());
    REQUIRE(fs::exists(path));
    try {
      load_train_config(path);
      FAIL("no ConfigError for " << it.key());
    } catch (const ConfigError& err) {
      const std::string msg = err.what();
      INFO(msg);
      CHECK(msg.find(it.value().get<std::string>()) != std::string::npos);
      CHECK(msg.rfind(path + ": ", 0) == 0);  // names the file first
    }
  }
}

TEST_CASE("--set overrides apply, are type-checked and named in errors", "[config]") {
  const std::string cfg = kSrc + "/configs/tiny_test.json";
  TrainConfig c = load_train_config(cfg, {"optimizer.muon.lr=0.05", "training.steps=7", "data.shuffle=true",
                                          "sharding.placement=zero1", "training.target_val_loss=1.5",
                                          "model={\"n_layer\": 3}", "output.export=out/m.safetensors"});
  CHECK(c.optim.muon.lr == 0.05);
  CHECK(c.training.steps == 7);
  CHECK(c.data.shuffle);
  CHECK(c.sharding.placement == Placement::zero1);  // plain string fallback
  REQUIRE(c.training.target_val_loss.has_value());
  CHECK(*c.training.target_val_loss == 1.5);
  CHECK(c.model.n_layer == 3);
  CHECK(c.model.n_embd == 32);  // sibling keys from the file survive an object override
  // Paths from --set resolve against the working directory, not the config's directory.
  CHECK(c.output.export_path.resolved == (fs::current_path() / "out/m.safetensors").lexically_normal().string());
  c = load_train_config(cfg, {"training.target_val_loss=null", "training.steps=1e3"});
  CHECK(!c.training.target_val_loss.has_value());
  CHECK(c.training.steps == 1000);

  CHECK_THROWS_WITH(load_train_config(cfg, {"optimizer.muon.lr=fast"}),
                    Contains("--set optimizer.muon.lr=fast: optimizer.muon.lr: expected a number, got \"fast\""));
  CHECK_THROWS_WITH(load_train_config(cfg, {"optimizer.muon.lrr=1"}),
                    Contains("optimizer.muon.lrr: unknown key (did you mean optimizer.muon.lr?)"));
  CHECK_THROWS_WITH(load_train_config(cfg, {"training.steps=-1"}),
                    Contains("--set training.steps=-1: training.steps: must be >= 1, got -1"));
  CHECK_THROWS_WITH(load_train_config(cfg, {"training.steps"}), Contains("expected key.path=value"));
  CHECK_THROWS_WITH(load_train_config(cfg, {"model.n_head=3"}), Contains("model.n_embd: must be divisible by model.n_head"));
  // a key set twice, inside one value or by two --set options, is refused as in a file
  CHECK_THROWS_WITH(load_train_config(cfg, {"training.steps=3", "training.steps=4"}),
                    Contains("--set training.steps=4: training.steps is already set by --set training.steps=3"));
  CHECK_THROWS_WITH(load_train_config(cfg, {"model={\"n_layer\": 2, \"n_layer\": 3}"}),
                    Contains("key \"n_layer\" appears twice in the same object"));
  CHECK_THROWS_WITH(load_train_config(cfg, {"logging.run_dir=\"a\\u0000b\""}), Contains("value: holds a NUL character"));
  CHECK_THROWS_WITH(load_train_config(cfg, {"model=" + std::string(5000, '[')}), Contains("nested deeper than 64 levels"));
  // an error shows at most 60 characters of a value, however large or deep it is
  std::string deep = "[1]";
  for (int i = 0; i < 60; ++i) deep = "[" + deep + ",[2]]";
  try {
    load_train_config(cfg, {"training.steps=" + deep});
    FAIL("a list accepted as training.steps");
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    REQUIRE(msg.find("expected an integer, got [[[[") != std::string::npos);
    CHECK(msg.size() - msg.find("got [") - 4 == 60);  // 57 characters and "..."
  }
}

TEST_CASE("a config object with many keys is checked for repeats in linear time", "[config]") {
  // 200,000 distinct keys under one object: a quadratic repeat check would take minutes
  std::string many = "{";
  for (int i = 0; i < 200000; ++i) many += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":0";
  many += ",\"k7\":1}";
  CHECK_THROWS_WITH(parse_config_json(many, "many.json", false), Contains("many.json: key \"k7\" appears twice"));
}

TEST_CASE("range checks name the key", "[config]") {
  auto parse = [](const std::string& text) {
    return parse_train_config(nlohmann::json::parse(text), "mem.json", ".");
  };
  const std::string train = R"("data": {"train": "x.bin"})";
  CHECK_NOTHROW(parse("{" + train + "}"));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "training": {"grad_accum": 0}})"),
                    Contains("mem.json: training.grad_accum: must be >= 1, got 0"));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "optimizer": {"adamw": {"eps": 0}}})"),
                    Contains("optimizer.adamw.eps: must be >= 1e-30, got 0"));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "optimizer": {"muon": {"momentum": 1.0}}})"),
                    Contains("optimizer.muon.momentum: must be < 1, got 1"));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "schedule": {"floor": 2}})"), Contains("schedule.floor: must be <= 1, got 2"));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "training": {"grad_clip": -1}})"), Contains("training.grad_clip: must be >= 0"));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "training": {"target_val_loss": "low"}})"),
                    Contains("training.target_val_loss: expected a number or null, got \"low\""));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "model": {"n_layer": 3000000000}})"),
                    Contains("model.n_layer: must be <= 4096"));
  // sizes are bounded so that parameter counts and global batches stay inside int64
  CHECK_THROWS_WITH(parse("{" + train + R"(, "model": {"n_embd": 262144, "n_head": 1}})"),
                    Contains("model.n_embd: must be <= 131072"));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "training": {"micro_batch_size": 2000000}})"),
                    Contains("training.micro_batch_size: must be <= 1048576"));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "model": {"vocab_size": 1000}, "data": {"train": "x", "tokenizer": "gpt2", "tokenizer_path": "t"}})"),
                    Contains("smaller than the gpt2 tokenizer's 50257"));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "optimizer": {"muon": {"scale_rule": "match_rms"}}})"),
                    Contains("optimizer.muon.scale_rule: unknown value \"match_rms\""));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "sharding": {"backend": "gloo"}})"),
                    Contains("sharding.backend: unknown value \"gloo\", expected one of mpi, cuda_staged, nccl"));
  CHECK(parse("{" + train + R"(, "sharding": {"backend": "nccl"}})").sharding.backend == CommBackend::nccl);
  CHECK_THROWS_WITH(parse("{" + train + R"(, "model": {"n_layer": [2]}})"),
                    Contains("model.n_layer: expected an integer, got [2]"));
}

TEST_CASE("to_json is the effective config and loads back to the same config", "[config]") {
  const TrainConfig c = load_train_config(kSrc + "/configs/shakespeare_char.json", {"training.steps=123"});
  const nlohmann::json j = c.to_json();
  CHECK(j["training"]["steps"] == 123);
  CHECK(j["data"]["train"] == c.data.train.resolved);
  CHECK(j["training"]["target_val_loss"].is_null());
  CHECK(c.to_json(false)["data"]["train"] == "../data/tiny_shakespeare_char_train.bin");
  // Round trip: the dumped (resolved, absolute) config parses to an identical config.
  const TrainConfig back = parse_train_config(j, "dump.json", "/nonexistent");
  CHECK(back.to_json() == j);
  // Defaults alone: only data.train is required.
  CHECK_THROWS_WITH(parse_train_config(nlohmann::json::object(), "empty.json", "."),
                    Contains("empty.json: data.train: missing shard glob"));
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("", "abc") == 3);
}

TEST_CASE("sharding.replicate (HSDP) is parsed, echoed and refused with ddp", "[config][hsdp]") {
  auto parse = [](const std::string& text) {
    return parse_train_config(nlohmann::json::parse(text), "hsdp.json", ".");
  };
  const std::string train = R"("data": {"train": "x.bin"})";
  CHECK(parse("{" + train + "}").sharding.replicate == 1);
  const TrainConfig c = parse("{" + train + R"(, "sharding": {"replicate": 2, "placement": "fsdp2"}})");
  CHECK(c.sharding.replicate == 2);
  CHECK(c.to_json()["sharding"]["replicate"] == 2);
  CHECK_THROWS_WITH(parse("{" + train + R"(, "sharding": {"replicate": 0}})"),
                    Contains("sharding.replicate: must be >= 1, got 0"));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "sharding": {"replicate": 2, "placement": "ddp"}})"),
                    Contains("sharding.replicate: ddp is already fully replicated"));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "sharding": {"replicate": 2}, "training": {"grad_clip": 0},
                                               "optimizer": {"muon": {"overlap_backward": true}}})"),
                    Contains("sharding.replicate: optimizer.muon.overlap_backward is not supported"));
}

TEST_CASE("model.arch llama: defaults, derived widths, errors naming the key", "[config]") {
  auto parse = [](const std::string& model) {
    return parse_train_config(nlohmann::json::parse(R"({"data": {"train": "x.bin"}, "model": )" + model + "}"),
                              "mem.json", ".");
  };
  const TrainConfig d = parse(R"({"arch": "llama", "n_head": 8, "n_embd": 256})");
  CHECK(d.model.arch == "llama");
  CHECK(!d.model.tie_embeddings);         // untied unless set
  CHECK(d.model.n_kv_head == 8);          // 0 = n_head
  CHECK(d.model.intermediate_size == 768);  // 8/3 * 256 = 682 rounded up to a multiple of 256
  CHECK(d.model.norm_eps == 1e-5);
  CHECK(d.model.rope_theta == 10000.0);
  const LlamaConfig l = d.model.llama();
  CHECK(l.head_dim() == 32);
  CHECK(parse(R"({"arch": "llama", "n_embd": 4096, "n_head": 32})").model.intermediate_size == 11008);
  CHECK(parse(R"({"arch": "llama", "tie_embeddings": true})").model.tie_embeddings);
  CHECK(parse(R"({"arch": "llama", "n_head": 4, "n_kv_head": 2, "intermediate_size": 100, "rope_theta": 5e5})")
            .model.llama().n_kv_head == 2);
  CHECK(parse("{}").model.tie_embeddings);  // gpt2 stays tied by default
  CHECK_THROWS_WITH(parse(R"({"arch": "mamba"})"), Contains("model.arch: unknown value \"mamba\""));
  CHECK_THROWS_WITH(parse(R"({"arch": "llama", "n_head": 4, "n_kv_head": 3})"), Contains("model.n_kv_head: must divide"));
  CHECK_THROWS_WITH(parse(R"({"arch": "llama", "n_head": 4, "n_embd": 12})"), Contains("must be even for rotary"));
  CHECK_THROWS_WITH(parse(R"({"arch": "llama", "norm_eps": 0})"), Contains("model.norm_eps: must be >= 1e-30"));
  CHECK_THROWS_WITH(parse(R"({"n_kv_head": 2})"), Contains("model.n_kv_head: only applies to model.arch \"llama\""));
  CHECK_THROWS_WITH(parse(R"({"rope_theta": 500000})"), Contains("model.rope_theta: only applies"));
  // the effective config of a llama run loads back unchanged
  const nlohmann::json j = d.to_json(false);
  CHECK(parse_train_config(j, "dump.json", ".").to_json(false) == j);
  const TrainConfig shipped = load_train_config(kSrc + "/configs/llama_shakespeare_char.json");
  CHECK(shipped.model.llama().num_params() > 0);
  CHECK(shipped.output.export_path.raw == "../runs/llama_shakespeare_char/hf");
}

TEST_CASE("runtime.device, precision and training.recompute: defaults, derivations, errors naming both keys",
          "[config][gpu]") {
  auto parse = [](const std::string& text, const std::vector<std::string>& overrides = {}) {
    return parse_train_config(nlohmann::json::parse(text), "gpu.json", ".", overrides);
  };
  const std::string train = R"("data": {"train": "x.bin"})";
  const TrainConfig d = parse("{" + train + "}");
  CHECK(d.runtime.device == Device::CPU);
  CHECK(d.sharding.backend == CommBackend::mpi);
  CHECK(d.optim.param_dtype == DType::f32);
  CHECK(d.optim.reduce_dtype == DType::f32);
  CHECK_FALSE(d.optim.recompute_units);
  // the device picks the backend, and the backend alone implies its device
  const TrainConfig cuda = parse("{" + train + "}", {"runtime.device=cuda"});
  CHECK(cuda.sharding.backend == CommBackend::nccl);
  CHECK(cuda.to_json()["sharding"]["backend"] == "nccl");
  CHECK(parse("{" + train + R"(, "sharding": {"backend": "cuda_staged"}})").runtime.device == Device::CUDA);
  CHECK(parse("{" + train + R"(, "runtime": {"device": "cuda"}, "sharding": {"backend": "cuda_staged"}})")
            .sharding.backend == CommBackend::cuda_staged);
  CHECK_THROWS_WITH(parse("{" + train + R"(, "sharding": {"backend": "nccl"}})", {"runtime.device=cpu"}),
                    Contains("gpu.json: sharding.backend: nccl moves CUDA buffers, but runtime.device is cpu "
                             "(--set runtime.device=cpu)"));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "runtime": {"device": "cuda"}, "sharding": {"backend": "mpi"}})"),
                    Contains("sharding.backend: mpi moves host buffers, but runtime.device is cuda"));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "runtime": {"device": "gpu"}})"),
                    Contains("runtime.device: unknown value \"gpu\""));
  // precision and recompute
  const TrainConfig bf = parse("{" + train + R"(, "precision": {"param_dtype": "bf16", "reduce_dtype": "bf16"},
                                                 "training": {"recompute": "block"}})");
  CHECK(bf.optim.param_dtype == DType::bf16);
  CHECK(bf.optim.reduce_dtype == DType::bf16);
  CHECK(bf.optim.recompute_units);
  CHECK(bf.to_json()["precision"]["param_dtype"] == "bf16");
  CHECK(bf.to_json()["training"]["recompute"] == "block");
  CHECK(parse("{" + train + R"(, "sharding": {"placement": "zero1"}})", {"precision.reduce_dtype=bf16"})
            .optim.reduce_dtype == DType::bf16);
  CHECK_THROWS_WITH(parse("{" + train + R"(, "sharding": {"placement": "zero1"}})", {"precision.param_dtype=bf16"}),
                    Contains("--set precision.param_dtype=bf16: precision.param_dtype: bf16 needs a sharded placement"));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "precision": {"param_dtype": "fp16"}})"),
                    Contains("precision.param_dtype: unknown value \"fp16\""));
  CHECK_THROWS_WITH(parse("{" + train + R"(, "training": {"recompute": "full"}})"),
                    Contains("training.recompute: unknown value \"full\""));
  // attention kernel: auto (the engine resolves it per device), cudnn, fused or unfused
  CHECK_FALSE(d.optim.attention.has_value());
  CHECK(d.to_json()["runtime"]["attention"] == "auto");
  CHECK(parse("{" + train + "}", {"runtime.attention=fused"}).optim.attention == AttentionKernel::fused);
  const TrainConfig unfused = parse("{" + train + R"(, "runtime": {"attention": "unfused"}})");
  CHECK(unfused.optim.attention == AttentionKernel::unfused);
  CHECK(unfused.to_json()["runtime"]["attention"] == "unfused");
  CHECK_THROWS_WITH(parse("{" + train + "}", {"runtime.attention=flash"}),
                    Contains("runtime.attention: unknown value \"flash\""));
  // cudnn is refused on the CPU, at its key, before anything runs
  CHECK_THROWS_WITH(parse("{" + train + "}", {"runtime.attention=cudnn"}),
                    Contains("runtime.attention: cudnn needs CUDA; runtime.device is cpu"));
  // reduce overlap: auto (the engine resolves it per device), on or off
  CHECK(d.optim.overlap_reduce == Toggle::automatic);
  CHECK(d.to_json()["sharding"]["overlap_reduce"] == "auto");
  CHECK(parse("{" + train + "}", {"sharding.overlap_reduce=on"}).optim.overlap_reduce == Toggle::on);
  const TrainConfig off = parse("{" + train + R"(, "sharding": {"overlap_reduce": "off"}})");
  CHECK(off.optim.overlap_reduce == Toggle::off);
  CHECK(off.to_json()["sharding"]["overlap_reduce"] == "off");
  CHECK_THROWS_WITH(parse("{" + train + "}", {"sharding.overlap_reduce=yes"}),
                    Contains("sharding.overlap_reduce: unknown value \"yes\""));
  // NCCL: non-blocking unless a blocking communicator is asked for (diagnostics)
  CHECK(!d.sharding.nccl_blocking);
  const TrainConfig blocking = parse("{" + train + "}", {"sharding.nccl_blocking=true"});
  CHECK(blocking.sharding.nccl_blocking);
  CHECK(blocking.to_json()["sharding"]["nccl_blocking"] == true);
  CHECK_THROWS_WITH(parse("{" + train + "}", {"sharding.nccl_blocking=3"}), Contains("sharding.nccl_blocking"));
}

TEST_CASE("precision.matmul_dtype, optimizer.muon.ns_dtype auto and logging.peak_tflops null", "[config][precision]") {
  auto parse = [](const std::vector<std::string>& overrides) {
    return parse_train_config(nlohmann::json::parse(R"({"data": {"train": "x.bin"}})"), "p.json", ".", overrides);
  };
  // defaults: matmuls follow param_dtype, NS f32, MFU against the measured peak (null)
  const TrainConfig d = parse({});
  CHECK(d.precision.matmul == DTypeChoice::param);
  CHECK(d.precision.ns == DTypeChoice::f32);
  CHECK(!d.optim.matmul_dtype.has_value());
  CHECK(d.optim.matmuls() == DType::f32);
  CHECK(parse({"precision.param_dtype=bf16"}).optim.matmuls() == DType::bf16);
  CHECK(!d.logging.peak_tflops.has_value());
  CHECK(d.to_json()["precision"]["matmul_dtype"] == "param");
  CHECK(d.to_json()["optimizer"]["muon"]["ns_dtype"] == "f32");
  CHECK(d.to_json()["logging"]["peak_tflops"].is_null());
  // explicit values; bf16 parameters with f32 products
  const TrainConfig split = parse({"precision.param_dtype=bf16", "precision.matmul_dtype=f32"});
  CHECK(split.optim.param_dtype == DType::bf16);
  CHECK(split.optim.matmuls() == DType::f32);
  CHECK(parse({"precision.matmul_dtype=bf16"}).optim.matmuls() == DType::bf16);
  // auto: the rules see f32 until start-up resolves it; the file keeps "auto"
  const TrainConfig a = parse({"precision.matmul_dtype=auto", "optimizer.muon.ns_dtype=auto"});
  CHECK(a.precision.matmul == DTypeChoice::auto_);
  CHECK(a.precision.ns == DTypeChoice::auto_);
  CHECK(a.optim.muon.ns_dtype == NsDType::f32);
  CHECK(a.to_json()["precision"]["matmul_dtype"] == "auto");
  CHECK(a.to_json()["optimizer"]["muon"]["ns_dtype"] == "auto");
  CHECK(parse_train_config(a.to_json(), "p.json", ".").precision.ns == DTypeChoice::auto_);
  // auto with gram_newton_schulz is accepted (it resolves to f32); bf16 is not
  CHECK_NOTHROW(parse({"optimizer.muon.ns_dtype=auto", "optimizer.muon.orthogonalizer=gram_newton_schulz"}));
  CHECK_THROWS_WITH(parse({"optimizer.muon.ns_dtype=bf16", "optimizer.muon.orthogonalizer=gram_newton_schulz"}),
                    Contains("optimizer.muon.ns_dtype"));
  // peak_tflops: a positive number or null
  CHECK(*parse({"logging.peak_tflops=989"}).logging.peak_tflops == 989.0);
  CHECK(!parse({"logging.peak_tflops=null"}).logging.peak_tflops.has_value());
  CHECK_THROWS_WITH(parse({"logging.peak_tflops=0"}), Contains("logging.peak_tflops: must be > 0"));
  CHECK_THROWS_WITH(parse({"logging.peak_tflops=\"fast\""}), Contains("logging.peak_tflops: expected a number or null"));
  // bad values name the file and the key
  CHECK_THROWS_WITH(parse({"precision.matmul_dtype=fp16"}), Contains("precision.matmul_dtype=fp16: precision.matmul_dtype: unknown value \"fp16\""));
  CHECK_THROWS_WITH(parse({"optimizer.muon.ns_dtype=param"}), Contains("optimizer.muon.ns_dtype: unknown value \"param\""));
}

TEST_CASE("sharding.prefetch_depth and prefetch_limit_bytes", "[config][gpu]") {
  auto parse = [](const std::vector<std::string>& overrides) {
    return parse_train_config(nlohmann::json::parse(R"({"data": {"train": "x.bin"}})"), "p.json", ".", overrides);
  };
  CHECK_FALSE(parse({}).optim.prefetch_depth.has_value());
  CHECK(parse({}).to_json()["sharding"]["prefetch_depth"] == -1);
  CHECK_FALSE(parse({"sharding.prefetch_depth=-1"}).optim.prefetch_depth.has_value());
  CHECK(parse({}).optim.prefetch_limit_bytes == 0);
  const TrainConfig c = parse({"sharding.prefetch_depth=2", "sharding.prefetch_limit_bytes=1048576"});
  CHECK(c.optim.prefetch_depth == 2);
  CHECK(c.optim.prefetch_limit_bytes == 1048576);
  CHECK(c.to_json()["sharding"]["prefetch_depth"] == 2);
  CHECK_THROWS_WITH(parse({"sharding.prefetch_depth=-2"}), Contains("sharding.prefetch_depth: must be >= -1, got -2"));
  CHECK_THROWS_WITH(parse({"sharding.prefetch_limit_bytes=-1"}),
                    Contains("sharding.prefetch_limit_bytes: must be >= 0, got -1"));
}

TEST_CASE("the engine's rules (resolve) are reported at their config keys", "[config][resolve]") {
  auto parse = [](const std::vector<std::string>& overrides) {
    return parse_train_config(nlohmann::json::parse(R"({"data": {"train": "x.bin"}})"), "r.json", ".", overrides);
  };
  // CUDA runs Newton-Schulz 5 and plain Muon only: the message names both keys by their config names
  CHECK_THROWS_WITH(parse({"runtime.device=cuda", "optimizer.muon.orthogonalizer=polar_express"}),
                    Contains("--set optimizer.muon.orthogonalizer=polar_express: optimizer.muon.orthogonalizer: "
                             "polar_express runs on the CPU only; runtime.device is cuda"));
  CHECK_THROWS_WITH(parse({"sharding.backend=nccl", "optimizer.muon.variant=normuon"}),
                    Contains("optimizer.muon.variant: normuon runs on the CPU only; runtime.device is cuda"));
  CHECK(parse({"optimizer.muon.orthogonalizer=polar_express"}).optim.muon.orthogonalizer == Orthogonalizer::polar_express);
  // the model: GPT reports its heads, Llama does not
  CHECK(parse({"optimizer.muon.qk_clip=50", "optimizer.muon.split_heads=true"}).optim.qk_clip == 50);
  CHECK_THROWS_WITH(parse({"model.arch=llama", "optimizer.muon.qk_clip=50"}),
                    Contains("optimizer.muon.qk_clip: the model reports no attention heads"));
  // a rule over two keys names the other one by its key too
  CHECK_THROWS_WITH(parse({"optimizer.muon.overlap_backward=true"}),
                    Contains("optimizer.muon.overlap_backward: needs training.grad_clip = 0 (got 1)"));
  CHECK_THROWS_WITH(parse({"sharding.replicate=2", "sharding.placement=ddp"}),
                    Contains("sharding.replicate: ddp is already fully replicated; use matrixfsdp, fsdp2 or zero1 "
                             "with sharding.replicate > 1"));
}

TEST_CASE("resolve: device defaults, forced switches, the model's head size and field identifiers", "[resolve]") {
  EngineOptions o;
  const ModelFacts gpt{32, true};
  const ResolvedOptions cpu = resolve(o, Device::CPU, Placement::matrixfsdp, 1, gpt);
  CHECK(cpu.prefetch_depth() == 0);
  CHECK(cpu.batch_orthogonalize());  // on both devices
  CHECK_FALSE(cpu.overlap_reduce());
  CHECK(cpu.attention() == AttentionKernel::unfused);
  CHECK(cpu.options.prefetch_depth == 0);
  CHECK(cpu.options.overlap_reduce == Toggle::off);
  CHECK_FALSE(cpu.traits.resident);
  const ResolvedOptions cuda = resolve(o, Device::CUDA, Placement::zero1, 1, gpt);
  CHECK(cuda.prefetch_depth() == 1);
  CHECK(cuda.batch_orthogonalize());
  CHECK(cuda.overlap_reduce());
  CHECK(cuda.attention() == AttentionKernel::fused);
  CHECK(cuda.options.batch_orthogonalize == Toggle::on);
  CHECK(cuda.traits.resident);
  o.prefetch_depth = 3;
  o.overlap_reduce = Toggle::off;
  o.batch_orthogonalize = Toggle::off;
  o.attention = AttentionKernel::fused;
  o.muon.split_heads = true;
  const ResolvedOptions forced = resolve(o, Device::CUDA, Placement::fsdp2, 2, gpt);
  CHECK(forced.prefetch_depth() == 3);
  CHECK_FALSE(forced.overlap_reduce());
  CHECK_FALSE(forced.batch_orthogonalize());
  CHECK(forced.attention() == AttentionKernel::fused);
  CHECK(forced.options.muon.head_dim == 32);
  CHECK(forced.traits.replicated);
  CHECK(resolve(o, Device::CPU, Placement::fsdp2, 1, gpt).attention() == AttentionKernel::fused);
  CHECK(planner_options(o, gpt).head_dim == 32);
  // what() speaks the engine's identifiers; message() renders them through the caller's names
  EngineOptions ob;
  ob.overlap_backward = true;
  try {
    resolve(ob, Device::CPU, Placement::matrixfsdp, 1, gpt);
    FAIL("overlap_backward with grad_clip 1 was accepted");
  } catch (const OptionError& e) {
    CHECK(e.field() == OptionField::overlap_backward);
    CHECK_THAT(std::string(e.what()), Contains("[resolve] overlap_backward: needs grad_clip = 0 (got 1)"));
    CHECK_THAT(e.message([](OptionField f) { return std::string("<") + kOptionFieldNames.name(f) + ">"; }),
               StartsWith("needs <grad_clip> = 0 (got 1)"));
  }
  // expert parallelism: matrixfsdp without replicas, the CPU, f32, no recompute; reaches the planner
  EngineOptions ep;
  ep.expert_parallel = true;
  CHECK(resolve(ep, Device::CPU, Placement::matrixfsdp, 1, gpt).options.expert_parallel);
  CHECK(planner_options(ep, gpt).expert_parallel);
  const std::pair<std::function<void()>, const char*> refused[] = {
      {[&] { resolve(ep, Device::CPU, Placement::fsdp2, 1, gpt); }, "needs placement matrixfsdp without replicas"},
      {[&] { resolve(ep, Device::CPU, Placement::matrixfsdp, 2, gpt); }, "(got matrixfsdp, 2 replica(s))"},
      {[&] { resolve(ep, Device::CUDA, Placement::matrixfsdp, 1, gpt); }, "runs on the CPU only"},
  };
  for (const auto& [call, text] : refused) {
    try {
      call();
      FAIL("expert_parallel accepted where it should be refused: " << text);
    } catch (const OptionError& e) {
      CHECK(e.field() == OptionField::expert_parallel);
      CHECK_THAT(std::string(e.what()), Contains(text));
    }
  }
  ep.recompute_units = true;
  CHECK_THROWS_WITH(resolve(ep, Device::CPU, Placement::matrixfsdp, 1, gpt), Contains("activation recompute"));
  // one name table per enum: parsing and printing agree
  CHECK(kToggleNames.find("auto") == Toggle::automatic);
  CHECK_FALSE(kToggleNames.find("yes").has_value());
  CHECK(std::string(kAttentionNames.name(AttentionKernel::unfused)) == "unfused");
  CHECK(kAttentionNames.list(" or ") == "auto, cudnn, fused or unfused");
  CHECK(kPlacementNames.list(" or ") == "matrixfsdp, fsdp2, zero1 or ddp");
  CHECK_THROWS_WITH(kPlacementNames.parse("zero3", "placement"),
                    Contains("unknown placement 'zero3' (expected matrixfsdp, fsdp2, zero1 or ddp)"));
}

TEST_CASE("resolve: the attention kernel (cudnn only on CUDA, with cuDNN, heads of 64 or 128)", "[resolve]") {
  // resolve_attention's rule, for a build with and without cuDNN
  for (bool built : {true, false}) {
    INFO("cuDNN in the build: " << built);
    for (int64_t d : {64, 128}) {
      CHECK(resolve_attention(std::nullopt, Device::CUDA, DType::bf16, d, built) ==
            (built ? AttentionKernel::cudnn : AttentionKernel::fused));
    }
    // f32 matmuls, other head sizes and the CPU never pick cudnn by themselves
    CHECK(resolve_attention(std::nullopt, Device::CUDA, DType::f32, 64, built) == AttentionKernel::fused);
    for (int64_t d : {0, 32, 96, 256})
      CHECK(resolve_attention(std::nullopt, Device::CUDA, DType::bf16, d, built) == AttentionKernel::fused);
    CHECK(resolve_attention(std::nullopt, Device::CPU, DType::bf16, 64, built) == AttentionKernel::unfused);
    CHECK(resolve_attention(AttentionKernel::fused, Device::CPU, DType::bf16, 64, built) == AttentionKernel::fused);
    CHECK(resolve_attention(AttentionKernel::unfused, Device::CUDA, DType::bf16, 64, built) == AttentionKernel::unfused);
    // asked for explicitly: CUDA, cuDNN in the build and a supported head size, else refused
    const auto refusal = [&](Device dev, int64_t d) -> std::string {
      try {
        (void)resolve_attention(AttentionKernel::cudnn, dev, DType::f32, d, built);
      } catch (const OptionError& e) {
        CHECK(e.field() == OptionField::attention);
        return e.what();
      }
      return "";
    };
    CHECK_THAT(refusal(Device::CPU, 64), Contains("[resolve] attention: cudnn needs CUDA; device is cpu"));
    CHECK_THAT(refusal(Device::CPU, 96), Contains("cudnn needs CUDA"));
    if (built) {
      CHECK(resolve_attention(AttentionKernel::cudnn, Device::CUDA, DType::f32, 128, true) == AttentionKernel::cudnn);
      CHECK_THAT(refusal(Device::CUDA, 96), Contains("cudnn takes attention heads of 64 or 128 features; the model's have 96"));
      CHECK_THAT(refusal(Device::CUDA, 0), Contains("the model's have an unknown size"));
    } else {
      CHECK_THAT(refusal(Device::CUDA, 64),
                 Contains("this build has no cuDNN attention: run scripts/fetch_cudnn_frontend.sh and reconfigure"));
    }
  }
  // resolve() applies the rule with this build's cuDNN and the model's head size, and leaves no
  // automatic choice in its options
  EngineOptions o;
  o.param_dtype = DType::bf16;
  const ModelFacts d64{64, true, 64}, d32{32, true, 32};
  const AttentionKernel cuda64 = cudnn_attention_built() ? AttentionKernel::cudnn : AttentionKernel::fused;
  CHECK(resolve(o, Device::CUDA, Placement::matrixfsdp, 1, d64).attention() == cuda64);
  CHECK(resolve(o, Device::CUDA, Placement::matrixfsdp, 1, d64).options.attention == cuda64);
  CHECK(resolve(o, Device::CUDA, Placement::matrixfsdp, 1, d32).attention() == AttentionKernel::fused);
  CHECK(resolve(o, Device::CPU, Placement::matrixfsdp, 1, d64).attention() == AttentionKernel::unfused);
  CHECK(resolve(o, Device::CPU, Placement::matrixfsdp, 1, d64).options.attention == AttentionKernel::unfused);
  o.attention = AttentionKernel::cudnn;
  CHECK_THROWS_AS(resolve(o, Device::CPU, Placement::matrixfsdp, 1, d64), OptionError);
  CHECK_THROWS_AS(resolve(o, Device::CUDA, Placement::matrixfsdp, 1, d32), OptionError);
}

TEST_CASE("a config file is read as a bounded regular file", "[config]") {
  const fs::path dir = fs::temp_directory_path() / ("mfsdp_cfg_size_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string big = (dir / "big.json").string();
  std::ofstream(big) << "{}";
  fs::resize_file(big, uint64_t{1} << 40);  // sparse: 1 TiB claimed, nothing stored or read
  CHECK_THROWS_WITH(load_train_config(big, {}), Contains(big) && Contains("1099511627776 bytes, larger than the 67108864"));
  CHECK_THROWS_WITH(load_train_config("/dev/zero", {}), Contains("/dev/zero is a character device"));
  fs::remove_all(dir);
}

TEST_CASE("reals the f32 kernels divide by or exponentiate are bounded away from 0", "[config]") {
  auto parse = [](const std::string& extra) {
    return parse_train_config(nlohmann::json::parse(R"({"data": {"train": "x.bin"})" + extra + "}"), "mem.json", ".");
  };
  const std::string llama = R"(, "model": {"arch": "llama", )";
  // (the JSON fragment, the message): f32 rounds 1e-320 to 0, which would divide 0 by 0 (NaN) or
  // stop the run inside a kernel naming no key
  const std::pair<std::string, std::string> refused[] = {
      {llama + R"("rope_theta": 1e-320})", "mem.json: model.rope_theta: must be >= 1, got 9.99989e-321"},
      {llama + R"("rope_theta": 0.5})", "mem.json: model.rope_theta: must be >= 1, got 0.5"},
      {llama + R"("rope_theta": 0})", "mem.json: model.rope_theta: must be >= 1, got 0"},
      {llama + R"("norm_eps": 1e-320})", "mem.json: model.norm_eps: must be >= 1e-30, got 9.99989e-321"},
      {R"(, "optimizer": {"adamw": {"eps": 1e-320}})", "mem.json: optimizer.adamw.eps: must be >= 1e-30, got 9.99989e-321"},
      {R"(, "optimizer": {"adamw": {"eps": 1e-31}})", "mem.json: optimizer.adamw.eps: must be >= 1e-30, got 1e-31"},
  };
  for (const auto& [extra, message] : refused) {
    INFO(extra);
    CHECK_THROWS_WITH(parse(extra), Contains(message));
  }
  CHECK(parse(R"(, "optimizer": {"adamw": {"eps": 1e-30}})").optim.adamw.eps == 1e-30);
  CHECK(parse(llama + R"("rope_theta": 1, "norm_eps": 1e-30})").model.rope_theta == 1.0);
  CHECK_THROWS_WITH(load_train_config(kSrc + "/configs/tiny_test.json", {"optimizer.adamw.eps=1e-320"}),
                    StartsWith("--set optimizer.adamw.eps=1e-320: optimizer.adamw.eps: must be >= 1e-30"));
}

namespace {
// Every leaf of the config schema whose value is a string, as a dotted key path.
void string_keys(const nlohmann::json& j, const std::string& prefix, std::vector<std::string>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string k = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it.value().is_object()) string_keys(it.value(), k, out);
    else if (it.value().is_string()) out.push_back(k);
  }
}
}  // namespace

TEST_CASE("every config string must be UTF-8: refused naming the key, bytes shown escaped", "[config]") {
  const std::string cfg = kSrc + "/configs/tiny_test.json";
  std::vector<std::string> keys;
  string_keys(TrainConfig{}.to_json(false), "", keys);
  REQUIRE(keys.size() >= 20);  // every path key, the enumerations, training.resume
  for (const std::string& key : keys) {
    INFO(key);
    CHECK_THROWS_WITH(load_train_config(cfg, {key + "=x/bad\xff"}),
                      Equals("--set " + key + "=x/bad\\xff: " + key +
                             ": not valid UTF-8 (byte 0xff at offset 5 of \"x/bad\\xff\"); config strings must be UTF-8"));
  }
  // a key, an object and a number given with bad bytes: refused by name, never a JSON library exception
  CHECK_THROWS_WITH(load_train_config(cfg, {"model.n_layer\xff=2"}), Contains("model.n_layer\\xff: unknown key"));
  CHECK_THROWS_WITH(load_train_config(cfg, {"model={\"n_layer\xff\": 2}"}), Contains("model: expected an object"));
  CHECK_THROWS_WITH(load_train_config(cfg, {"model.n_layer=2\xff"}), Contains("model.n_layer: expected an integer"));

  // the same bytes inside the file: the file, the key, the line and the column
  testing::ScratchDir scratch("mfsdp_cfg_utf8");
  const std::string bad = scratch.file("bad.json");
  std::ofstream(bad) << "{\n  // a comment\n  \"logging\": {\"run_dir\": \"runs/\xff\"},\n  \"data\": {\"train\": \"x.bin\"}\n}\n";
  CHECK_THROWS_WITH(load_train_config(bad, {}),
                    Equals(bad + ": logging.run_dir: not valid UTF-8 (line 3, column 32: byte 0xff); config strings must be UTF-8"));
  std::ofstream(bad) << "{\"data\": {\"tr\xc3\": \"x.bin\"}}";
  CHECK_THROWS_WITH(load_train_config(bad, {}), Contains(bad + ": data.tr\xef\xbf\xbd: not valid UTF-8 (line 1, column 14: byte 0xc3)"));
  std::ofstream(bad) << "{\"data\": [1,, \"\xfe\"]}";  // not JSON either: the line, no key
  CHECK_THROWS_WITH(load_train_config(bad, {}), Equals(bad + ": not valid UTF-8 (line 1, column 16: byte 0xfe); config strings must be UTF-8"));
  std::ofstream(bad) << "{\"data\": }";  // other JSON errors: the reason, without the library's prefix
  CHECK_THROWS_WITH(load_train_config(bad, {}), StartsWith(bad + ": invalid JSON: parse error at line 1, column 10"));

  // a relative path in a file whose directory is not UTF-8 resolves to a path that is not
  const fs::path odd = scratch.dir / "odd\xff";
  fs::create_directories(odd);
  std::ofstream((odd / "c.json").string()) << R"({"data": {"train": "x.bin"}})";
  CHECK_THROWS_WITH(load_train_config((odd / "c.json").string(), {}),
                    Contains("data.train: resolves to a path that is not valid UTF-8") &&
                        Contains("(the config file's directory is not UTF-8)") && Contains("odd\\xff"));
}

TEST_CASE("training.global_batch_size derives grad_accum at the world size, or names what divides it", "[config]") {
  const std::string cfg = kSrc + "/configs/tiny_test.json";
  TrainConfig c = load_train_config(cfg, {"training.global_batch_size=24", "training.micro_batch_size=2"});
  REQUIRE(c.training.global_batch_size == 24);
  for (const auto& [world, accum] : std::vector<std::pair<int, int>>{{1, 12}, {2, 6}, {3, 4}, {4, 3}, {6, 2}, {12, 1}}) {
    TrainConfig at = c;
    CHECK(apply_global_batch(at, world).empty());
    CHECK(at.training.grad_accum == accum);  // 24 = world x 2 x accum
  }
  TrainConfig at5 = c;
  CHECK(apply_global_batch(at5, 5) ==
        cfg + ": training.global_batch_size 24 is not divisible by world size 5 x training.micro_batch_size 2 (= 10); "
              "world sizes that divide it: 1, 2, 3, 4, 6, 12");
  TrainConfig odd = load_train_config(cfg, {"training.global_batch_size=5", "training.micro_batch_size=2"});
  CHECK_THAT(apply_global_batch(odd, 1), Contains("no world size divides it at this micro-batch size"));
  TrainConfig unset = load_train_config(cfg, {"training.grad_accum=3"});
  CHECK(apply_global_batch(unset, 7).empty());
  CHECK(unset.training.grad_accum == 3);  // without the key grad_accum is as given
  CHECK_THROWS_WITH(load_train_config(cfg, {"training.global_batch_size=24", "training.grad_accum=2"}),
                    Contains("training.global_batch_size: set it or training.grad_accum (2), not both"));
  CHECK_THROWS_WITH(load_train_config(cfg, {"training.global_batch_size=0"}), Contains("training.global_batch_size"));
  CHECK(c.to_json().at("training").at("global_batch_size") == 24);
}
