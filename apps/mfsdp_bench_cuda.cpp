// mfsdp-bench-cuda: a short timing table of the CUDA backend against the CPU backend, for
// scripts/gpu_check.sh. GEMM GFLOP/s (sizes written M x K x N: C[M,N] = A[M,K] B[K,N], 2MNK flops),
// causal attention forward/backward (GPT-2 small shapes), and Newton-Schulz on a 768 x 3072 matrix
// (optim/optim_cuda.h, bf16 GEMMs) vs newton_schulz_cpu, the batched chain against the cuBLAS
// GEMM rate, and 64 same-shape experts grouped against one call each. CUDA times use cudaEvents on the legacy
// default stream (median of the repetitions); CPU times use steady_clock.
// Usage: mfsdp-bench-cuda [--quick]   (--quick: fewer repetitions)
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "apps/bench/cuda_timing.h"
#include "optim/muon.h"
#include "optim/optim_cuda.h"
#include "runtime/cuda/device_api.h"
#include "runtime/cuda/gemm_bf16.h"
#include "runtime/kernels.h"
#include "runtime/ops.h"
#include "runtime/tensor.h"

using namespace mfsdp;

namespace {

using cuda_timing::check;

Tensor random_tensor(int64_t n, Device dev, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return Tensor::from_vector(v, {n}, dev);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Median milliseconds of `fn` on the GPU after `warmup` untimed calls (apps/bench/cuda_timing.h).
double time_cuda(const std::function<void()>& fn, int warmup, int reps) { return cuda_timing::median_ms(fn, warmup, reps); }

/// Median milliseconds of `fn` on the host after one untimed call.
double time_cpu(const std::function<void()>& fn, int reps) {
  fn();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(ms);
}

void row(const char* op, const std::string& shape, double cuda_ms, double cpu_ms, double gflop) {
  auto rate = [&](double ms) { return ms > 0 && gflop > 0 ? gflop / (ms * 1e-3) : 0.0; };
  std::printf("%-26s %-22s %10.3f %12.1f %10.3f %12.1f %8.1fx\n", op, shape.c_str(), cuda_ms, rate(cuda_ms), cpu_ms,
              rate(cpu_ms), cuda_ms > 0 ? cpu_ms / cuda_ms : 0.0);
}


/// Repetition counts of the timed loops: `reps` on the GPU, `cpu_reps` on the host.
struct Reps {
  int reps, cpu_reps;
};

// GEMM (f32, no TF32), CUDA vs CPU.
void bench_gemm_f32(Kernels& G, Kernels& C, Reps n) {
  struct Dims { int64_t M, K, N; };
  for (Dims d : {Dims{768, 768, 3072}, Dims{256, 768, 50304}, Dims{4096, 768, 768}}) {
    Tensor ag = random_tensor(d.M * d.K, Device::CUDA, 1), bg = random_tensor(d.K * d.N, Device::CUDA, 2);
    Tensor cg = Tensor::zeros({d.M * d.N}, DType::f32, Device::CUDA);
    Tensor ac = ag.to(Device::CPU), bc = bg.to(Device::CPU), cc = cg.to(Device::CPU);
    const double gflop = 2.0 * d.M * d.N * d.K * 1e-9;
    const double g = time_cuda([&] { G.gemm(false, false, d.M, d.N, d.K, 1.0f, ag.data_f32(), bg.data_f32(), 0.0f, cg.data_f32()); }, 3, n.reps);
    const double c = time_cpu([&] { C.gemm(false, false, d.M, d.N, d.K, 1.0f, ac.data_f32(), bc.data_f32(), 0.0f, cc.data_f32()); }, n.cpu_reps);
    row("gemm f32 (NN)", std::to_string(d.M) + "x" + std::to_string(d.K) + "x" + std::to_string(d.N), g, c, gflop);
  }
}

// GEMM bf16 operands, f32 accumulation and output: the linear layers' x W^T (NT) at GPT-2 124M,
// B*T = 16384 rows (qkv, MLP up, MLP down), cuBLASLt (the backend's path) vs cublasGemmEx.
void bench_gemm_bf16(Kernels& G, Reps n) {
  struct Dims { int64_t M, K, N; };
  for (Dims d : {Dims{16384, 768, 2304}, Dims{16384, 768, 3072}, Dims{16384, 3072, 768}}) {
    Tensor ag = random_tensor(d.M * d.K, Device::CUDA, 3).to(DType::bf16);
    Tensor bg = random_tensor(d.N * d.K, Device::CUDA, 4).to(DType::bf16);
    Tensor cg = Tensor::zeros({d.M * d.N}, DType::f32, Device::CUDA);
    const double gflop = 2.0 * d.M * d.N * d.K * 1e-9;
    const double lt = time_cuda([&] {
      G.gemm_bf16(false, true, d.M, d.N, d.K, 1.0f, ag.data_ptr(), bg.data_ptr(), 0.0f, cg.data_f32());
    }, 3, n.reps);
    const double ex = time_cuda([&] {
      cuda_gemm::gemm_bf16_gemmex(false, true, d.M, d.N, d.K, 1.0f, ag.data_ptr(), bg.data_ptr(), 0.0f, cg.data_f32());
    }, 3, n.reps);
    std::printf("gemm bf16->f32 (NT) %ldx%ldx%ld: cuBLASLt %.3f ms %.1f TFLOP/s | cublasGemmEx %.3f ms %.1f TFLOP/s\n",
                static_cast<long>(d.M), static_cast<long>(d.K), static_cast<long>(d.N), lt, gflop / lt, ex, gflop / ex);
  }
}

// Causal attention, GPT-2 small (B=4, T=1024, C=768, H=12): the probs-materialising kernels and the
// fused (flash) ones, CUDA vs CPU.
void bench_attention(Kernels& G, Kernels& C, Reps n) {
  const int64_t B = 4, T = 1024, Cd = 768, H = 12, d = Cd / H;
  Tensor qkv = random_tensor(B * T * 3 * Cd, Device::CUDA, 3);
  Tensor out = Tensor::empty({B * T * Cd}, DType::f32, Device::CUDA);
  Tensor probs = Tensor::empty({B * H * T * T}, DType::f32, Device::CUDA);
  Tensor dout = random_tensor(B * T * Cd, Device::CUDA, 4);
  Tensor dqkv = Tensor::zeros({B * T * 3 * Cd}, DType::f32, Device::CUDA);
  Tensor qkv_c = qkv.to(Device::CPU), out_c = out.to(Device::CPU), probs_c = probs.to(Device::CPU);
  Tensor dout_c = dout.to(Device::CPU), dqkv_c = dqkv.to(Device::CPU);
  const double fwd_gflop = 2.0 * 2.0 * B * H * T * T * d * 1e-9;  // q k^T and P v (full T x T)
  const double bwd_gflop = 2.0 * fwd_gflop;                        // dP, dV, dQ, dK
  const std::string shape = "B4 T1024 C768 H12";
  auto fwd_g = [&] { G.attention_forward(qkv.data_f32(), out.data_f32(), probs.data_f32(), B, T, Cd, H); };
  auto fwd_c = [&] { C.attention_forward(qkv_c.data_f32(), out_c.data_f32(), probs_c.data_f32(), B, T, Cd, H); };
  row("attention forward", shape, time_cuda(fwd_g, 2, n.reps), time_cpu(fwd_c, n.cpu_reps), fwd_gflop);
  auto bwd_g = [&] { G.attention_backward(dout.data_f32(), qkv.data_f32(), probs.data_f32(), dqkv.data_f32(), B, T, Cd, H); };
  auto bwd_c = [&] { C.attention_backward(dout_c.data_f32(), qkv_c.data_f32(), probs_c.data_f32(), dqkv_c.data_f32(), B, T, Cd, H); };
  row("attention backward", shape, time_cuda(bwd_g, 2, n.reps), time_cpu(bwd_c, n.cpu_reps), bwd_gflop);
  // fused (flash): lse [B,H,T] instead of probs; the same rate formula (full T x T) for comparison
  const Kernels::AttentionDims a{B, T, H, H, d, 3 * Cd, 3 * Cd};
  Tensor lse = Tensor::empty({B * H * T}, DType::f32, Device::CUDA), lse_c = lse.to(Device::CPU);
  const float *q = qkv.data_f32(), *q_c = qkv_c.data_f32();
  float *dq = dqkv.data_f32(), *dq_c = dqkv_c.data_f32();
  auto ffwd_g = [&] { G.flash_attention_forward(q, q + Cd, q + 2 * Cd, out.data_f32(), lse.data_f32(), a); };
  auto ffwd_c = [&] { C.flash_attention_forward(q_c, q_c + Cd, q_c + 2 * Cd, out_c.data_f32(), lse_c.data_f32(), a); };
  row("fused attention forward", shape, time_cuda(ffwd_g, 2, n.reps), time_cpu(ffwd_c, n.cpu_reps), fwd_gflop);
  auto fbwd_g = [&] {
    G.flash_attention_backward(dout.data_f32(), q, q + Cd, q + 2 * Cd, out.data_f32(), lse.data_f32(), dq, dq + Cd,
                               dq + 2 * Cd, a);
  };
  auto fbwd_c = [&] {
    C.flash_attention_backward(dout_c.data_f32(), q_c, q_c + Cd, q_c + 2 * Cd, out_c.data_f32(), lse_c.data_f32(),
                               dq_c, dq_c + Cd, dq_c + 2 * Cd, a);
  };
  row("fused attention backward", shape, time_cuda(fbwd_g, 2, n.reps), time_cpu(fbwd_c, n.cpu_reps), bwd_gflop);
}

// LayerNorm + GELU + cross-entropy at GPT-2 small shapes (memory-bound; CUDA ms only).
void bench_memory_bound(Kernels& G, Reps n) {
  const int64_t N = 4096, Cd = 768, V = 50257, Vp = 50304;
  Tensor x = random_tensor(N * Cd, Device::CUDA, 5), w = random_tensor(Cd, Device::CUDA, 6), b = random_tensor(Cd, Device::CUDA, 7);
  Tensor y = Tensor::empty({N * Cd}, DType::f32, Device::CUDA), st = Tensor::empty({2 * N}, DType::f32, Device::CUDA);
  row("layernorm forward", "4096x768", time_cuda([&] {
        G.layernorm_forward(x.data_f32(), w.data_f32(), b.data_f32(), y.data_f32(), st.data_f32(), st.data_f32() + N, N, Cd, 1e-5f);
      }, 2, n.reps), 0.0, 0.0);
  Tensor h = random_tensor(N * 4 * Cd, Device::CUDA, 8), hy = Tensor::empty({N * 4 * Cd}, DType::f32, Device::CUDA);
  row("gelu forward", "4096x3072", time_cuda([&] { G.gelu_forward(h.data_f32(), hy.data_f32(), N * 4 * Cd); }, 2, n.reps), 0.0, 0.0);
  const int64_t Nl = 1024;
  Tensor logits = random_tensor(Nl * Vp, Device::CUDA, 9);
  std::vector<int32_t> ids(Nl);
  for (int64_t i = 0; i < Nl; ++i) ids[i] = static_cast<int32_t>((i * 7919) % V);
  Tensor tg = tokens_tensor(ids, {Nl}, Device::CUDA);
  Tensor losses = Tensor::empty({Nl}, DType::f32, Device::CUDA), dl = Tensor::zeros({Nl * Vp}, DType::f32, Device::CUDA);
  row("cross-entropy fwd+bwd", "1024x50304", time_cuda([&] {
        G.cross_entropy_forward(logits.data_f32(), tg.data<int32_t>(), losses.data_f32(), Nl, V, Vp);
        G.cross_entropy_backward(logits.data_f32(), tg.data<int32_t>(), 1.0f, dl.data_f32(), Nl, V, Vp);
      }, 2, n.reps), 0.0, 0.0);
}

constexpr int kNsSteps = 5;

// Newton-Schulz 768 x 3072 (5 steps): CUDA bf16 GEMMs vs CPU f32, and the largest difference.
void bench_newton_schulz(cublasHandle_t handle, MuonCudaWorkspace& ws, Reps n) {
  const int64_t rows = 768, cols = 3072;
  const double m = std::min(rows, cols), k = std::max(rows, cols);
  const double gflop = kNsSteps * (2 * m * m * k + 2 * m * m * m + 2 * m * m * k) * 1e-9;
  Tensor g = random_tensor(rows * cols, Device::CUDA, 10), o = Tensor::empty({rows * cols}, DType::f32, Device::CUDA);
  Tensor gc = g.to(Device::CPU), oc = Tensor::empty({rows * cols}, DType::f32, Device::CPU);
  const double t_gpu = time_cuda([&] { newton_schulz_cuda(g.data_f32(), o.data_f32(), rows, cols, kNsSteps, 0, handle, &ws); }, 2, n.reps);
  const double t_cpu = time_cpu([&] { newton_schulz_cpu(gc.data_f32(), oc.data_f32(), rows, cols, kNsSteps); }, n.cpu_reps);
  row("newton-schulz (5 steps)", "768x3072", t_gpu, t_cpu, gflop);
  const auto a = o.to_vector(), r = oc.to_vector();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - r[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(r[i])));
  }
  std::printf("newton-schulz cuda (bf16) vs cpu (f32): max|diff| / max|cpu| = %.3e\n", diff / scale);
}

// Batched bf16 Newton-Schulz on 4 x [4096, 4096] against the cuBLAS bf16 GEMM rate of the same run
// (4096^3, bf16 in and out, f32 accumulation): the target is at least 60%.
void bench_newton_schulz_batched(cublasHandle_t handle, MuonCudaWorkspace& ws, Reps n) {
  const int64_t N = 4096, batch = 4;
  const double gemm_gflop = 2.0 * N * N * N * 1e-9, ns_gflop = batch * kNsSteps * 3 * gemm_gflop;
  Tensor a16 = random_tensor(N * N, Device::CUDA, 11).to(DType::bf16), c16 = Tensor::empty({N * N}, DType::bf16, Device::CUDA);
  const float one = 1.0f, zero = 0.0f;
  const double t_gemm = time_cuda([&] {
    if (cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, N, N, N, &one, a16.data_ptr(), CUDA_R_16BF, N, a16.data_ptr(),
                     CUDA_R_16BF, N, &zero, c16.data_ptr(), CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error("[bench] cublasGemmEx failed");
  }, 3, n.reps);
  Tensor gb = random_tensor(batch * N * N, Device::CUDA, 12);
  const double t_ns = time_cuda([&] {
    newton_schulz_batched_cuda(gb.data_f32(), gb.data_f32(), batch, N, N, kNsSteps, 0, handle, &ws);
  }, 1, std::max(1, n.reps / 4));
  const double gemm_rate = gemm_gflop / (t_gemm * 1e-3), ns_rate = ns_gflop / (t_ns * 1e-3);
  std::printf("cuBLAS bf16 GEMM 4096^3: %.3f ms, %.1f TFLOP/s | batched bf16 Newton-Schulz 4 x 4096x4096 "
              "(5 steps): %.3f ms, %.1f TFLOP/s = %.0f%% of the GEMM rate (target >= 60%%)\n",
              t_gemm, gemm_rate * 1e-3, t_ns, ns_rate * 1e-3, 100 * ns_rate / gemm_rate);
}

// The grouped Newton-Schulz of a Mixture-of-Experts owner: 64 same-shape expert matrices [256, 512]
// (bf16, 5 steps) as one strided-batched chain against 64 one-matrix calls (the per-matrix loop
// that is launch-bound at these sizes), with the largest difference between the two.
void bench_newton_schulz_experts(cublasHandle_t handle, MuonCudaWorkspace& ws, Reps n) {
  const int64_t batch = 64, rows = 256, cols = 512, numel = rows * cols;
  const double gflop = batch * kNsSteps * (4.0 * rows * rows * cols + 2.0 * rows * rows * rows) * 1e-9;
  Tensor g = random_tensor(batch * numel, Device::CUDA, 13);
  Tensor grouped = Tensor::empty({batch * numel}, DType::f32, Device::CUDA), looped = Tensor::empty({batch * numel}, DType::f32, Device::CUDA);
  const double t_grouped = time_cuda([&] {
    newton_schulz_batched_cuda(g.data_f32(), grouped.data_f32(), batch, rows, cols, kNsSteps, 0, handle, &ws);
  }, 2, n.reps);
  const double t_looped = time_cuda([&] {
    for (int64_t b = 0; b < batch; ++b)
      newton_schulz_cuda(g.data_f32() + b * numel, looped.data_f32() + b * numel, rows, cols, kNsSteps, 0, handle, &ws);
  }, 2, n.reps);
  const auto a = grouped.to_vector(), r = looped.to_vector();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - r[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(r[i])));
  }
  std::printf("grouped Newton-Schulz, 64 experts x 256x512 (bf16, 5 steps): one batched chain %.3f ms (%.1f TFLOP/s), "
              "64 one-matrix calls %.3f ms (%.1f TFLOP/s): %.2fx; max|diff| / max = %.1e\n",
              t_grouped, gflop / t_grouped, t_looped, gflop / t_looped, t_looped / t_grouped, diff / scale);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const Reps n{quick ? 5 : 20, quick ? 1 : 3};
  if (cuda::device_count() == 0) {
    std::printf("no CUDA device: nothing to benchmark\n");
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s (sm_%d%d, %d SMs, %.1f GiB); CPU threads: %d\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.totalGlobalMem / double(1 << 30), cpu_threads());
  std::printf("%-26s %-22s %10s %12s %10s %12s %9s\n", "op", "shape", "cuda ms", "cuda GFLOP/s", "cpu ms",
              "cpu GFLOP/s", "speedup");
  Kernels& G = kernels(Device::CUDA);
  Kernels& C = kernels(Device::CPU);
  bench_gemm_f32(G, C, n);
  bench_gemm_bf16(G, n);
  bench_attention(G, C, n);
  bench_memory_bound(G, n);
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("[bench] cublasCreate failed");
  MuonCudaWorkspace ws;
  bench_newton_schulz(handle, ws, n);
  bench_newton_schulz_batched(handle, ws, n);
  bench_newton_schulz_experts(handle, ws, n);
  cublasDestroy(handle);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return 0;
}
