// One-GPU calibration of the projection's device constants (mfsdp-project --calibrate --device
// cuda): cuBLAS GEMM rates over size in bf16 and f32, Newton-Schulz per size, device memory
// bandwidth. calibrate_cuda.cpp in a CUDA build, calibrate_cuda_stub.cpp (throws) without CUDA.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/projection.h"

namespace mfsdp {

/// What the GPU calibration measures.
struct CudaCalibration {
  /// Square GEMM sides N (an N x N x N product, whose curve size cbrt(M N K) is N) for the GEMM
  /// curves and the [N, N] Newton-Schulz calls; increasing, each in [16, 16384].
  std::vector<int> sizes{256, 512, 768, 1024, 2048, 4096, 8192};
  int ns_steps = 5;                       ///< Newton-Schulz iterations per timed call
  int64_t copy_bytes = int64_t{256} << 20;  ///< size of the timed device-to-device copy, bytes
};

/// A calibrated device: the cluster file's fields and the raw timings behind them.
struct CudaCalibrationResult {
  ClusterSpec cluster;
  /// {"device", "sizes", "gemm_bf16_ms", "gemm_f32_ms", "ns_ms", "ns_steps", "ns_efficiency",
  /// "copy_bytes", "copy_ms", "launch_us", "not_measured"}: medians in milliseconds per size.
  nlohmann::json measurements;
};

/// Measures device 0 (the process's current device) and returns its constants as a ClusterSpec:
/// gemm_tflops_bf16 / _f32 the best rate over `what.sizes` (bf16: cublasGemmEx, bf16 operands and
/// result, f32 accumulation; f32: cublasSgemm with FP32 math, no TF32, as the engine's f32
/// GEMMs), gemm_curve_* each size's rate / that best, launch_us the wall time per back-to-back
/// 32^3 bf16 GEMM (host launch plus kernel), ns_efficiency the median over sizes of (the
/// Newton-Schulz GEMM time the projection predicts from the measured curve) / (newton_schulz_cuda's
/// measured time less its launches, at least half of it), mem_GBps (read + write bytes) / time
/// of a device-to-device copy, memory_gb the device's total memory; source "measured on <device
/// name> ...". The fields one GPU cannot measure (interconnect bandwidths and latencies,
/// model_efficiency, reserve_gb, gpus_per_node) are `base`'s (`base_name`: its file, "" for the
/// defaults), named in the source and in measurements["not_measured"]. Times are medians of CUDA
/// events on the legacy default stream after warm-up calls.
/// Throws std::runtime_error when this build has no CUDA, when no CUDA device is visible, or on a
/// CUDA / cuBLAS error; std::invalid_argument on sizes outside [16, 16384] or not increasing.
CudaCalibrationResult calibrate_cuda_device(const CudaCalibration& what, const ClusterSpec& base,
                                            const std::string& base_name);

}  // namespace mfsdp
