// The compute precisions a run resolves to at start-up and the MFU denominator: `auto` in
// precision.matmul_dtype / optimizer.muon.ns_dtype becomes bf16 or f32 from the GEMM probe
// (runtime/gemm_probe.h), the same on every rank, and CPU ranks' MFU is measured against their
// probed GEMM rate unless logging.peak_tflops is set.
#pragma once
#include <string>
#include <vector>

#include "apps/train/train_config.h"
#include "comm/communicator.h"
#include "runtime/gemm_probe.h"

namespace mfsdp {

/// What a run computes in and what it was measured at.
struct RunPrecision {
  DType matmul = DType::f32;  ///< the matmuls' dtype (EngineOptions::matmuls())
  NsDType ns = NsDType::f32;  ///< the CPU Newton-Schulz products' dtype
  bool probed = false;        ///< CPU ranks measured the rates below
  /// Rates summed over all ranks (GFLOP/s): the GEMM at the matmul shape (probed unless
  /// logging.peak_tflops is set and the matmuls are plain f32) and one Newton-Schulz step of the
  /// largest block matrix (optim/ns_probe.h; probed when ns_dtype is auto or bf16); zero when not probed.
  GemmRates matmul_rates, ns_rates;
  /// One line per explicit bf16 that measured slower than f32, naming both rates.
  std::vector<std::string> notices;
  double peak_tflops_total = 0;  ///< MFU denominator: peak TFLOP/s of all ranks together
  std::string peak_source;       ///< what the denominator is, for the start-up line
};

/// The GEMM the matmul probe times: [B*T, n_embd] x [n_embd, MLP width] (4 n_embd for GPT-2, the
/// SwiGLU width for Llama), the largest of a block's forward products.
GemmShape matmul_probe_shape(const TrainConfig& cfg);
/// The largest block matrix, whose Newton-Schulz step the ns_dtype probe times: M = n_embd rows,
/// K = the MLP width columns (N = M: its X X^T).
GemmShape ns_probe_shape(const TrainConfig& cfg);

/// The decision from rates already summed over ranks (pure; `world` ranks in all). auto: bf16 on
/// CUDA; on CPU bf16 when bf16_pays (matmuls at kBf16Margin over the GEMM probe, Newton-Schulz at
/// kBf16StepMargin over the step probe), else f32 (ns: always f32 with gram_newton_schulz).
/// param follows cfg.optim.param_dtype. An explicit bf16 on CPU with rates.bf16 < rates.f32 adds
/// a notice. MFU denominator: logging.peak_tflops x world when set, else on CPU the summed rate of
/// the matmul dtype (NaN when not probed), on CUDA kCudaPeakTflops x world.
RunPrecision decide_precision(const TrainConfig& cfg, Device device, int world, bool probed,
                              const GemmRates& matmul_rates, const GemmRates& ns_rates);

/// Collective over `comm`: `mine` summed over its ranks in rank order (one all_gather_host), the
/// same numbers on every rank.
GemmRates sum_over_ranks(const GemmRates& mine, Communicator& comm);

/// Collective over `comm` and `replicas` (HSDP; may be null): on CPU ranks runs the probes the
/// config needs, sums the rates over every rank and decides (decide_precision), so all ranks resolve alike;
/// CUDA ranks decide without a probe or a collective. Writes the result into cfg.optim
/// (matmul_dtype, muon.ns_dtype) and returns it.
RunPrecision resolve_precision(TrainConfig& cfg, Communicator& comm, Communicator* replicas);

/// The start-up line: the matmul and Newton-Schulz dtypes, the measured rates and the MFU
/// denominator.
std::string describe_precision(const RunPrecision& p, const TrainConfig& cfg);

/// Model FLOPs utilisation: flops_per_token x tokens_per_second / (peak_tflops_total x 1e12);
/// NaN when the peak is not positive.
double model_flops_utilization(double flops_per_token, double tokens_per_second, double peak_tflops_total);

}  // namespace mfsdp
