#include "runtime/core/meminfo.h"
#include "apps/bench/calibrate.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <thread>
#include <vector>

#include "models/gpt.h"
#include "models/model_presets.h"
#include "optim/adamw.h"
#include "optim/step.h"
#include "planner/cost_model.h"
#include "runtime/autograd.h"
#include "runtime/core/clock.h"
#include "runtime/kernels.h"
#include "runtime/ops.h"

namespace mfsdp {
namespace {

template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_seconds();
    f();
    best = std::min(best, now_seconds() - t0);
  }
  return best;
}

double memory_gb() { return meminfo_bytes("MemTotal").value_or(0.0) / 1e9; }

// Rank-0 single-thread rates: GEMM f32 (FLOP/s), NS (FLOP/s), model fwd+bwd (FLOP/s), AdamW (B/s),
// GEMM bf16 (FLOP/s).
std::vector<double> single_rank_rates() {
  set_cpu_threads(1);
  const int64_t m = 768, n = 3072;
  std::vector<float> a(m * n, 0.01f), b(m * m, 0.02f), c(m * n);
  Kernels& k = kernels(Device::CPU);
  const double gemm = 2.0 * m * m * n / best_seconds(3, [&] { k.gemm(false, false, m, n, m, 1.f, b.data(), a.data(), 0.f, c.data()); });
  // The same product with bf16 operands (f32 accumulation): the rate bf16 Newton-Schulz and
  // param_dtype bf16 run at. 0x3C24 and 0x3CA4 are bf16 0.01 and 0.02.
  const std::vector<uint16_t> a16(m * n, 0x3C24), b16(m * m, 0x3CA4);
  const double gemm_bf16 =
      2.0 * m * m * n / best_seconds(3, [&] { k.gemm_bf16(false, false, m, n, m, 1.f, b16.data(), a16.data(), 0.f, c.data()); });
  Tensor u = Tensor::zeros({m * n}), o = Tensor::zeros({m * n});
  u.copy_from_host(a.data());
  MuonOptions mo;
  const double ns = muon_flops(m, n, mo.ns_steps) / best_seconds(2, [&] { muon_orthogonalize(u, o, m, n, 1, mo); });
  GPTConfig cfg = model_preset("gpt2-124m", 1).gpt_config();  // one block of GPT-2 124M
  cfg.seq_len = 64;
  GPT model(cfg);
  model.allocate_local(1);
  std::vector<int32_t> tok(64), tgt(64);
  for (int i = 0; i < 64; ++i) tok[i] = (i * 31) % cfg.vocab_size, tgt[i] = (i * 17 + 1) % cfg.vocab_size;
  const Tensor tt = tokens_tensor(tok, {1, 64}), tg = tokens_tensor(tgt, {1, 64});
  const double fwd_bwd = cfg.flops_per_token(64) * 64 / best_seconds(3, [&] {
    model.local_grads().zero();
    backward(model.forward_loss(tt, tg));
  });
  const int64_t E = 4 << 20;
  std::vector<float> p(E, 0.1f), g(E, 0.01f), mm(E), vv(E);
  AdamWOptions ao;
  const double mem = 28.0 * E / best_seconds(3, [&] { adamw_step_cpu(p.data(), g.data(), mm.data(), vv.data(), E, 1e-3, 1, ao); });
  return {gemm, ns, fwd_bwd, mem, gemm_bf16};
}

}  // namespace

ClusterSpec calibrate_this_machine(Communicator& comm) {
  const int W = comm.world_size();
  std::vector<double> r(5, 0.0);
  if (comm.rank() == 0) r = single_rank_rates();
  comm.barrier();
  for (double& x : r) x = comm.all_reduce_scalar(x, ReduceOp::max, CommPhase::other);
  const int64_t count = 2 << 20;  // 8 MB of f32 per rank
  std::vector<float> send(count, 1.f), recv(count * W);
  const std::vector<int64_t> counts(W, count);
  comm.barrier();
  const double t_ag = best_seconds(3, [&] { comm.all_gather_v(send.data(), recv.data(), counts, DType::f32, CommPhase::other); });
  comm.barrier();
  const double t_lat = best_seconds(3, [&] {
    for (int i = 0; i < 100; ++i) comm.all_reduce_scalar(1.0, ReduceOp::sum, CommPhase::other);
  }) / 100;
  const double bw = comm.all_reduce_scalar(4.0 * count * (W - 1) / std::max(t_ag, 1e-9), ReduceOp::max, CommPhase::other);
  const double lat = comm.all_reduce_scalar(t_lat / std::max(1, W - 1), ReduceOp::max, CommPhase::other);
  ClusterSpec c;
  c.name = "this_machine";
  c.source = "mfsdp-project --calibrate on this machine (CPU ranks, flat GEMM rates, no launch cost)";
  c.gemm_tflops_f32 = r[0] / 1e12;
  c.gemm_tflops_bf16 = r[4] / 1e12;
  c.ns_efficiency = r[1] / r[0];
  c.model_efficiency = r[2] / r[0];
  c.mem_GBps = r[3] / 1e9;
  c.memory_gb = memory_gb();
  c.gpus_per_node = 1024;
  c.intra_GBps = c.inter_GBps = W > 1 ? bw / 1e9 : 10.0;
  c.intra_latency_us = c.inter_latency_us = W > 1 ? lat * 1e6 : 1.0;
  c.linear_latency = true;
  c.cores_per_node = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return c;
}

}  // namespace mfsdp
