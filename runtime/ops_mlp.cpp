// GPT-2's MLP as one differentiable op (ops.h gelu_mlp), so that the GELU and the biases can ride
// in the GEMMs' epilogues: the c_fc GEMM writes gelu(pre) and keeps pre, and the backward's first
// GEMM (dh = dy W_proj) writes dpre = dh * gelu'(pre) and c_fc's bias gradient. Where the backend
// offers no epilogue (the CPU, f32 matmuls, a shape cuBLASLt refuses), the op runs the kernels
// linear and gelu run, in their order, so its bits are those of linear -> gelu -> linear.
#include <cstdint>

#include "runtime/autograd.h"
#include "runtime/kernels.h"
#include "runtime/ops.h"
#include "runtime/ops_common.h"

namespace mfsdp {
using namespace ops_detail;
namespace {

// What the backward reads: the inputs, the GEMM operands as stored (bf16 under bf16 matmuls, else
// the f32 tensors themselves), and pre = x W_fc^T + b_fc (f32 [N, hidden]).
struct MlpSaved {
  Tensor x, W_fc, b_fc, W_proj, b_proj;
  Tensor xm, Wfm, Wpm, hm, pre;
  int64_t N, in, hidden, out;
};

// pre (aux) and h = gelu(pre), both [N, hidden] f32, from the c_fc layer.
void fc_gelu_forward(Kernels& k, const MlpSaved& s, float* h) {
  if (s.b_fc.defined() && s.xm.dtype() == DType::bf16 &&
      k.gemm_bf16_epilogue(Kernels::Epilogue::bias_gelu, false, true, s.N, s.hidden, s.in, s.xm.data_ptr(),
                           s.Wfm.data_ptr(), h, s.b_fc.data_f32(), s.pre.data_f32()))
    return;
  linear_forward(k, s.xm, s.Wfm, s.b_fc, s.pre.data_f32());
  k.gelu_forward(s.pre.data_f32(), h, s.N * s.hidden);
}

// dpre [N, hidden] = (dym W_proj) * gelu'(pre), with c_fc's bias gradient added into db_fc (when
// not null): one GEMM with the DGELU_BGRAD epilogue when offered, else the GEMM into a new buffer,
// GELU's backward into zeros and bias_grad, as the separate ops do.
Tensor pre_gradient(Kernels& k, const MlpSaved& s, const Tensor& dym, float* db_fc) {
  const Device dev = dym.device();
  Tensor dpre = Tensor::empty({s.N, s.hidden}, DType::f32, dev);
  if (dym.dtype() == DType::bf16) {
    const Tensor db = Tensor::empty({s.hidden}, DType::f32, dev);
    if (k.gemm_bf16_epilogue(Kernels::Epilogue::dgelu_bgrad, false, false, s.N, s.hidden, s.out, dym.data_ptr(),
                             s.Wpm.data_ptr(), dpre.data_f32(), db.data_f32(), s.pre.data_f32())) {
      if (db_fc != nullptr) k.add(db_fc, db_fc, db.data_f32(), s.hidden);
      return dpre;
    }
  }
  const Tensor dh = Tensor::empty({s.N, s.hidden}, DType::f32, dev);
  gemm_as_stored(k, false, false, s.N, s.hidden, s.out, dym, s.Wpm, 0.0f, dh.data_f32());
  k.fill(dpre.data_f32(), 0.0f, s.N * s.hidden);
  k.gelu_backward(s.pre.data_f32(), dh.data_f32(), dpre.data_f32(), s.N * s.hidden);
  if (db_fc != nullptr) k.bias_grad(db_fc, dpre.data_f32(), s.N, s.hidden);
  return dpre;
}

void mlp_backward(const MlpSaved& s, const Tensor& dy) {
  Kernels& k = kernels(dy.device());
  const bool half = s.xm.dtype() == DType::bf16;
  const Tensor dym = half ? dy.to(DType::bf16) : dy;
  if (s.W_proj.requires_grad()) {  // dW_proj[out, hidden] (+)= dy^T h
    const GradTarget dW = grad_target(s.W_proj);
    gemm_as_stored(k, true, false, s.out, s.hidden, s.N, dym, s.hm, dW.beta, dW.buffer.data_f32());
  }
  if (s.b_proj.defined() && s.b_proj.requires_grad())
    k.bias_grad(grad_buffer(s.b_proj).data_f32(), dy.data_f32(), s.N, s.out);
  const bool fc_grad = s.b_fc.defined() && s.b_fc.requires_grad();
  if (!s.x.requires_grad() && !s.W_fc.requires_grad() && !fc_grad) return;
  const Tensor dpre = pre_gradient(k, s, dym, fc_grad ? grad_buffer(s.b_fc).data_f32() : nullptr);
  const Tensor dprem = half ? dpre.to(DType::bf16) : dpre;
  if (s.x.requires_grad()) {  // dx[N, in] (+)= dpre W_fc
    const GradTarget dx = grad_target(s.x);
    gemm_as_stored(k, false, false, s.N, s.in, s.hidden, dprem, s.Wfm, dx.beta, dx.buffer.data_f32());
  }
  if (s.W_fc.requires_grad()) {  // dW_fc[hidden, in] (+)= dpre^T x
    const GradTarget dW = grad_target(s.W_fc);
    gemm_as_stored(k, true, false, s.hidden, s.in, s.N, dprem, s.xm, dW.beta, dW.buffer.data_f32());
  }
}

}  // namespace

Tensor gelu_mlp(const Tensor& x, const Tensor& W_fc, const Tensor& b_fc, const Tensor& W_proj, const Tensor& b_proj) {
  const char* op = "gelu_mlp";
  check_linear(op, x, W_fc, b_fc);
  check_f32(W_proj, op, "projection weight");
  check_arg(W_proj.dim() == 2 && W_proj.size(1) == W_fc.size(0), op,
            "projection weight " + W_proj.describe() + " does not take the hidden width " +
                std::to_string(W_fc.size(0)) + " of " + W_fc.describe());
  check_same_device(x, W_proj, op);
  check_bias(op, x, W_proj, b_proj, "projection bias");
  MlpSaved s{x, W_fc, b_fc, W_proj, b_proj, {}, {}, {}, {}, {}, 0, W_fc.size(1), W_fc.size(0), W_proj.size(0)};
  s.N = x.numel() / s.in;
  Kernels& k = kernels(x.device());
  const bool half = matmul_dtype() == DType::bf16;
  s.xm = matmul_operand(x, half);
  s.Wfm = matmul_operand(W_fc, half);
  s.Wpm = matmul_operand(W_proj, half);
  s.pre = Tensor::empty({s.N, s.hidden}, DType::f32, x.device());
  const Tensor h = Tensor::empty({s.N, s.hidden}, DType::f32, x.device());
  fc_gelu_forward(k, s, h.data_f32());
  s.hm = half ? h.to(DType::bf16) : h;
  Shape out_shape = x.shape();
  out_shape.back() = s.out;
  Tensor y = Tensor::empty(out_shape, DType::f32, x.device());
  linear_forward(k, s.hm, s.Wpm, b_proj, y.data_f32());
  if (needs_grad({&x, &W_fc, &b_fc, &W_proj, &b_proj}))
    record(y, op, {x, W_fc, b_fc, W_proj, b_proj}, [s](const Tensor& dy) { mlp_backward(s, dy); });
  return y;
}

}  // namespace mfsdp
