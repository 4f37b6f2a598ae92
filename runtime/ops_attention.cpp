// The attention ops (ops.h): causal multi-head self-attention on fused projections and causal
// grouped-query attention, through the kernel attention_kernel() names (unfused, fused, cudnn), and
// QK-Clip's per-head statistic.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "runtime/autograd.h"
#include "runtime/cuda/cudnn_attention.h"
#include "runtime/kernels.h"
#include "runtime/ops.h"
#include "runtime/ops_common.h"

namespace mfsdp {
using namespace ops_detail;
namespace {

thread_local AttentionKernel t_attention_kernel = AttentionKernel::unfused;

}  // namespace

AttentionKernel attention_kernel() { return t_attention_kernel; }
bool cudnn_attention_built() { return cuda_cudnn::built(); }
AttentionKernelScope::AttentionKernelScope(AttentionKernel k) : prev_(t_attention_kernel) { t_attention_kernel = k; }
AttentionKernelScope::~AttentionKernelScope() { t_attention_kernel = prev_; }

namespace {

// Gradient pointers of q, k, v for an attention backward, and the tensors that own them.
struct AttentionGrads {
  std::vector<Tensor> keep;
  float *dq, *dk, *dv;
};

// Both attention ops: q/k/v are views (pointers and strides in `a`) into `inputs`, whose gradient
// pointers `grads` returns at backward time. Saves probs (unfused) or lse and the output the kernel's
// backward reads (fused: f32; cudnn: cuDNN's bf16 output as written). The result is in out_dtype:
// a bf16 result is the f32 one rounded (unfused, fused) or cuDNN's own output (cudnn), an f32
// result of cudnn is that output widened.
template <class Views, class Grads>
Tensor attention_op(const char* op, std::vector<Tensor> inputs, bool with_grad, Views views, Grads grads,
                    const Kernels::AttentionDims& a, DType out_dtype) {
  check_output_dtype(out_dtype, op);
  const Device dev = inputs[0].device();
  const Shape shape{a.B, a.T, a.H * a.d};
  const AttentionKernel kind = attention_kernel();
  // unfused: probs [B,H,T,T]; fused, cudnn: lse [B,H,T]
  Tensor saved = Tensor::empty(kind != AttentionKernel::unfused ? Shape{a.B, a.H, a.T} : Shape{a.B, a.H, a.T, a.T},
                               DType::f32, dev);
  const auto [q, k, v] = views();
  Kernels& fk = kernels(dev);
  Tensor out, y;  // out: what the backward reads (fused, cudnn); y: the result
  if (kind == AttentionKernel::cudnn) {
    out = Tensor::empty(shape, DType::bf16, dev);
    fk.cudnn_attention_forward(q, k, v, out.data<uint16_t>(), saved.data_f32(), a);
    y = out_dtype == DType::bf16 ? out : out.to(DType::f32);
  } else {
    Tensor y32 = Tensor::empty(shape, DType::f32, dev);
    if (kind == AttentionKernel::fused) {
      fk.flash_attention_forward(q, k, v, y32.data_f32(), saved.data_f32(), a);
      out = y32;
    } else {
      fk.gqa_attention_forward(q, k, v, y32.data_f32(), saved.data_f32(), a);
    }
    y = out_dtype == DType::bf16 ? y32.to(DType::bf16) : y32;
  }
  if (with_grad) {
    if (out.defined()) out = out.detach();  // storage only: no reference cycle through y's node
    record(y, op, inputs, [views, grads, saved, out, a, kind](const Tensor& dy) {
      const auto [q, k, v] = views();
      const auto g = grads();  // keeps any scratch gradients alive until the kernel has run
      Kernels& kern = kernels(dy.device());
      if (kind == AttentionKernel::fused)
        kern.flash_attention_backward(dy.data_f32(), q, k, v, out.data_f32(), saved.data_f32(), g.dq, g.dk, g.dv, a);
      else if (kind == AttentionKernel::cudnn)
        kern.cudnn_attention_backward(dy.data_f32(), q, k, v, out.data<uint16_t>(), saved.data_f32(), g.dq, g.dk,
                                      g.dv, a);
      else
        kern.gqa_attention_backward(dy.data_f32(), q, k, v, saved.data_f32(), g.dq, g.dk, g.dv, a);
    });
  }
  return y;
}

}  // namespace

Tensor causal_self_attention(const Tensor& qkv, int64_t n_head, DType out_dtype) {
  const char* op = "causal_self_attention";
  check_f32(qkv, op, "qkv");
  check_arg(qkv.dim() == 3 && qkv.size(2) % 3 == 0, op, "qkv must be [B, T, 3C], got " + qkv.describe());
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  check_arg(n_head > 0 && C % n_head == 0, op, "C=" + std::to_string(C) + " not divisible by n_head=" + std::to_string(n_head));
  const Kernels::AttentionDims a{B, T, n_head, n_head, C / n_head, 3 * C, 3 * C};
  auto views = [qkv, C] {
    const float* p = qkv.data_f32();
    return std::array<const float*, 3>{p, p + C, p + 2 * C};
  };
  auto grads = [qkv, C] {
    Tensor g = grad_buffer(qkv);
    float* p = g.data_f32();
    return AttentionGrads{{g}, p, p + C, p + 2 * C};
  };
  return attention_op(op, {qkv}, needs_grad({&qkv}), views, grads, a, out_dtype);
}

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t n_head, int64_t n_kv_head,
                        DType out_dtype) {
  const char* op = "causal_attention";
  check_f32(q, op, "q");
  check_f32(k, op, "k");
  check_f32(v, op, "v");
  check_arg(q.dim() == 3 && k.dim() == 3 && k.shape() == v.shape() && k.size(0) == q.size(0) && k.size(1) == q.size(1),
            op, "q [B, T, H*d], k and v [B, T, Hkv*d] expected, got " + q.describe() + ", " + k.describe() + ", " +
                    v.describe());
  check_arg(n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0, op,
            "n_kv_head=" + std::to_string(n_kv_head) + " must divide n_head=" + std::to_string(n_head));
  check_arg(q.size(2) % n_head == 0 && k.size(2) * n_head == q.size(2) * n_kv_head, op,
            "q " + q.describe() + " / k " + k.describe() + " do not split into " + std::to_string(n_head) + " and " +
                std::to_string(n_kv_head) + " heads of one size");
  check_same_device(q, k, op);
  check_same_device(q, v, op);
  const int64_t B = q.size(0), T = q.size(1), d = q.size(2) / n_head;
  const Kernels::AttentionDims a{B, T, n_head, n_kv_head, d, q.size(2), k.size(2)};
  auto views = [q, k, v] { return std::array<const float*, 3>{q.data_f32(), k.data_f32(), v.data_f32()}; };
  auto grads = [q, k, v] {
    // The kernels add into all three gradients; inputs without one get a scratch buffer.
    auto grad_or_scratch = [](const Tensor& t) {
      return t.requires_grad() ? grad_buffer(t) : Tensor::zeros(t.shape(), DType::f32, t.device());
    };
    Tensor dq = grad_or_scratch(q), dk = grad_or_scratch(k), dv = grad_or_scratch(v);
    return AttentionGrads{{dq, dk, dv}, dq.data_f32(), dk.data_f32(), dv.data_f32()};
  };
  return attention_op(op, {q, k, v}, needs_grad({&q, &k, &v}), views, grads, a, out_dtype);
}

std::vector<float> attention_max_logits(const Tensor& qkv, int64_t n_head) {
  const char* op = "attention_max_logits";
  check_f32(qkv, op, "qkv");
  check_arg(qkv.dim() == 3 && qkv.size(2) % 3 == 0, op, "qkv must be [B, T, 3C], got " + qkv.describe());
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  check_arg(n_head > 0 && C % n_head == 0, op, "C=" + std::to_string(C) + " not divisible by n_head=" + std::to_string(n_head));
  std::vector<float> out(static_cast<size_t>(n_head), -INFINITY);
  if (B == 0 || T == 0) return out;
  Tensor per_sample = Tensor::empty({B, n_head}, DType::f32, qkv.device());
  kernels(qkv.device()).attention_max_logits(qkv.data_f32(), per_sample.data_f32(), B, T, C, n_head);
  const std::vector<float> host = per_sample.to_vector();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < n_head; ++h) out[h] = std::max(out[h], host[b * n_head + h]);
  return out;
}

}  // namespace mfsdp
