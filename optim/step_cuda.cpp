// The CUDA side of optim/step.h (built with CUDA; step_cuda_stub.cpp otherwise): the kernels of
// optim_cuda.h on the process's one compute context (runtime/cuda/device_api.h).
#include "optim/step_cuda.h"

#include "optim/optim_cuda.h"
#include "runtime/cuda/device_api.h"

namespace mfsdp::cuda_step {
namespace {

cudaStream_t stream() { return static_cast<cudaStream_t>(cuda::compute_stream()); }
cublasHandle_t handle() { return static_cast<cublasHandle_t>(cuda::cublas_handle()); }
// Newton-Schulz scratch of the shared context: grown to the largest matrix, then reused every step.
MuonCudaWorkspace& workspace() {
  static MuonCudaWorkspace* ws = new MuonCudaWorkspace();  // never destroyed (see cuda_kernels())
  return *ws;
}

}  // namespace

void muon_momentum(const Tensor& G, const Tensor& M, const Tensor& U, const MuonOptions& opt) {
  muon_momentum_cuda(G.data_f32(), M.data_f32(), U.data_f32(), G.numel(), opt, stream());
}

void muon_orthogonalize(const Tensor& U, const Tensor& O, int64_t blocks, int64_t brows, int64_t cols,
                        const MuonOptions& opt) {
  newton_schulz_batched_cuda(U.data_f32(), O.data_f32(), blocks, brows, cols, opt.ns_steps, stream(), handle(),
                             &workspace());
}

void muon_apply(const Tensor& W, const Tensor& O, double lr, double scale, double weight_decay) {
  muon_apply_update_cuda(W.data_f32(), O.data_f32(), W.numel(), lr, scale, weight_decay, stream());
}

void muon_step(const Tensor& W, const Tensor& G, const Tensor& M, int64_t rows, int64_t cols, double lr,
               const MuonOptions& opt, int qkv_blocks) {
  muon_step_cuda(W.data_f32(), G.data_f32(), M.data_f32(), rows, cols, lr, opt, qkv_blocks, stream(), handle(),
                 &workspace());
}

void adamw_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, double lr, int64_t step,
                const AdamWOptions& opt) {
  adamw_step_cuda(p.data_f32(), g.data_f32(), m.data_f32(), v.data_f32(), p.numel(), lr, step, opt, stream());
}

void add_sum_of_squares(const Tensor& x, ExactSum& acc) {
  exact_sum_of_squares_cuda(x.data_f32(), x.numel(), acc, stream());
}

void add_sum_of_squares(const std::vector<const Tensor*>& xs, ExactSum& acc) {
  std::vector<const float*> ptrs;
  std::vector<int64_t> ns;
  for (const Tensor* x : xs) {
    ptrs.push_back(x->data_f32());
    ns.push_back(x->numel());
  }
  exact_sum_of_squares_cuda(ptrs, ns, acc, stream());
}

}  // namespace mfsdp::cuda_step
