#include "runtime/ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "runtime/autograd.h"
#include "runtime/kernels.h"
#include "runtime/ops_common.h"

namespace mfsdp {
namespace ops_detail {

void check_f32(const Tensor& t, const char* op, const char* what) {
  check_arg(t.defined(), op, std::string(what) + " is undefined");
  check_arg(t.dtype() == DType::f32, op, std::string(what) + " must be f32, got " + t.describe());
}

void check_matmul_input(const Tensor& t, const char* op, const char* what) {
  check_arg(t.defined(), op, std::string(what) + " is undefined");
  check_arg(t.dtype() == DType::f32 || (t.dtype() == DType::bf16 && matmul_dtype() == DType::bf16), op,
            std::string(what) + " must be f32 (or bf16 under bf16 matmuls), got " + t.describe());
}

Tensor matmul_operand(const Tensor& t, bool half) {
  return half && t.dtype() != DType::bf16 ? t.to(DType::bf16) : t;
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  check_arg(!b.defined() || a.device() == b.device(), op,
            "tensors on different devices: " + a.describe() + " and " + b.describe());
}

void gemm_as_stored(Kernels& k, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const Tensor& A, const Tensor& B,
                    float beta, float* C) {
  if (A.dtype() == DType::bf16) k.gemm_bf16(ta, tb, M, N, K, 1.0f, A.data_ptr(), B.data_ptr(), beta, C);
  else k.gemm(ta, tb, M, N, K, 1.0f, A.data_f32(), B.data_f32(), beta, C);
}

void check_linear(const char* op, const Tensor& x, const Tensor& W, const Tensor& b) {
  check_matmul_input(x, op, "input");
  check_f32(W, op, "weight");
  check_arg(W.dim() == 2, op, "weight must be 2-D [out, in], got " + W.describe());
  check_arg(x.dim() >= 1 && x.size(-1) == W.size(1), op,
            "input " + x.describe() + " does not match weight " + W.describe() + " (last dim must be in=" +
                std::to_string(W.size(1)) + ")");
  check_same_device(x, W, op);
  check_bias(op, x, W, b, "bias");
}

void check_bias(const char* op, const Tensor& x, const Tensor& W, const Tensor& b, const char* what) {
  if (!b.defined()) return;
  check_f32(b, op, what);
  check_arg(b.dim() == 1 && b.size(0) == W.size(0), op, std::string(what) + " " + b.describe() + " for " + W.describe());
  check_same_device(x, b, op);
}

void check_output_dtype(DType dt, const char* op) {
  check_arg(dt == DType::f32 || dt == DType::bf16, op,
            std::string("output dtype must be f32 or bf16, not ") + dtype_name(dt));
}

void linear_forward(Kernels& k, const Tensor& xm, const Tensor& Wm, const Tensor& b, float* y) {
  const int64_t in = Wm.size(1), out_f = Wm.size(0), N = xm.numel() / in;
  if (b.defined() && xm.dtype() == DType::bf16 &&
      k.gemm_bf16_epilogue(Kernels::Epilogue::bias, false, true, N, out_f, in, xm.data_ptr(), Wm.data_ptr(), y,
                           b.data_f32(), nullptr))
    return;
  gemm_as_stored(k, false, true, N, out_f, in, xm, Wm, 0.0f, y);
  if (b.defined()) k.add_bias(y, b.data_f32(), N, out_f);
}

}  // namespace ops_detail

namespace {
using namespace ops_detail;

float* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_f32() : nullptr; }

thread_local DType t_matmul_dtype = DType::f32;

}  // namespace

DType matmul_dtype() { return t_matmul_dtype; }

MatmulDTypeScope::MatmulDTypeScope(DType dt) : prev_(t_matmul_dtype) {
  check_arg(dt == DType::f32 || dt == DType::bf16, "MatmulDTypeScope",
            std::string("matmuls run in f32 or bf16, not ") + dtype_name(dt));
  t_matmul_dtype = dt;
}
MatmulDTypeScope::~MatmulDTypeScope() { t_matmul_dtype = prev_; }

Tensor linear(const Tensor& x, const Tensor& W, const Tensor& b) {
  const char* op = "linear";
  check_linear(op, x, W, b);
  const int64_t in = W.size(1), out_f = W.size(0), N = x.numel() / in;
  Shape out_shape = x.shape();
  out_shape.back() = out_f;
  Tensor y = Tensor::empty(out_shape, DType::f32, x.device());
  Kernels& k = kernels(x.device());
  // bf16 matmuls: the operands are rounded once and kept for the backward (as autocast keeps its casts)
  const bool half = matmul_dtype() == DType::bf16;
  const Tensor xm = matmul_operand(x, half), Wm = matmul_operand(W, half);
  linear_forward(k, xm, Wm, b, y.data_f32());
  if (needs_grad({&x, &W, &b})) {
    record(y, op, {x, W, b}, [x, W, b, xm, Wm, N, in, out_f](const Tensor& dy) {
      Kernels& k = kernels(dy.device());
      const Tensor dym = xm.dtype() == DType::bf16 ? dy.to(DType::bf16) : dy;
      if (x.requires_grad()) {  // dx[N, in] (+)= dy[N, out] W[out, in]
        const GradTarget dx = grad_target(x);
        gemm_as_stored(k, false, false, N, in, out_f, dym, Wm, dx.beta, dx.buffer.data_f32());
      }
      if (W.requires_grad()) {  // dW[out, in] (+)= dy^T x
        const GradTarget dW = grad_target(W);
        gemm_as_stored(k, true, false, out_f, in, N, dym, xm, dW.beta, dW.buffer.data_f32());
      }
      if (b.defined() && b.requires_grad()) k.bias_grad(grad_buffer(b).data_f32(), dy.data_f32(), N, out_f);
    });
  }
  return y;
}

Tensor add(const Tensor& a, const Tensor& b) {
  check_f32(a, "add", "a");
  check_f32(b, "add", "b");
  check_arg(a.shape() == b.shape(), "add", "shapes differ: " + a.describe() + " + " + b.describe());
  check_same_device(a, b, "add");
  Tensor y = Tensor::empty(a.shape(), DType::f32, a.device());
  kernels(a.device()).add(y.data_f32(), a.data_f32(), b.data_f32(), a.numel());
  if (needs_grad({&a, &b})) {
    record(y, "add", {a, b}, [a, b](const Tensor& dy) {
      accumulate_grad(a, dy);
      accumulate_grad(b, dy);
    });
  }
  return y;
}

Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, DType out_dtype) {
  const char* op = "layer_norm";
  check_f32(x, op, "input");
  check_f32(w, op, "weight");
  check_f32(b, op, "bias");
  const int64_t C = x.size(-1), N = x.numel() / C;
  check_arg(w.shape() == Shape{C} && b.shape() == Shape{C}, op,
            "weight " + w.describe() + " / bias " + b.describe() + " for input " + x.describe());
  check_same_device(x, w, op);
  check_same_device(x, b, op);
  Tensor stats = Tensor::empty({2, N}, DType::f32, x.device());  // mean | rstd
  Kernels& k = kernels(x.device());
  float* mean = stats.data_f32();
  Tensor y = output_in_dtype(
      x.shape(), x.device(), out_dtype, op,
      [&](uint16_t* y16) {
        return k.layernorm_forward_bf16(x.data_f32(), w.data_f32(), b.data_f32(), y16, mean, mean + N, N, C, eps);
      },
      [&](float* y32) { k.layernorm_forward(x.data_f32(), w.data_f32(), b.data_f32(), y32, mean, mean + N, N, C, eps); });
  if (needs_grad({&x, &w, &b})) {
    record(y, op, {x, w, b}, [x, w, b, stats, N, C](const Tensor& dy) {
      float* dx = x.requires_grad() ? grad_buffer(x).data_f32() : nullptr;
      float* dw = w.requires_grad() ? grad_buffer(w).data_f32() : nullptr;
      float* db = b.requires_grad() ? grad_buffer(b).data_f32() : nullptr;
      kernels(dy.device()).layernorm_backward(dy.data_f32(), x.data_f32(), w.data_f32(), stats.data_f32(),
                                              stats.data_f32() + N, dx, dw, db, N, C);
    });
  }
  return y;
}

Tensor gelu(const Tensor& x) {
  check_f32(x, "gelu", "input");
  Tensor y = Tensor::empty(x.shape(), DType::f32, x.device());
  kernels(x.device()).gelu_forward(x.data_f32(), y.data_f32(), x.numel());
  if (needs_grad({&x})) {
    record(y, "gelu", {x}, [x](const Tensor& dy) {
      kernels(dy.device()).gelu_backward(x.data_f32(), dy.data_f32(), grad_buffer(x).data_f32(), x.numel());
    });
  }
  return y;
}

Tensor embedding(const Tensor& wte, const Tensor& wpe, const Tensor& tokens, const Tensor& index) {
  const char* op = "embedding";
  check_f32(wte, op, "wte");
  check_arg(tokens.defined() && tokens.dtype() == DType::i32 && tokens.dim() == 2, op,
            "tokens must be i32 [B, T], got " + tokens.describe());
  check_arg(wte.dim() == 2, op, "wte must be [V, C], got " + wte.describe());
  const int64_t B = tokens.size(0), T = tokens.size(1), C = wte.size(1), V = wte.size(0);
  if (wpe.defined()) {
    check_f32(wpe, op, "wpe");
    check_arg(wpe.dim() == 2 && wte.size(1) == wpe.size(1), op,
              "wte " + wte.describe() + " and wpe " + wpe.describe() + " must be [V, C] and [T, C]");
    check_arg(T <= wpe.size(0), op, "sequence length " + std::to_string(T) + " exceeds wpe rows " + std::to_string(wpe.size(0)));
  }
  check_same_device(wte, wpe, op);
  check_same_device(wte, tokens, op);
  if (tokens.device() == Device::CPU) {
    const int32_t* ids = tokens.data<int32_t>();
    for (int64_t i = 0; i < B * T; ++i)
      check_arg(ids[i] >= 0 && ids[i] < V, op, "token id " + std::to_string(ids[i]) + " at position " +
                                                  std::to_string(i) + " is outside [0, " + std::to_string(V) + ")");
  }
  Tensor y = Tensor::empty({B, T, C}, DType::f32, wte.device());
  kernels(wte.device()).embedding_forward(wte.data_f32(), ptr_or_null(wpe), tokens.data<int32_t>(), y.data_f32(), B, T, C);
  if (needs_grad({&wte, &wpe})) {
    Tensor idx = index;
    if (idx.defined()) {
      check_arg(idx.dtype() == DType::i32 && idx.device() == tokens.device(), op,
                "index must be i32 on the tokens' device, got " + idx.describe());
    } else if (tokens.device() != Device::CPU && wte.requires_grad()) {
      idx = embedding_index(tokens.to(Device::CPU)).to(tokens.device());  // a direct caller's CUDA tokens
    }
    record(y, op, {wte, wpe}, [wte, wpe, tokens, idx, B, T, C](const Tensor& dy) {
      float* dwte = wte.requires_grad() ? grad_buffer(wte).data_f32() : nullptr;
      float* dwpe = wpe.defined() && wpe.requires_grad() ? grad_buffer(wpe).data_f32() : nullptr;
      kernels(dy.device()).embedding_backward(dy.data_f32(), tokens.data<int32_t>(),
                                              idx.defined() ? idx.data<int32_t>() : nullptr,
                                              idx.defined() ? idx.numel() : 0, dwte, dwpe, B, T, C);
    });
  }
  return y;
}

Tensor rms_norm(const Tensor& x, const Tensor& w, float eps, DType out_dtype) {
  const char* op = "rms_norm";
  check_f32(x, op, "input");
  check_f32(w, op, "weight");
  const int64_t C = x.size(-1), N = x.numel() / C;
  check_arg(w.shape() == Shape{C}, op, "weight " + w.describe() + " for input " + x.describe());
  check_same_device(x, w, op);
  Tensor rstd = Tensor::empty({N}, DType::f32, x.device());
  Kernels& k = kernels(x.device());
  Tensor y = output_in_dtype(
      x.shape(), x.device(), out_dtype, op,
      [&](uint16_t* y16) { return k.rmsnorm_forward_bf16(x.data_f32(), w.data_f32(), y16, rstd.data_f32(), N, C, eps); },
      [&](float* y32) { k.rmsnorm_forward(x.data_f32(), w.data_f32(), y32, rstd.data_f32(), N, C, eps); });
  if (needs_grad({&x, &w})) {
    record(y, op, {x, w}, [x, w, rstd, N, C](const Tensor& dy) {
      float* dx = x.requires_grad() ? grad_buffer(x).data_f32() : nullptr;
      float* dw = w.requires_grad() ? grad_buffer(w).data_f32() : nullptr;
      kernels(dy.device()).rmsnorm_backward(dy.data_f32(), x.data_f32(), w.data_f32(), rstd.data_f32(), dx, dw, N, C);
    });
  }
  return y;
}

Tensor rotary_embedding(const Tensor& x, int64_t n_head, float theta) {
  const char* op = "rotary_embedding";
  check_f32(x, op, "input");
  check_arg(x.dim() == 3 && n_head > 0 && x.size(2) % n_head == 0 && (x.size(2) / n_head) % 2 == 0, op,
            "input must be [B, T, n_head*d] with d even, got " + x.describe() + " for n_head=" + std::to_string(n_head));
  check_arg(theta > 0, op, "theta must be > 0, got " + std::to_string(theta));
  const int64_t B = x.size(0), T = x.size(1), d = x.size(2) / n_head;
  Tensor y = Tensor::empty(x.shape(), DType::f32, x.device());
  kernels(x.device()).rope(x.data_f32(), y.data_f32(), B, T, n_head, d, theta, false);
  if (needs_grad({&x})) {
    record(y, op, {x}, [x, B, T, n_head, d, theta](const Tensor& dy) {
      kernels(dy.device()).rope(dy.data_f32(), grad_buffer(x).data_f32(), B, T, n_head, d, theta, true);
    });
  }
  return y;
}

Tensor swiglu(const Tensor& gate, const Tensor& up, DType out_dtype) {
  const char* op = "swiglu";
  check_f32(gate, op, "gate");
  check_f32(up, op, "up");
  check_arg(gate.shape() == up.shape(), op, "shapes differ: " + gate.describe() + " and " + up.describe());
  check_same_device(gate, up, op);
  Kernels& k = kernels(gate.device());
  Tensor y = output_in_dtype(
      gate.shape(), gate.device(), out_dtype, op,
      [&](uint16_t* y16) { return k.swiglu_forward_bf16(gate.data_f32(), up.data_f32(), y16, gate.numel()); },
      [&](float* y32) { k.swiglu_forward(gate.data_f32(), up.data_f32(), y32, gate.numel()); });
  if (needs_grad({&gate, &up})) {
    record(y, op, {gate, up}, [gate, up](const Tensor& dy) {
      float* dg = gate.requires_grad() ? grad_buffer(gate).data_f32() : nullptr;
      float* du = up.requires_grad() ? grad_buffer(up).data_f32() : nullptr;
      kernels(dy.device()).swiglu_backward(gate.data_f32(), up.data_f32(), dy.data_f32(), dg, du, gate.numel());
    });
  }
  return y;
}

namespace {

// Targets i32 [N] on `like`'s device, each in [0, vocab_size) (checked when they are on the CPU).
void check_targets(const Tensor& targets, int64_t N, int64_t vocab_size, int64_t Vp, const Tensor& like,
                   const char* op) {
  check_arg(targets.defined() && targets.dtype() == DType::i32 && targets.numel() == N, op,
            "targets must be i32 with " + std::to_string(N) + " elements, got " + targets.describe());
  check_arg(vocab_size >= 1 && vocab_size <= Vp, op,
            "vocab_size " + std::to_string(vocab_size) + " outside [1, " + std::to_string(Vp) + "]");
  check_same_device(like, targets, op);
  if (targets.device() == Device::CPU) {
    const int32_t* t = targets.data<int32_t>();
    for (int64_t i = 0; i < N; ++i)
      check_arg(t[i] >= 0 && t[i] < vocab_size, op, "target " + std::to_string(t[i]) + " at position " +
                                                        std::to_string(i) + " is outside [0, " + std::to_string(vocab_size) + ")");
  }
}

// sum(losses) / div as a one-element tensor on the losses' device, summed there in f64
// (Kernels::sum_to_scalar: deterministic, nothing copied to the host).
Tensor reduce_losses(const Tensor& losses, double div) {
  Tensor loss = Tensor::empty({1}, DType::f32, losses.device());
  kernels(losses.device()).sum_to_scalar(losses.data_f32(), losses.numel(), div, loss.data_f32());
  return loss;
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t vocab_size, double divisor) {
  const char* op = "cross_entropy";
  check_f32(logits, op, "logits");
  check_arg(logits.dim() == 2, op, "logits must be [N, Vp], got " + logits.describe());
  const int64_t N = logits.size(0), Vp = logits.size(1);
  check_targets(targets, N, vocab_size, Vp, logits, op);
  const double div = divisor > 0 ? divisor : static_cast<double>(N);
  Tensor losses = Tensor::empty({N}, DType::f32, logits.device());
  kernels(logits.device()).cross_entropy_forward(logits.data_f32(), targets.data<int32_t>(), losses.data_f32(), N,
                                                 vocab_size, Vp);
  Tensor loss = reduce_losses(losses, div);
  if (needs_grad({&logits})) {
    record(loss, op, {logits}, [logits, targets, vocab_size, N, Vp, div](const Tensor& dl) {
      const float scale = static_cast<float>(scalar_upstream(dl) / div);
      kernels(logits.device()).cross_entropy_backward(logits.data_f32(), targets.data<int32_t>(), scale,
                                                      grad_buffer(logits).data_f32(), N, vocab_size, Vp);
    });
  }
  return loss;
}

namespace {

// The operands and outputs of classifier_loss's chunk pass. hm [N, C] and Wm [Vp, C] are in the
// matmul dtype; dh [N, C] / dW [Vp, C] are f32 and added into (undefined: not wanted).
struct ClassifierPass {
  Tensor hm, Wm, targets, losses, dh, dW;
  int64_t V, chunk;
};

// Every chunk of rows: logits into one buffer, the row pass, and (grad) the logits' gradient in
// place with its dh rows and dW contribution (linear's backward GEMMs). dh and dW need no zero
// fill: each dh row is written once and the first chunk writes dW, both with beta 0.
void run_classifier_chunks(const ClassifierPass& p, bool grad, float dloss) {
  const int64_t N = p.hm.size(0), C = p.hm.size(1), Vp = p.Wm.size(0);
  if (N == 0) return;
  const Device dev = p.hm.device();
  Kernels& k = kernels(dev);
  const bool half = p.hm.dtype() == DType::bf16;
  Tensor buf = Tensor::empty({std::min(p.chunk, N), Vp}, DType::f32, dev);
  for (int64_t r0 = 0; r0 < N; r0 += p.chunk) {
    const int64_t rows = std::min(p.chunk, N - r0);
    const Tensor hc = p.hm.view(r0 * C, {rows, C}), logits = buf.view(0, {rows, Vp});
    gemm_as_stored(k, false, true, rows, Vp, C, hc, p.Wm, 0.0f, logits.data_f32());
    k.cross_entropy_fused(logits.data_f32(), p.targets.data<int32_t>() + r0, p.losses.data_f32() + r0, dloss, grad,
                          rows, p.V, Vp);
    if (!grad) continue;
    const Tensor dlm = half ? logits.to(DType::bf16) : logits;
    if (p.dh.defined())  // dh[rows, C] = dlogits W
      gemm_as_stored(k, false, false, rows, C, Vp, dlm, p.Wm, 0.0f, p.dh.data_f32() + r0 * C);
    if (p.dW.defined())  // dW[Vp, C] (+)= dlogits^T h_c
      gemm_as_stored(k, true, false, Vp, C, rows, dlm, hc, r0 == 0 ? 0.0f : 1.0f, p.dW.data_f32());
  }
}

ClassifierPass classifier_pass(const Tensor& h, const Tensor& W, const Tensor& targets, int64_t V, int64_t chunk,
                               bool half) {  // bf16 operands are rounded once, as linear rounds them
  return ClassifierPass{matmul_operand(h, half), matmul_operand(W, half), targets,
                        Tensor::empty({h.size(0)}, DType::f32, h.device()), Tensor(), Tensor(), V, chunk};
}

// Hands a gradient the op computed to `t`: adopted when t has none yet, added otherwise.
void give_grad(const Tensor& t, const Tensor& g) {
  if (!t.requires_grad()) return;
  if (!t.grad().defined()) t.set_grad(g);
  else kernels(t.device()).axpy(t.grad().data_f32(), g.data_f32(), 1.0f, t.numel());
}

}  // namespace

Tensor classifier_loss(const Tensor& h, const Tensor& W, const Tensor& targets, int64_t vocab_size, double divisor,
                       int64_t chunk_rows) {
  const char* op = "classifier_loss";
  check_matmul_input(h, op, "h");
  check_f32(W, op, "W");
  check_arg(h.dim() == 2 && W.dim() == 2 && h.size(1) == W.size(1), op,
            "h must be [N, C] and W [Vp, C], got " + h.describe() + " and " + W.describe());
  check_arg(chunk_rows >= 0, op, "chunk_rows must be >= 0, got " + std::to_string(chunk_rows));
  check_same_device(h, W, op);
  const int64_t N = h.size(0), C = h.size(1), Vp = W.size(0);
  check_targets(targets, N, vocab_size, Vp, h, op);
  const double div = divisor > 0 ? divisor : static_cast<double>(N);
  const Device dev = h.device();
  const bool half = matmul_dtype() == DType::bf16;
  const int64_t chunk = chunk_rows > 0 ? chunk_rows : classifier_chunk_rows(Vp);
  ClassifierPass p = classifier_pass(h, W, targets, vocab_size, chunk, half);
  const bool grad = needs_grad({&h, &W});
  // written whole by the chunks (N > 0); no rows leave a zero gradient
  auto grad_of = [&](const Shape& s) {
    return N > 0 ? Tensor::empty(s, DType::f32, dev) : Tensor::zeros(s, DType::f32, dev);
  };
  if (grad && h.requires_grad()) p.dh = grad_of({N, C});
  if (grad && W.requires_grad()) p.dW = grad_of({Vp, C});
  // the gradient for an upstream 1, its scale formed as cross_entropy's backward forms it
  run_classifier_chunks(p, grad, static_cast<float>(1.0 / div));
  Tensor loss = reduce_losses(p.losses, div);
  if (grad) {
    // the backward keeps the gradients, not the bf16 operands (rebuilt only for an upstream != 1)
    record(loss, op, {h, W}, [h, W, targets, vocab_size, chunk, half, div, dh = p.dh, dW = p.dW](const Tensor& dl) {
      if (const float g = scalar_upstream(dl); g != 1.0f) {  // not the root: the pass again with the real scale
        ClassifierPass again = classifier_pass(h, W, targets, vocab_size, chunk, half);
        again.dh = dh;
        again.dW = dW;
        run_classifier_chunks(again, true, static_cast<float>(g / div));
      }
      if (dh.defined()) give_grad(h, dh);
      if (dW.defined()) give_grad(W, dW);
    });
  }
  return loss;
}

void append_embedding_index(const int32_t* ids, int64_t n, std::vector<int32_t>& out) {
  check_arg(n >= 0 && n <= INT32_MAX, "embedding_index", std::to_string(n) + " positions (at most INT_MAX)");
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [ids](int32_t a, int32_t b) { return ids[a] < ids[b]; });
  std::vector<int32_t> group_ids, start;
  for (int64_t k = 0; k < n; ++k)
    if (k == 0 || ids[order[k]] != ids[order[k - 1]]) {
      group_ids.push_back(ids[order[k]]);
      start.push_back(static_cast<int32_t>(k));
    }
  start.push_back(static_cast<int32_t>(n));
  out.reserve(out.size() + group_ids.size() + start.size() + order.size());
  out.insert(out.end(), group_ids.begin(), group_ids.end());
  out.insert(out.end(), start.begin(), start.end());
  out.insert(out.end(), order.begin(), order.end());
}

Tensor embedding_index(const Tensor& tokens) {
  check_arg(tokens.defined() && tokens.dtype() == DType::i32 && tokens.device() == Device::CPU, "embedding_index",
            "tokens must be i32 on the CPU, got " + (tokens.defined() ? tokens.describe() : std::string("undefined")));
  if (tokens.numel() == 0) return Tensor();
  std::vector<int32_t> idx;
  append_embedding_index(tokens.data<int32_t>(), tokens.numel(), idx);
  return tokens_tensor(idx, {static_cast<int64_t>(idx.size())});
}

Tensor tokens_tensor(const std::vector<int32_t>& ids, const Shape& shape, Device device) {
  check_arg(static_cast<int64_t>(ids.size()) == shape_numel(shape), "tokens_tensor",
            std::to_string(ids.size()) + " ids for shape " + shape_str(shape));
  Tensor host = Tensor::empty(shape, DType::i32, Device::CPU);
  if (!ids.empty()) std::memcpy(host.data_ptr(), ids.data(), ids.size() * sizeof(int32_t));
  return device == Device::CPU ? host : host.to(device);
}

}  // namespace mfsdp
