// Device-dispatching optimizer entry points on Tensors: the engine calls these on the pieces a rank
// owns and never picks a CPU or CUDA function itself. Every tensor of one call lives on one device
// (CPU: the *_cpu kernels; CUDA: the *_cuda kernels on the shared compute context of
// runtime/cuda/device_api.h). Tensors are contiguous f32 views; shapes are given explicitly where
// a flat view stands for a matrix.
#pragma once
#include <cstdint>
#include <vector>

#include "optim/adamw.h"
#include "optim/exact_sum.h"
#include "optim/muon.h"
#include "runtime/tensor.h"

namespace mfsdp {

/// Muon phase 1 (momentum): M <- beta*M + (1-beta)*G; U = nesterov ? (1-beta)*G + beta*M : M.
/// G, M, U: the same numel (U may alias G). Throws std::invalid_argument on mismatched tensors.
void muon_momentum(const Tensor& G, const Tensor& M, const Tensor& U, const MuonOptions& opt);

/// Muon phase 2 (orthogonalize): O = polar(U) by opt.orthogonalizer (optim/orthogonalize.h) of a
/// [rows, cols] matrix taken as `blocks` row blocks of rows/blocks rows each (split_qkv or
/// split_heads), each orthogonalized separately (O may alias U). CPU: orthogonalize_strided_cpu;
/// CUDA: Newton-Schulz only, all blocks in one strided-batched bf16 GEMM chain. Callers batch
/// same-shape matrices by laying them out contiguously as blocks of one tall matrix (the engine
/// does so for an owner's same-shape Muon matrices). Counts one orthogonalization per block. Throws std::invalid_argument
/// when blocks does not divide rows, on mismatched tensors, or for an orthogonalizer other than
/// newton_schulz5 on CUDA tensors.
void muon_orthogonalize(const Tensor& U, const Tensor& O, int64_t rows, int64_t cols, int64_t blocks,
                        const MuonOptions& opt);

/// NorMuon phase (between orthogonalize and apply): normuon_normalize_cpu (optim/normuon.h, arXiv
/// 2510.05491 Algorithm 1) on each of the `blocks` row blocks of O [rows, cols] with its slice of
/// the per-row state v [rows] (opt.beta2, opt.normuon_eps, update RMS kNorMuonUpdateRms); apply the
/// result with scale 1. Throws std::invalid_argument on mismatched tensors and for CUDA tensors
/// (the CUDA kernels implement variant muon only).
void normuon_normalize(const Tensor& O, const Tensor& v, int64_t rows, int64_t cols, int64_t blocks,
                       const MuonOptions& opt);

/// Muon phase 3 (apply): W <- W*(1 - lr*wd) - lr*scale*O over W's elements (O: the same numel).
void muon_apply(const Tensor& W, const Tensor& O, double lr, double scale, double weight_decay);

/// A whole Muon step on one [rows, cols] matrix held by one rank: the three phases with private
/// scratch, same arithmetic as muon_step_cpu (W, G, M: rows*cols elements each). Variant muon
/// only; CUDA tensors: newton_schulz5 only (std::invalid_argument otherwise).
void muon_step(const Tensor& W, const Tensor& G, const Tensor& M, int64_t rows, int64_t cols, double lr,
               const MuonOptions& opt, int qkv_blocks);

/// One AdamW step over p's elements (g, m, v: the same numel); `step` is 1-based.
void adamw_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, double lr, int64_t step,
                const AdamWOptions& opt);

/// Adds the exact squares of x's elements to `acc` (the same integer state on CPU and CUDA).
void add_sum_of_squares(const Tensor& x, ExactSum& acc);
/// Adds the exact squares of every tensor's elements to `acc` (all f32 on one device; undefined
/// or empty tensors add nothing). CPU: one tensor after another, as add_sum_of_squares on each;
/// CUDA: one kernel launch and one device->host copy for all of them. The same integer state
/// either way, so the value is bitwise the one of any other split.
void add_sum_of_squares(const std::vector<Tensor>& xs, ExactSum& acc);

}  // namespace mfsdp
