// Model presets (models/model_presets.h) and the cluster projection (planner/projection.h).
#include <catch2/catch.hpp>

#include "models/model_presets.h"
#include "planner/projection.h"

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
  CHECK(m8.total_gb == Approx(m8.persistent_gb + m8.gathered_gb + m8.activations_gb + m8.transient_gb));
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
  CHECK_THROWS_WITH(ClusterSpec::load("/nonexistent.json"), Catch::Contains("cannot open cluster file"));
}
