// optim/step_cuda.h when MatrixFSDP is built without CUDA: every call throws.
#include <stdexcept>
#include <string>

#include "optim/step_cuda.h"

namespace mfsdp::cuda_step {
namespace {

[[noreturn]] void no_cuda(const char* op) {
  throw std::runtime_error(std::string("[") + op + "] CUDA tensors, but MatrixFSDP was built without CUDA");
}

}  // namespace

void muon_momentum(const Tensor&, const Tensor&, const Tensor&, const MuonOptions&) { no_cuda("muon_momentum"); }
void muon_orthogonalize(const Tensor&, const Tensor&, int64_t, int64_t, int64_t, const MuonOptions&) {
  no_cuda("muon_orthogonalize");
}
void muon_apply(const Tensor&, const Tensor&, double, double, double) { no_cuda("muon_apply"); }
void muon_step(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, double, const MuonOptions&, int) {
  no_cuda("muon_step");
}
void adamw_step(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double, int64_t, const AdamWOptions&) {
  no_cuda("adamw_step");
}
void add_sum_of_squares(const Tensor&, ExactSum&) { no_cuda("add_sum_of_squares"); }
void add_sum_of_squares(const std::vector<const Tensor*>&, ExactSum&) { no_cuda("add_sum_of_squares"); }

}  // namespace mfsdp::cuda_step
