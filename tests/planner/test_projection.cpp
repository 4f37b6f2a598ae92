// Model presets (models/model_presets.h) and the cluster projection (planner/projection.h).
#include <catch2/catch.hpp>

#include <algorithm>

#include "models/model_presets.h"
#include "planner/projection.h"
#include "planner/projection_terms.h"
#include "planner/cost_model.h"
#include "runtime/engine/projection_rules.h"
#include "runtime/engine/resolve.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

using namespace mfsdp;

namespace {

ClusterSpec a100() { return ClusterSpec::load(std::string(MFSDP_SOURCE_DIR) + "/configs/clusters/a100_80gb_8x.json"); }

ProjectionInput llama7b(Placement p) {
  ProjectionInput in;
  in.model = model_preset("llama-7b").profile();
  in.placement = p;
  in.seq = 4096;
  in.activation_checkpointing = true;
  return in;
}

}  // namespace

TEST_CASE("presets have the published parameter counts", "[projection][presets]") {
  CHECK(model_preset("gpt2-124m").num_params() == 124475904);  // padded vocabulary 50304, tied head
  CHECK(model_preset("llama-7b").num_params() == 6738415616);
  CHECK(model_preset("llama3-8b").num_params() == 8030261248);
  CHECK(model_preset("llama-13b").num_params() == 13015864320);
  CHECK(model_preset("llama-7b", 2).n_layer == 2);
  CHECK(model_preset("llama-7b", 2).inventory().unit_names.size() == 4);
  CHECK_THROWS_WITH(model_preset("gpt5"), Catch::Contains("unknown model preset 'gpt5'"));
  const ModelShape j = model_shape_from_json(to_json(model_preset("llama3-70b")));
  CHECK(j.num_params() == model_preset("llama3-70b").num_params());
  // 6N + 12 L C T with N the matrices and the head (PaLM appendix B)
  const ModelShape m = model_preset("llama-7b");
  CHECK(m.flops_per_token(4096) == Approx(6.0 * (6738415616.0 - 32000.0 * 4096 - 65.0 * 4096) + 12.0 * 32 * 4096 * 4096));
  // the profile the projection reads carries the same counts, bit for bit, for both families
  for (const char* name : {"llama-7b", "gpt2-124m"}) {
    const ModelShape s = model_preset(name);
    const ModelProfile p = s.profile();
    CHECK(p.num_params() == s.num_params());
    CHECK(p.flops_per_token(4096) == s.flops_per_token(4096));
    CHECK(p.inventory.params.size() == s.inventory().params.size());
  }
}

TEST_CASE("the Qwen1.5-MoE-A2.7B shape projects, its same-shape expert matrices batched per owner",
          "[projection][moe]") {
  const ModelShape m = model_preset("qwen2-moe-a2.7b");
  CHECK(m.num_params() == 14315636736);                  // published: 14.3B (q/k/v biases, 0.15M, left out)
  CHECK(m.moe_config().num_active_params() == 2689026048);  // published: 2.7B activated
  const ClusterSpec c = ClusterSpec::load(std::string(MFSDP_SOURCE_DIR) + "/configs/clusters/h100_80gb_8x.json");
  ProjectionInput in;
  in.model = m.profile();
  in.seq = 4096;
  in.placement = Placement::matrixfsdp;
  in.batch_orthogonalize = Toggle::on;
  ProjectionInput one_by_one = in, fsdp2 = in;
  one_by_one.batch_orthogonalize = Toggle::off;
  fsdp2.placement = Placement::fsdp2;
  for (int w : {8, 64}) {
    const Projection b = project(in, c, w), o = project(one_by_one, c, w), f = project(fsdp2, c, w);
    INFO("world " << w << ": batched " << b.optimizer_ms << " ms, one at a time " << o.optimizer_ms << " ms, fsdp2 "
                  << f.optimizer_ms << " ms");
    // 60 same-shape experts x 24 layers: one chain per shape and owner pays the launches once
    CHECK(b.optimizer_ms < 0.5 * o.optimizer_ms);
    CHECK(f.optimizer_ms > 10 * b.optimizer_ms);
    CHECK(b.forward_ms == o.forward_ms);
  }
}

TEST_CASE("the projection's memory terms are the documented per-element bytes", "[projection][memory]") {
  const ClusterSpec c = a100();
  const double P = static_cast<double>(model_preset("llama-7b").num_params());
  // ddp: every rank holds f32 params, grads and state: 12 B per Muon element, 16 B per AdamW one.
  const double adamw = 2.0 * 32000 * 4096 + 65.0 * 4096;
  const Projection d = project(llama7b(Placement::ddp), c, 8);
  CHECK(d.persistent_gb == Approx((12.0 * (P - adamw) + 16.0 * adamw) / 1e9));
  CHECK(d.oom);
  // zero1 keeps full f32 params and grads resident (8 B per element) plus its owned state.
  const Projection z = project(llama7b(Placement::zero1), c, 64);
  CHECK(z.persistent_gb > 8.0 * P / 1e9);
  CHECK(z.persistent_gb < 8.0 * P / 1e9 * 1.02);
  // matrixfsdp's owned state shrinks with the world size.
  const Projection m8 = project(llama7b(Placement::matrixfsdp), c, 8), m64 = project(llama7b(Placement::matrixfsdp), c, 64);
  CHECK(m8.persistent_gb == Approx(12.0 * P / 8 / 1e9).epsilon(0.1));
  CHECK(m64.persistent_gb < m8.persistent_gb / 4);
  CHECK_FALSE(m8.oom);
  // the peak: persistent state plus the larger phase, forward/backward or the optimizer step
  CHECK(m8.total_gb == Approx(m8.persistent_gb + std::max(m8.gathered_gb + m8.activations_gb, m8.transient_gb)));
}

TEST_CASE("fsdp2's optimizer step does not shrink with the world size, matrixfsdp's does", "[projection][time]") {
  const ClusterSpec c = a100();
  double last_ratio = 0;
  for (int w : {8, 64, 512}) {
    const Projection m = project(llama7b(Placement::matrixfsdp), c, w), f = project(llama7b(Placement::fsdp2), c, w);
    const double r = f.optimizer_ms / m.optimizer_ms;
    INFO("world " << w << ": ratio " << r);
    CHECK(r > last_ratio);
    CHECK(f.step_ms > m.step_ms);
    CHECK(m.step_ms == Approx(m.forward_ms + m.backward_ms + m.reduce_ms + m.optimizer_ms));
    last_ratio = r;
  }
  CHECK(last_ratio > 20);
  // Fewer Newton-Schulz steps shrink the optimizer step in proportion to its FLOPs.
  ProjectionInput ns2 = llama7b(Placement::fsdp2);
  ns2.ns_steps = 2;
  CHECK(project(ns2, c, 8).optimizer_ms < 0.5 * project(llama7b(Placement::fsdp2), c, 8).optimizer_ms);
}

TEST_CASE("HSDP keeps gathers inside a node and pays the replica chain", "[projection][hsdp]") {
  const ClusterSpec c = a100();
  ProjectionInput flat = llama7b(Placement::matrixfsdp), hsdp = flat;
  hsdp.replicas = 8;  // 8 replicas of 8-GPU shard groups at 64 GPUs
  const Projection f = project(flat, c, 64), h = project(hsdp, c, 64);
  CHECK(h.replicas == 8);
  CHECK(h.forward_ms < f.forward_ms);        // gathers over NVLink instead of InfiniBand
  CHECK(h.persistent_gb > f.persistent_gb);  // owners planned over 8 ranks, not 64
  CHECK(h.reduce_ms > 0);
  ProjectionInput bad = hsdp;
  bad.replicas = 3;
  CHECK_THROWS_AS(project(bad, c, 64), std::invalid_argument);
  bad = hsdp;
  bad.placement = Placement::ddp;
  CHECK_THROWS_AS(project(bad, c, 64), std::invalid_argument);
}

TEST_CASE("cluster files load and bad ones are refused", "[projection][cluster]") {
  const ClusterSpec c = a100();
  CHECK(c.gpus_per_node == 8);
  CHECK(c.memory_gb == 80);
  CHECK(c.inter_GBps == 23);
  CHECK_THROWS_WITH(ClusterSpec::load("/nonexistent.json"),
                    Catch::Contains("cannot open") && Catch::Contains("/nonexistent.json"));
}

TEST_CASE("cluster numbers out of range are refused naming the file and the field", "[projection][cluster]") {
  const std::string good = std::string(MFSDP_SOURCE_DIR) + "/configs/clusters/a100_80gb_8x.json";
  std::ifstream in(good);
  const nlohmann::json base = nlohmann::json::parse(in);
  const std::string path = (std::filesystem::temp_directory_path() / ("mfsdp_cluster_" + std::to_string(::getpid()) + ".json")).string();
  const auto load_with = [&](const std::string& key, const std::string& value_text) {
    nlohmann::json j = base;
    j[key] = nullptr;
    std::string text = j.dump();  // the value as raw text: 1e999 and strings reach the reader as written
    const std::string slot = "\"" + key + "\":null";
    text.replace(text.find(slot), slot.size(), "\"" + key + "\":" + value_text);
    std::ofstream(path) << text;
    return ClusterSpec::load(path);
  };
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"gpus_per_node", "0"},        {"gpus_per_node", "2.5"},    {"gpus_per_node", "100000000"},
      {"memory_gb", "-1"},           {"memory_gb", "0"},          {"reserve_gb", "80"},
      {"reserve_gb", "-0.5"},        {"mem_GBps", "\"fast\""},    {"mem_GBps", "1e300"},
      {"intra_GBps", "0"},           {"inter_GBps", "-23"},       {"gemm_tflops_f32", "1e9"},
      {"gemm_tflops_bf16", "-1"},    {"ns_efficiency", "0"},      {"model_efficiency", "1000"},
      {"intra_latency_us", "-8"},    {"inter_latency_us", "1e30"}, {"launch_us", "-1"},
      {"cores_per_node", "-4"},      {"linear_latency", "2"},     {"name", "7"},
      {"gemm_curve_f32", "[[-256, 0.5]]"}, {"gemm_curve_bf16", "[[256, 2.0]]"}, {"gemm_curve_bf16", "[[256]]"},
      {"gemm_curve_f32", "[[512, 0.5], [256, 0.6]]"}};
  for (const auto& [key, value] : bad) {
    INFO(key << " = " << value);
    CHECK_THROWS_WITH(load_with(key, value), Catch::Contains(path + ": " + key + ":"));
  }
  // A number beyond double's range is refused by the parser, naming the file.
  CHECK_THROWS_WITH(load_with("mem_GBps", "1e999"), Catch::Contains(path + ": ") && Catch::Contains("overflow"));
  // In range (the edges included) loads, with the value read.
  CHECK(load_with("gpus_per_node", "1").gpus_per_node == 1);
  CHECK(load_with("reserve_gb", "0").reserve_gb == 0);
  CHECK(load_with("gemm_tflops_bf16", "0").gemm_tflops_bf16 == 156);  // 0: the f32 rate
  // A required rate that is missing is named.
  nlohmann::json j = base;
  j.erase("mem_GBps");
  std::ofstream(path) << j.dump();
  CHECK_THROWS_WITH(ClusterSpec::load(path), Catch::Contains(path + ": mem_GBps: missing"));
  std::filesystem::remove(path);
}

TEST_CASE("GEMM efficiency follows the cluster's curve and the roofline", "[projection][gemm]") {
  const ClusterSpec c = a100();
  // Between points the curve is linear in log2(size); outside it is clamped.
  CHECK(curve_efficiency(c.gemm_curve_bf16, 768) == Approx(0.27));
  CHECK(curve_efficiency(c.gemm_curve_bf16, 1.0) == Approx(0.04));
  CHECK(curve_efficiency(c.gemm_curve_bf16, 1e6) == Approx(0.87));
  CHECK(curve_efficiency(c.gemm_curve_bf16, std::sqrt(1024.0 * 2048.0)) == Approx((0.42 + 0.7) / 2));
  CHECK(curve_efficiency({}, 10.0) == 1.0);
  CHECK_THROWS_AS(curve_efficiency({{1024, 0.5}, {512, 0.6}}, 700), std::invalid_argument);
  // 8192^3 in bf16: 2 * 8192^3 FLOPs at 312 TFLOP/s * 0.87, plus one launch.
  const double t = gemm_seconds(c, DType::bf16, 1, 8192, 8192, 8192, 1.0);
  CHECK(t == Approx(2.0 * 8192.0 * 8192 * 8192 / (312e12 * 0.87) + 6e-6));
  // A 768^3 GEMM is launch- and tile-bound: far below the large-GEMM rate.
  const double small = 2.0 * 768.0 * 768 * 768 / gemm_seconds(c, DType::bf16, 1, 768, 768, 768, 1.0);
  CHECK(small < 0.3 * 312e12);
  // f32 uses its own rate (TF32 on A100) and curve.
  CHECK(gemm_seconds(c, DType::f32, 1, 8192, 8192, 8192, 1.0) > 1.9 * t);
  // A skinny GEMM is bound by memory bandwidth, not FLOPs.
  const double gemv = gemm_seconds(c, DType::bf16, 1, 1, 8192, 8192, 1.0);
  CHECK(gemv == Approx(2.0 * (8192.0 + 8192.0 * 8192 + 8192) / 1800e9 + 6e-6));
}

TEST_CASE("Newton-Schulz is its GEMMs plus launches; batching same shapes pays launches once", "[projection][ns]") {
  const ClusterSpec c = a100();
  const double one = newton_schulz_seconds(c, DType::bf16, 3072, 768, 5, 1, false, 1.0);
  const double gemms = gemm_seconds(c, DType::bf16, 1, 768, 768, 3072, 1.0) + gemm_seconds(c, DType::bf16, 1, 768, 768, 768, 1.0) +
                       gemm_seconds(c, DType::bf16, 1, 768, 3072, 768, 1.0);
  CHECK(one == Approx(5 * (gemms + kNsExtraLaunchesPerIteration * 6e-6) + kNsNormalizeLaunches * 6e-6));
  CHECK(newton_schulz_seconds(c, DType::bf16, 3072, 768, 5, 12, false, 1.0) == Approx(12 * one));
  // Twelve small matrices batched run nearer the large-GEMM rate than twelve chains.
  CHECK(newton_schulz_seconds(c, DType::bf16, 3072, 768, 5, 12, true, 1.0) < 0.5 * 12 * one);
  CHECK(newton_schulz_seconds(c, DType::bf16, 3072, 768, 0, 12, true, 1.0) == 0.0);
  // A CPU cluster (flat rate, no launches) is FLOPs / (rate * ns_efficiency), as calibrated.
  ClusterSpec cpu = c;
  cpu.gemm_curve_bf16.clear();
  cpu.launch_us = 0;
  cpu.mem_GBps = 1e9;
  cpu.ns_efficiency = 0.5;
  CHECK(newton_schulz_seconds(cpu, DType::bf16, 3072, 768, 5, 2, false, 1.0) ==
        Approx(2 * muon_flops(3072, 768, 5) / (312e12 * 0.5)));
}

TEST_CASE("the unit schedule hides prefetched gathers and overlapped reductions but not the last unit's",
          "[projection][overlap]") {
  std::vector<UnitTimes> u(4, UnitTimes{1.0, 2.0, 0.5, 0.8});
  // Blocking (CPU): every gather and reduction adds to the compute.
  const UnitSchedule b = schedule_units(u, 0, false);
  CHECK(b.forward == Approx(4 * 1.5));
  CHECK(b.backward == Approx(4 * 2.5));
  CHECK(b.reduce_wait == Approx(4 * 0.8));
  // Prefetch 1 and overlapped reductions: only the first gather of each pass and unit 0's
  // reduction (the bubble after the backward) are exposed.
  const UnitSchedule o = schedule_units(u, 1, true);
  CHECK(o.forward == Approx(0.5 + 4 * 1.0));
  CHECK(o.backward == Approx(0.5 + 4 * 2.0));
  CHECK(o.reduce_wait == Approx(0.8));
  // Communication slower than compute shows through: the comm stream is the bottleneck.
  std::vector<UnitTimes> slow(4, UnitTimes{1.0, 2.0, 3.0, 0.0});
  CHECK(schedule_units(slow, 1, true).forward == Approx(4 * 3.0 + 1.0));
}

TEST_CASE("GPU defaults overlap communication; the baseline's semantics are options", "[projection][baseline]") {
  const ClusterSpec c = a100();
  ProjectionInput m = llama7b(Placement::matrixfsdp);
  const Projection overlapped = project(m, c, 8);
  m.prefetch_depth = 0;
  m.overlap_reduce = Toggle::off;
  const Projection blocking = project(m, c, 8);
  CHECK(overlapped.step_ms < blocking.step_ms);
  CHECK(overlapped.exposed_gather_ms < 0.2 * blocking.exposed_gather_ms);
  CHECK(overlapped.reduce_ms > 0);  // unit 0's reduction: the bubble
  ProjectionInput f = llama7b(Placement::fsdp2);
  f.ns_steps = 2;
  const Projection every = project(f, c, 8);
  CHECK(every.optimizer_ms == Approx(every.ns_ms + every.elementwise_ms + every.opt_comm_ms));
  f.baseline.ns = BaselineNs::row_sharded;
  const Projection rows = project(f, c, 8);
  CHECK(rows.ns_ms < 0.4 * every.ns_ms);  // each rank computes about 1/8 of the products (and the Grams whole)
  CHECK(rows.opt_comm_ms > every.opt_comm_ms);
  // Its exchanges in closed form (torch.optim.Muon's collectives on Shard(0) DTensors): per matrix
  // one scalar all-reduce; per iteration a tall matrix (w1, w3: [11008, 4096]) all-reduces its
  // 4096^2 Gram twice, a wide or square one (w2; wq, wk, wv, wo) all-gathers X, A and X. A
  // collective of 8 ranks in one node moving b bytes per rank: b / 230 GB/s + 3 hops x 8 us.
  {
    const double coll_8 = 3 * 8e-6, bw = 230e9, part = 7.0 / 8, e = 2, m = 4096, n = 11008;
    const auto all_reduce = [&](double bytes) { return 2 * bytes * part / bw + coll_8; };
    const auto gather = [&](double bytes) { return bytes * part / bw + coll_8; };
    const double tall = all_reduce(e) + 2 * 2 * all_reduce(m * m * e);
    const double wide = all_reduce(e) + 2 * (2 * gather(m * n * e) + gather(m * m * e));
    const double square = all_reduce(e) + 2 * 3 * gather(m * m * e);
    CHECK(rows.opt_comm_ms == Approx(1e3 * 32 * (2 * tall + wide + 4 * square)).epsilon(1e-9));
  }
  CHECK(every.host_ms == 0);
  // Host dispatch: per matrix 9 ops, 2 more when tall, 4 per iteration, at host_op_us each; the
  // slowest rank runs every matrix's share. llama-7b: per layer 4 square + w2 (wide) + w1, w3 (tall).
  CHECK(baseline_dtensor_ops(11008, 4096, 2) == 19);
  CHECK(baseline_dtensor_ops(4096, 11008, 2) == 17);
  CHECK(rows.host_ms == Approx(32 * (5 * 17 + 2 * 19) * 90e-3));
  CHECK(rows.optimizer_ms == Approx(rows.ns_ms + rows.elementwise_ms + rows.opt_comm_ms + rows.host_ms));
  f.baseline.ns = BaselineNs::every_rank;
  f.baseline.gather_dtype = DType::f32;
  CHECK(project(f, c, 8).opt_comm_ms > 1.8 * every.opt_comm_ms);  // twice the bytes, the same hops
  f.baseline.ns_steps = 5;
  CHECK(project(f, c, 8).ns_ms > 2 * every.ns_ms);
  CHECK(f.baseline.describe(DType::bf16, 2) == "fsdp2 baseline: every_rank Newton-Schulz, gather f32, NS 5");
  f.baseline.ns = BaselineNs::row_sharded;
  CHECK(f.baseline.describe(DType::bf16, 2) ==
        "fsdp2 baseline: row_sharded Newton-Schulz, gather f32, NS 5, 90 us host dispatch per DTensor op");
  CHECK(parse_baseline_ns("row_sharded") == BaselineNs::row_sharded);
  CHECK_THROWS_WITH(parse_baseline_ns("owners"), Catch::Contains("every_rank or row_sharded"));
}

TEST_CASE("the projection's engine switches are the engine's rulebook for the cluster's device", "[projection][resolve]") {
  const ClusterSpec gpu = a100();
  ClusterSpec cpu = gpu;
  cpu.cores_per_node = 2;  // a calibrated CPU machine: its runs resolve for Device::CPU
  const ProjectionInput m = llama7b(Placement::matrixfsdp);
  const EngineChoices g = engine_choices(m, gpu), h = engine_choices(m, cpu);
  CHECK(g.prefetch_depth == 1);  // resolve()'s CUDA defaults
  CHECK(g.overlap_reduce);
  CHECK(g.batch_orthogonalize);
  CHECK(h.prefetch_depth == 0);  // and its CPU ones
  CHECK_FALSE(h.overlap_reduce);
  CHECK(h.batch_orthogonalize);  // on both devices
  CHECK(g.planner.ns_steps == m.ns_steps);
  CHECK_FALSE(g.planner.round_robin);
  // asked-for switches win over the device default; round-robin owners reach the planner
  ProjectionInput forced = m;
  forced.prefetch_depth = 3;
  forced.overlap_reduce = Toggle::off;
  forced.batch_orthogonalize = Toggle::off;
  forced.round_robin_owners = true;
  forced.ns_steps = 2;
  const EngineChoices f = engine_choices(forced, cpu);
  CHECK(f.prefetch_depth == 3);
  CHECK_FALSE(f.overlap_reduce);
  CHECK_FALSE(f.batch_orthogonalize);
  CHECK(f.planner.round_robin);
  CHECK(f.planner.ns_steps == 2);
  // the rulebook's rules: no overlapped reduction under replicas or for ddp's all-reduce, even asked for
  ProjectionInput hsdp = m;
  hsdp.replicas = 2;
  hsdp.overlap_reduce = Toggle::on;
  CHECK_FALSE(engine_choices(hsdp, gpu).overlap_reduce);
  ProjectionInput ddp = llama7b(Placement::ddp);
  ddp.overlap_reduce = Toggle::on;
  CHECK_FALSE(engine_choices(ddp, gpu).overlap_reduce);
  ddp.replicas = 2;  // ddp is already replicated: refused as the engine refuses it
  CHECK_THROWS_AS(engine_choices(ddp, gpu), OptionError);
  // project(in, cluster, world) projects with engine_choices(): the same step as choices built by
  // hand from the asked-for switches, and not the step of the device's defaults.
  EngineChoices hand;
  hand.prefetch_depth = 3;
  hand.overlap_reduce = false;
  hand.batch_orthogonalize = false;
  hand.planner.ns_steps = 2;
  hand.planner.round_robin = true;
  CHECK(project(forced, cpu, 8).step_ms == project(forced, cpu, 8, hand).step_ms);
  CHECK(project(forced, cpu, 8).step_ms != project(forced, cpu, 8, EngineChoices{}).step_ms);
  // the choices' Newton-Schulz steps cost the owners' work, not the input's
  EngineChoices five = hand;
  five.planner.ns_steps = 5;
  CHECK(project(forced, cpu, 8, five).ns_ms == Approx(2.5 * project(forced, cpu, 8, hand).ns_ms).epsilon(0.05));
}
