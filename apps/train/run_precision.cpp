// Start-up precision resolution and the MFU denominator (see run_precision.h).
#include "apps/train/run_precision.h"

#include <cmath>
#include <fmt/format.h>
#include <limits>

#include "optim/ns_probe.h"
#include "runtime/kernels.h"

namespace mfsdp {
namespace {

int64_t mlp_width(const TrainConfig& cfg) {
  if (cfg.model.arch == "llama" && cfg.model.intermediate_size > 0) return cfg.model.intermediate_size;
  if (cfg.model.arch == "qwen2_moe") return cfg.model.moe_intermediate_size;
  return 4 * static_cast<int64_t>(cfg.model.n_embd);
}

/// The dtype `asked` runs in on `device` with summed rates `r` (param: `param`; auto: bf16_pays at
/// `margin`).
DType decide_one(DTypeChoice asked, DType param, Device device, bool probed, const GemmRates& r, double margin) {
  switch (asked) {
    case DTypeChoice::param: return param;
    case DTypeChoice::f32: return DType::f32;
    case DTypeChoice::bf16: return DType::bf16;
    case DTypeChoice::auto_: break;
  }
  if (device == Device::CUDA) return DType::bf16;
  return probed && bf16_pays(r, margin) ? DType::bf16 : DType::f32;
}

void add_notice(RunPrecision& p, const char* key, const GemmRates& r) {
  if (p.probed && r.bf16 < r.f32)
    p.notices.push_back(fmt::format("notice: {} bf16 runs slower than f32 on this CPU ({}); \"auto\" would pick f32",
                                    key, describe_rates(r)));
}

}  // namespace

GemmShape matmul_probe_shape(const TrainConfig& cfg) {
  return {static_cast<int64_t>(cfg.training.micro_batch_size) * cfg.model.seq_len, mlp_width(cfg), cfg.model.n_embd};
}

GemmShape ns_probe_shape(const TrainConfig& cfg) { return {cfg.model.n_embd, cfg.model.n_embd, mlp_width(cfg)}; }

RunPrecision decide_precision(const TrainConfig& cfg, Device device, int world, bool probed,
                              const GemmRates& matmul_rates, const GemmRates& ns_rates) {
  RunPrecision p;
  p.probed = probed && device == Device::CPU;
  if (p.probed) p.matmul_rates = matmul_rates, p.ns_rates = ns_rates;
  p.matmul = decide_one(cfg.precision.matmul, cfg.optim.param_dtype, device, p.probed, matmul_rates, kBf16Margin);
  if (cfg.model.arch == "qwen2_moe") p.matmul = DType::f32;  // the MoE op's only matmul dtype (runtime/ops_moe.h)
  const bool gram = cfg.optim.muon.orthogonalizer == Orthogonalizer::gram_newton_schulz;
  const DType ns = gram && cfg.precision.ns == DTypeChoice::auto_
                       ? DType::f32 : decide_one(cfg.precision.ns, DType::f32, device, p.probed, ns_rates, kBf16StepMargin);
  p.ns = ns == DType::bf16 ? NsDType::bf16 : NsDType::f32;
  if (device == Device::CPU) {
    const bool explicit_matmul = cfg.precision.matmul == DTypeChoice::bf16 ||
                                 (cfg.precision.matmul == DTypeChoice::param && cfg.optim.param_dtype == DType::bf16);
    if (explicit_matmul) add_notice(p, "precision.matmul_dtype", matmul_rates);
    if (cfg.precision.ns == DTypeChoice::bf16) add_notice(p, "optimizer.muon.ns_dtype", ns_rates);
  }
  if (cfg.logging.peak_tflops) {
    p.peak_tflops_total = *cfg.logging.peak_tflops * world;
    p.peak_source = fmt::format("logging.peak_tflops {:g} TFLOP/s per rank", *cfg.logging.peak_tflops);
  } else if (device == Device::CUDA) {
    p.peak_tflops_total = kCudaPeakTflops * world;
    p.peak_source = fmt::format("datasheet peak {:g} TFLOP/s per GPU", kCudaPeakTflops);
  } else if (p.probed) {
    const double gflops = p.matmul == DType::bf16 ? matmul_rates.bf16 : matmul_rates.f32;
    p.peak_tflops_total = gflops / 1e3;
    p.peak_source = fmt::format("measured {} GEMM rate, {:.0f} GFLOP/s over {} rank(s)", dtype_name(p.matmul), gflops, world);
  } else {
    p.peak_tflops_total = std::numeric_limits<double>::quiet_NaN();
    p.peak_source = "none (no probe and no logging.peak_tflops)";
  }
  return p;
}

GemmRates sum_over_ranks(const GemmRates& mine, Communicator& comm) {
  const int W = comm.world_size();
  std::vector<double> all(2 * static_cast<size_t>(W));
  const double send[2] = {mine.f32, mine.bf16};
  comm.all_gather_host(send, all.data(), sizeof send, CommPhase::other);
  GemmRates sum;
  for (int r = 0; r < W; ++r) sum.f32 += all[2 * r], sum.bf16 += all[2 * r + 1];
  return sum;
}

RunPrecision resolve_precision(TrainConfig& cfg, Communicator& comm, Communicator* replicas) {
  const Device device = comm.device();
  const int world = comm.world_size() * (replicas ? replicas->world_size() : 1);
  GemmRates mm, ns;
  const bool probe = device == Device::CPU;
  if (probe) {  // what each probe serves depends on the config alone, so every rank takes the same
    auto summed = [&](const GemmRates& mine) {
      const GemmRates group = sum_over_ranks(mine, comm);
      return replicas ? sum_over_ranks(group, *replicas) : group;
    };
    const DTypeChoice m = cfg.precision.matmul;
    if (!cfg.logging.peak_tflops || m == DTypeChoice::auto_ || m == DTypeChoice::bf16 ||
        (m == DTypeChoice::param && cfg.optim.param_dtype == DType::bf16))
      mm = summed(probe_cpu_gemm_rates(matmul_probe_shape(cfg)));
    const Orthogonalizer method = cfg.optim.muon.orthogonalizer;
    if (cfg.precision.ns != DTypeChoice::f32 && method != Orthogonalizer::gram_newton_schulz) {
      const GemmShape s = ns_probe_shape(cfg);
      ns = summed(probe_orthogonalizer_rates(s.M, s.K, method));
    }
  }
  RunPrecision p = decide_precision(cfg, device, world, probe, mm, ns);
  if (p.matmul != cfg.optim.param_dtype) cfg.optim.matmul_dtype = p.matmul;
  else cfg.optim.matmul_dtype.reset();
  cfg.optim.muon.ns_dtype = p.ns;
  return p;
}

std::string describe_precision(const RunPrecision& p, const TrainConfig& cfg) {
  std::string s = fmt::format("compute precision: matmuls {} (precision.matmul_dtype {}), Newton-Schulz {} "
                              "(optimizer.muon.ns_dtype {})",
                              dtype_name(p.matmul), kMatmulChoiceNames.name(cfg.precision.matmul), ns_dtype_name(p.ns),
                              kNsChoiceNames.name(cfg.precision.ns));
  if (p.matmul_rates.f32 > 0)
    s += fmt::format(" | GEMM probe (summed over ranks, {} thread(s) each): {}", cpu_threads(),
                     describe_rates(p.matmul_rates));
  if (p.ns_rates.f32 > 0) s += fmt::format(" | Newton-Schulz step probe: {}", describe_rates(p.ns_rates));
  return s + " | MFU denominator: " + p.peak_source;
}

double model_flops_utilization(double flops_per_token, double tokens_per_second, double peak_tflops_total) {
  if (!(peak_tflops_total > 0)) return std::numeric_limits<double>::quiet_NaN();
  return flops_per_token * tokens_per_second / (peak_tflops_total * 1e12);
}

}  // namespace mfsdp
