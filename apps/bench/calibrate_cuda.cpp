#include "apps/bench/calibrate_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <stdexcept>

#include "apps/bench/cuda_timing.h"
#include "optim/optim_cuda.h"
#include "planner/projection_terms.h"
#include "runtime/cuda/device_api.h"
#include "runtime/tensor.h"

namespace mfsdp {
namespace {

using cuda_timing::check;

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("--calibrate --device cuda: ") + what + " failed (cuBLAS status " +
                             std::to_string(static_cast<int>(s)) + ")");
}

// n values uniform in [-1, 1) on the device, f32.
Tensor random_matrix(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return Tensor::from_vector(v, {n}, Device::CUDA);
}

int reps_for(int n) { return n >= 4096 ? 3 : 10; }

// The operands of every timed product, sized for the largest side.
struct Operands {
  Tensor a32, b32, c32, a16, b16, c16;
  explicit Operands(int n) {
    const int64_t e = static_cast<int64_t>(n) * n;
    a32 = random_matrix(e, 1);
    b32 = random_matrix(e, 2);
    c32 = Tensor::zeros({e}, DType::f32, Device::CUDA);
    a16 = a32.to(DType::bf16);
    b16 = b32.to(DType::bf16);
    c16 = Tensor::zeros({e}, DType::bf16, Device::CUDA);
  }
};

// One n x n x n product: bf16 operands and result with f32 accumulation (cublasGemmEx), or f32
// with the handle's FP32 math (cublasSgemm, no TF32).
void gemm(cublasHandle_t h, bool bf16, int n, Operands& o) {
  const float one = 1.0f, zero = 0.0f;
  if (bf16)
    check_blas(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, o.a16.data_ptr(), CUDA_R_16BF, n,
                            o.b16.data_ptr(), CUDA_R_16BF, n, &zero, o.c16.data_ptr(), CUDA_R_16BF, n,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
  else
    check_blas(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, o.a32.data_f32(), n, o.b32.data_f32(), n,
                           &zero, o.c32.data_f32(), n),
               "cublasSgemm");
}

// Wall microseconds per 32^3 bf16 GEMM over 200 back-to-back calls: host launch plus kernel.
double launch_us(cublasHandle_t h, Operands& o) {
  constexpr int kCalls = 200;
  gemm(h, true, 32, o);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) gemm(h, true, 32, o);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kCalls;
}

// Read + write GB/s of a device-to-device copy of `bytes`; its median milliseconds into `ms`.
double copy_GBps(int64_t bytes, double& ms) {
  const int64_t n = bytes / 4;
  Tensor src = Tensor::zeros({n}, DType::f32, Device::CUDA), dst = Tensor::zeros({n}, DType::f32, Device::CUDA);
  ms = cuda_timing::median_ms([&] {
    check(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), static_cast<size_t>(n * 4), cudaMemcpyDeviceToDevice, 0),
          "cudaMemcpyAsync");
  }, 2, 10);
  return 2.0 * static_cast<double>(n * 4) / (ms * 1e-3) / 1e9;
}

// The GEMM rate of each size as a fraction of the best into `curve`; returns the best, TFLOP/s.
double rate_curve(const std::vector<int>& sizes, const std::vector<double>& ms,
                  std::vector<std::pair<double, double>>& curve) {
  std::vector<double> tflops;
  for (size_t i = 0; i < sizes.size(); ++i) tflops.push_back(2.0 * std::pow(sizes[i], 3.0) / (ms[i] * 1e-3) / 1e12);
  const double best = *std::max_element(tflops.begin(), tflops.end());
  curve.clear();
  for (size_t i = 0; i < sizes.size(); ++i) curve.emplace_back(sizes[i], tflops[i] / best);
  return best;
}

// Newton-Schulz efficiency per size: the GEMM time the projection predicts on `c` (its measured
// curve, ns_efficiency 1) over the measured time less the call's launches (at least half the
// measured time, so a launch estimate near a small call's whole time cannot inflate the ratio).
std::vector<double> ns_efficiency(const ClusterSpec& c, const std::vector<int>& sizes, const std::vector<double>& ms,
                                  int steps) {
  ClusterSpec probe = c;
  probe.ns_efficiency = 1.0;
  const double launches = (kNsNormalizeLaunches + steps * kNsExtraLaunchesPerIteration) * c.launch_us * 1e-6;
  std::vector<double> eff;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const double gemms = newton_schulz_seconds(probe, DType::bf16, sizes[i], sizes[i], steps, 1, false, 1.0) - launches;
    eff.push_back(gemms / std::max(ms[i] * 1e-3 - launches, ms[i] * 1e-3 / 2));
  }
  return eff;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void check_sizes(const CudaCalibration& what) {
  if (what.sizes.empty()) throw std::invalid_argument("--calibrate-sizes: at least one size");
  for (size_t i = 0; i < what.sizes.size(); ++i)
    if (what.sizes[i] < 16 || what.sizes[i] > 16384 || (i > 0 && what.sizes[i] <= what.sizes[i - 1]))
      throw std::invalid_argument("--calibrate-sizes: sizes must increase, each in [16, 16384]; got " +
                                  std::to_string(what.sizes[i]));
  if (what.ns_steps < 1 || what.copy_bytes < 4) throw std::invalid_argument("--calibrate --device cuda: bad settings");
}

// The timed products and Newton-Schulz calls of every size, milliseconds, into `m`.
void time_sizes(const CudaCalibration& what, cublasHandle_t h, nlohmann::json& m) {
  Operands o(std::max(what.sizes.back(), 32));  // launch_us runs 32^3 products on the same operands
  std::vector<double> bf16_ms, f32_ms, ns_ms;
  MuonCudaWorkspace ws;
  for (int n : what.sizes) {
    bf16_ms.push_back(cuda_timing::median_ms([&] { gemm(h, true, n, o); }, 2, reps_for(n)));
    f32_ms.push_back(cuda_timing::median_ms([&] { gemm(h, false, n, o); }, 2, reps_for(n)));
    Tensor out = Tensor::zeros({static_cast<int64_t>(n) * n}, DType::f32, Device::CUDA);
    ns_ms.push_back(cuda_timing::median_ms([&] {
      newton_schulz_cuda(o.a32.data_f32(), out.data_f32(), n, n, what.ns_steps, nullptr, h, &ws);
    }, 1, reps_for(n)));
  }
  m["gemm_bf16_ms"] = bf16_ms;
  m["gemm_f32_ms"] = f32_ms;
  m["ns_ms"] = ns_ms;
  m["launch_us"] = launch_us(h, o);
}

}  // namespace

CudaCalibrationResult calibrate_cuda_device(const CudaCalibration& what, const ClusterSpec& base,
                                            const std::string& base_name) {
  check_sizes(what);
  if (cuda::device_count() == 0)
    throw std::runtime_error("--calibrate --device cuda: no CUDA device is visible (the driver reports none); "
                             "nothing was measured");
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  const auto h = static_cast<cublasHandle_t>(cuda::cublas_handle());
  CudaCalibrationResult r;
  nlohmann::json& m = r.measurements;
  m = {{"device", prop.name}, {"sizes", what.sizes}, {"ns_steps", what.ns_steps}, {"copy_bytes", what.copy_bytes}};
  time_sizes(what, h, m);
  double copy_ms = 0;
  ClusterSpec& c = r.cluster;
  c = base;
  c.name = std::string(prop.name) + " (calibrated)";
  c.cores_per_node = 0;
  c.mem_GBps = copy_GBps(what.copy_bytes, copy_ms);
  m["copy_ms"] = copy_ms;
  c.memory_gb = static_cast<double>(prop.totalGlobalMem) / 1e9;
  c.launch_us = m["launch_us"].get<double>();
  c.gemm_tflops_bf16 = rate_curve(what.sizes, m["gemm_bf16_ms"].get<std::vector<double>>(), c.gemm_curve_bf16);
  c.gemm_tflops_f32 = rate_curve(what.sizes, m["gemm_f32_ms"].get<std::vector<double>>(), c.gemm_curve_f32);
  const std::vector<double> eff = ns_efficiency(c, what.sizes, m["ns_ms"].get<std::vector<double>>(), what.ns_steps);
  m["ns_efficiency"] = eff;
  c.ns_efficiency = median(eff);
  const std::string kept = "intra_GBps, inter_GBps, intra_latency_us, inter_latency_us, linear_latency, "
                           "model_efficiency, reserve_gb, gpus_per_node";
  m["not_measured"] = kept + " (from " + (base_name.empty() ? std::string("the defaults") : base_name) + ")";
  c.source = std::string("measured on ") + prop.name +
             " by mfsdp-project --calibrate --device cuda: gemm_tflops_* the best rate of square cuBLAS " +
             "GEMMs (bf16: cublasGemmEx, bf16 in and out, f32 accumulation; f32: cublasSgemm, FP32 math, " +
             "no TF32), gemm_curve_* each size's rate / that best, launch_us the wall time per " +
             "back-to-back 32^3 GEMM, ns_efficiency the median over sizes of predicted / measured bf16 " +
             "Newton-Schulz GEMM time, mem_GBps a device-to-device copy (read + write bytes), memory_gb " +
             "the device's total. Not measured: " + m["not_measured"].get<std::string>() + ".";
  return r;
}

}  // namespace mfsdp
