// The CUDA side of the tensor-level optimizer calls (optim/step.h): each function does the device
// work of its namesake on CUDA tensors that step.cpp has already checked (f32, one device, the
// expected element counts). step_cuda.cpp when MatrixFSDP is built with CUDA; otherwise
// step_cuda_stub.cpp, whose every call throws std::runtime_error("... built without CUDA"). CMake
// (optim/CMakeLists.txt) compiles exactly one of them.
#pragma once
#include <cstdint>
#include <vector>

#include "optim/adamw.h"
#include "optim/exact_sum.h"
#include "optim/muon.h"
#include "runtime/tensor.h"

namespace mfsdp::cuda_step {

void muon_momentum(const Tensor& G, const Tensor& M, const Tensor& U, const MuonOptions& opt);
/// Newton-Schulz on `blocks` row blocks of [brows, cols] each.
void muon_orthogonalize(const Tensor& U, const Tensor& O, int64_t blocks, int64_t brows, int64_t cols,
                        const MuonOptions& opt);
void muon_apply(const Tensor& W, const Tensor& O, double lr, double scale, double weight_decay);
void muon_step(const Tensor& W, const Tensor& G, const Tensor& M, int64_t rows, int64_t cols, double lr,
               const MuonOptions& opt, int qkv_blocks);
void adamw_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, double lr, int64_t step,
                const AdamWOptions& opt);
/// Adds the squares of every element of `x` / of every tensor of `xs` (non-empty f32 CUDA tensors,
/// one kernel for all of them) to `acc`.
void add_sum_of_squares(const Tensor& x, ExactSum& acc);
void add_sum_of_squares(const std::vector<const Tensor*>& xs, ExactSum& acc);

}  // namespace mfsdp::cuda_step
