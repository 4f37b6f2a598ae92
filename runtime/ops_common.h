// Helpers shared by the op files (ops.cpp, ops_mlp.cpp): argument checks and the GEMM calls every
// matmul op makes. Internal to runtime/.
#pragma once
#include <cstdint>

#include "runtime/kernels.h"
#include "runtime/tensor.h"

namespace mfsdp::ops_detail {

/// Throws std::invalid_argument "[op] what ..." unless t is a defined f32 tensor.
void check_f32(const Tensor& t, const char* op, const char* what);
/// Throws unless t is f32, or bf16 while matmuls run in bf16 (an activation that only feeds GEMMs,
/// written in bf16 by its producer: layer_norm's bf16 output).
void check_matmul_input(const Tensor& t, const char* op, const char* what);
/// t as a GEMM operand: bf16 under bf16 matmuls (t itself when it is bf16 already, else rounded
/// once), t itself under f32 matmuls.
Tensor matmul_operand(const Tensor& t, bool half);
/// Throws std::invalid_argument unless b is undefined or on a's device.
void check_same_device(const Tensor& a, const Tensor& b, const char* op);
/// The checks of y = x W^T + b: tensors on one device, x as check_matmul_input, W and b f32, W [out, in], x [..., in], b [out] or
/// undefined. Throws std::invalid_argument naming `op`.
void check_linear(const char* op, const Tensor& x, const Tensor& W, const Tensor& b);
/// Throws std::invalid_argument naming `op` and `what` unless b is undefined, or f32 [out] for
/// W [out, in] on x's device.
void check_bias(const char* op, const Tensor& x, const Tensor& W, const Tensor& b, const char* what);
/// C = op(A) op(B) + beta C (alpha 1) with A and B both f32 or both bf16 (then f32 accumulation).
void gemm_as_stored(Kernels& k, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const Tensor& A, const Tensor& B,
                    float beta, float* C);
/// y[N, out] = xm Wm^T (+ b): xm [..., in] and Wm [out, in] both f32 or both bf16, b f32 [out] or
/// undefined; y is overwritten. With bf16 operands and a bias, the backend's fused bias epilogue
/// when it offers one (Kernels::gemm_bf16_epilogue), else the GEMM and then add_bias.
void linear_forward(Kernels& k, const Tensor& xm, const Tensor& Wm, const Tensor& b, float* y);

/// Throws std::invalid_argument "[op] output dtype must be f32 or bf16 ..." for any other dtype.
void check_output_dtype(DType dt, const char* op);

/// An op's output of `shape` on `dev` in `dt` (f32 or bf16, else check_output_dtype throws), for an
/// op whose bf16 output only feeds bf16 GEMMs: `fused(y)` writes the bf16 bits in one kernel when
/// the backend has one (returns false otherwise), `f32(y)` writes f32; without the fused kernel a
/// bf16 output is the f32 one rounded (Kernels::convert: the same bits).
template <class Fused, class F32>
Tensor output_in_dtype(const Shape& shape, Device dev, DType dt, const char* op, Fused fused, F32 f32) {
  check_output_dtype(dt, op);
  Tensor y = Tensor::empty(shape, dt, dev);
  if (dt == DType::f32) {
    f32(y.data_f32());
  } else if (!fused(y.data<uint16_t>())) {
    const Tensor y32 = Tensor::empty(shape, DType::f32, dev);
    f32(y32.data_f32());
    kernels(dev).convert(y32.data_ptr(), DType::f32, y.data_ptr(), DType::bf16, y.numel());
  }
  return y;
}

}  // namespace mfsdp::ops_detail
