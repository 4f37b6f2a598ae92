// CUDA Muon / AdamW on device pointers (included only by sources CMake compiles with CUDA). Same math as the CPU
// kernels: f32 momentum / normalization, Newton-Schulz iterations as cuBLAS bf16 GEMMs with f32
// accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F), elementwise kernels for everything else.
// Every call is asynchronous on `stream` unless stated; all pointers are device pointers on the
// current device. Errors (CUDA or cuBLAS status) throw std::runtime_error naming the call.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "optim/adamw.h"
#include "optim/exact_sum.h"
#include "optim/muon.h"

namespace mfsdp {

/// Device scratch for Newton-Schulz / Muon, grown on demand and reused across calls (owner-buffer
/// pinning: no allocation per step once warm). Not thread safe; use one per stream.
class MuonCudaWorkspace {
 public:
  MuonCudaWorkspace() = default;
  ~MuonCudaWorkspace();
  MuonCudaWorkspace(const MuonCudaWorkspace&) = delete;
  MuonCudaWorkspace& operator=(const MuonCudaWorkspace&) = delete;

  /// Ensures room for a Muon step on a [rows, cols] matrix, or for Newton-Schulz on `batch` of
  /// them at once (synchronizes the device when it grows).
  void reserve(int64_t rows, int64_t cols, int64_t batch = 1);
  /// Bytes of device memory currently held.
  int64_t bytes() const { return bytes_; }

  float* update = nullptr;      ///< [rows*cols] f32: the Muon input U, then the f32 NS output
  void* x = nullptr;            ///< [batch*m*n] bf16 iterates
  void* y = nullptr;            ///< [batch*m*n] bf16 next iterates
  void* a = nullptr;            ///< [batch*m*m] bf16 Gram matrices A = X X^T
  void* b = nullptr;            ///< [batch*m*m] bf16 B = b*A + c*A A
  double* partial = nullptr;    ///< [kPartials] f64 per-block partial sums of squares
  float* inv_norm = nullptr;    ///< [batch] f32 1 / (||U_i||_F + 1e-7)
  static constexpr int kPartials = 1024;

 private:
  void release();
  int64_t numel_ = 0, mn_ = 0, mm_ = 0, bytes_ = 0, batch_ = 0;
};

/// Newton-Schulz on device: G, out [rows, cols] row-major f32 (out may equal G). Normalizes in f32
/// (deterministic f64 reduction of ||G||_F), then `steps` quintic iterations in bf16 GEMMs with
/// f32 accumulation, transposing when rows > cols. `ws` may be null (a temporary is used, then the
/// stream is synchronized before it is freed). Increments newton_schulz_call_count().
void newton_schulz_cuda(const float* G, float* out, int64_t rows, int64_t cols, int steps,
                        cudaStream_t stream, cublasHandle_t handle, MuonCudaWorkspace* ws = nullptr);

/// Newton-Schulz of `batch` contiguous [rows, cols] row-major f32 matrices (G and out hold
/// batch*rows*cols values, matrix i at i*rows*cols; out may equal G): each normalized by its own
/// f32 norm, then one chain of strided-batched bf16 GEMMs (cublasGemmStridedBatchedEx, f32
/// accumulation) for the whole batch, with no padding. Same per-matrix arithmetic as
/// newton_schulz_cuda; counts `batch` calls. Throws std::invalid_argument on bad sizes.
void newton_schulz_batched_cuda(const float* G, float* out, int64_t batch, int64_t rows, int64_t cols, int steps,
                                cudaStream_t stream, cublasHandle_t handle, MuonCudaWorkspace* ws = nullptr);

/// One Muon step on device, same contract as muon_step_cpu (W, G, M: [rows, cols] row-major f32).
void muon_step_cuda(float* W, const float* G, float* M, int64_t rows, int64_t cols, double lr,
                    const MuonOptions& opt, int qkv_blocks, cudaStream_t stream, cublasHandle_t handle,
                    MuonCudaWorkspace* ws = nullptr);

/// The elementwise phases of a Muon step on device (same contracts as muon_momentum_cpu and
/// muon_apply_update_cpu; G, M, U, W, O: n f32 device values each). Asynchronous on `stream`.
void muon_momentum_cuda(const float* G, float* M, float* U, int64_t n, const MuonOptions& opt, cudaStream_t stream);
void muon_apply_update_cuda(float* W, const float* O, int64_t n, double lr, double scale, double weight_decay,
                            cudaStream_t stream);

/// One AdamW step on device over n f32 elements, same contract as adamw_step_cpu.
void adamw_step_cuda(float* p, const float* g, float* m, float* v, int64_t n, double lr, int64_t step,
                     const AdamWOptions& opt, cudaStream_t stream);

/// Adds x[i]^2 for i in [0, n) exactly into `acc` (x: device pointer): the same integer state as
/// exact_sum_of_squares_cpu, so acc.value() is bitwise identical to the CPU result. Each element's
/// exact square is split into 32-bit digits and summed with integer atomics (exact and
/// commutative: the result does not depend on scheduling). Non-finite inputs set acc's NaN / +Inf
/// flags. Synchronizes `stream` (returns without touching it when n == 0). Throws
/// std::invalid_argument for n < 0 or a null x with n > 0.
void exact_sum_of_squares_cuda(const float* x, int64_t n, ExactSum& acc, cudaStream_t stream);

/// exact_sum_of_squares_cuda over several device buffers (xs[i] with ns[i] elements) in one kernel
/// launch, one device->host copy and one synchronization: the same state as one call per buffer
/// (integer sums). Returns without touching `stream` when every buffer is empty. Throws
/// std::invalid_argument for mismatched lists, a negative length or a null buffer of length > 0.
void exact_sum_of_squares_cuda(const std::vector<const float*>& xs, const std::vector<int64_t>& ns, ExactSum& acc,
                               cudaStream_t stream);

namespace detail {
/// exact_sum_of_squares_cuda with an explicit per-launch element count (1 <= chunk <= 2^28; the
/// public entry uses 2^28). Exposed so tests can exercise the multi-chunk merge on small inputs.
void exact_sum_of_squares_cuda_chunked(const float* x, int64_t n, ExactSum& acc, int64_t chunk,
                                       cudaStream_t stream);
}  // namespace detail

}  // namespace mfsdp
