// Device-dispatching optimizer entry points on Tensors: the engine calls these on the pieces a rank
// owns and never picks a CPU or CUDA function itself. Every tensor of one call lives on one device
// (CPU: the *_cpu kernels; CUDA: the *_cuda kernels on the shared compute context of
// runtime/cuda/device_api.h). Tensors are contiguous f32 views; shapes are given explicitly where
// a flat view stands for a matrix.
#pragma once
#include <cstdint>

#include "optim/adamw.h"
#include "optim/exact_sum.h"
#include "optim/muon.h"
#include "runtime/tensor.h"

namespace mfsdp {

/// Muon phase 1 (momentum): M <- beta*M + (1-beta)*G; U = nesterov ? (1-beta)*G + beta*M : M.
/// G, M, U: the same numel (U may alias G). Throws std::invalid_argument on mismatched tensors.
void muon_momentum(const Tensor& G, const Tensor& M, const Tensor& U, const MuonOptions& opt);

/// Muon phase 2 (orthogonalize): O = NS(U) of a [rows, cols] matrix taken as `blocks` row blocks
/// of rows/blocks rows each (split_qkv), each orthogonalized separately (O may alias U).
/// Counts one Newton-Schulz call per block.
void muon_orthogonalize(const Tensor& U, const Tensor& O, int64_t rows, int64_t cols, int64_t blocks,
                        const MuonOptions& opt);

/// Muon phase 3 (apply): W <- W*(1 - lr*wd) - lr*scale*O over W's elements (O: the same numel).
void muon_apply(const Tensor& W, const Tensor& O, double lr, double scale, double weight_decay);

/// A whole Muon step on one [rows, cols] matrix held by one rank: the three phases with private
/// scratch, same arithmetic as muon_step_cpu (W, G, M: rows*cols elements each).
void muon_step(const Tensor& W, const Tensor& G, const Tensor& M, int64_t rows, int64_t cols, double lr,
               const MuonOptions& opt, int qkv_blocks);

/// One AdamW step over p's elements (g, m, v: the same numel); `step` is 1-based.
void adamw_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, double lr, int64_t step,
                const AdamWOptions& opt);

/// Adds the exact squares of x's elements to `acc` (the same integer state on CPU and CUDA).
void add_sum_of_squares(const Tensor& x, ExactSum& acc);

}  // namespace mfsdp
