// CPU backend: oneDNN's SGEMM when built with it (about 1.3x Eigen's on AVX-512 machines; Eigen's
// GEMM otherwise), Eigen for small
// matrix products inside kernels and vectorized math, and OpenMP loops. Reductions across rows (bias/LayerNorm/embedding
// gradients, sum of squares) are split by columns or fixed-size chunks, so results do not depend on
// the thread count or on timing (bitwise-reproducible runs).
#include <omp.h>
#if defined(MFSDP_WITH_DNNL)
#include <oneapi/dnnl/dnnl.h>
#endif

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "runtime/cpu_gemm_bf16.h"
#include "runtime/cuda/device_api.h"
#include "runtime/kernels.h"
#include "runtime/kernels_cpu_moe.h"

namespace mfsdp {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapMat = Eigen::Map<RowMat>;
using CMapMat = Eigen::Map<const RowMat>;
using Stride = Eigen::OuterStride<>;
using SMap = Eigen::Map<RowMat, 0, Stride>;
using CSMap = Eigen::Map<const RowMat, 0, Stride>;

constexpr int64_t kChunk = 1 << 16;  // elements per fixed reduction chunk

// Splits [0, n) into contiguous per-thread ranges; body(begin, end).
template <class F>
void parallel_ranges(int64_t n, int64_t min_per_thread, F body) {
  const int64_t max_threads = std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), n / std::max<int64_t>(1, min_per_thread)));
  if (max_threads <= 1) {
    body(int64_t(0), n);
    return;
  }
#pragma omp parallel num_threads(static_cast<int>(max_threads))
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = n * t / nt, end = n * (t + 1) / nt;
    body(begin, end);
  }
}

class CpuKernels final : public CpuMoeKernels {  // the MoE row kernels: kernels_cpu_moe.cpp
 public:
  const char* name() const override { return "cpu"; }

  void convert(const void* src, DType sdt, void* dst, DType ddt, int64_t n) override {
    if (sdt == ddt) {
      std::memcpy(dst, src, n * dtype_size(sdt));
      return;
    }
    if (sdt == DType::f32 && ddt == DType::bf16) {
      const float* s = static_cast<const float*>(src);
      bf16* d = static_cast<bf16*>(dst);
#pragma omp parallel for schedule(static) if (n > kChunk)
      for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(s[i]);
    } else if (sdt == DType::bf16 && ddt == DType::f32) {
      const bf16* s = static_cast<const bf16*>(src);
      float* d = static_cast<float*>(dst);
#pragma omp parallel for schedule(static) if (n > kChunk)
      for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_float(s[i]);
    } else {
      throw std::invalid_argument(std::string("[convert] unsupported ") + dtype_name(sdt) + " -> " + dtype_name(ddt));
    }
  }

  void fill(float* x, float value, int64_t n) override {
#pragma omp parallel for schedule(static) if (n > kChunk)
    for (int64_t i = 0; i < n; ++i) x[i] = value;
  }

  void axpy(float* y, const float* x, float alpha, int64_t n) override {
#pragma omp parallel for schedule(static) if (n > kChunk)
    for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
  }

  void add(float* out, const float* a, const float* b, int64_t n) override {
#pragma omp parallel for schedule(static) if (n > kChunk)
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }

  void scale(float* x, float alpha, int64_t n) override {
#pragma omp parallel for schedule(static) if (n > kChunk)
    for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
  }

  void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, const void* B,
                 float beta, float* C) override {
    if (cpu_gemm_bf16_native() && M > 0 && N > 0 && K > 0) {  // oneDNN on AVX512-BF16 / AMX
      cpu_gemm_bf16(ta, tb, M, N, K, alpha, A, B, beta, C);
      return;
    }
    widened_a_.resize(static_cast<size_t>(M * K));
    widened_b_.resize(static_cast<size_t>(K * N));
    convert(A, DType::bf16, widened_a_.data(), DType::f32, M * K);
    convert(B, DType::bf16, widened_b_.data(), DType::f32, K * N);
    gemm(ta, tb, M, N, K, alpha, widened_a_.data(), widened_b_.data(), beta, C);
  }

  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B,
            float beta, float* C) override {
    MapMat c(C, M, N);
    if (M == 0 || N == 0) return;
    if (K == 0) {
      if (beta == 0.f) c.setZero();
      else c *= beta;
      return;
    }
#if defined(MFSDP_WITH_DNNL)
    // oneDNN's row-major SGEMM: C = alpha op(A) op(B) + beta C (lda/ldb are the stored row lengths).
    const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, ta ? M : K, B, tb ? K : N,
                                        beta, C, N);
    if (st != dnnl_success)
      throw std::runtime_error("[gemm] dnnl_sgemm failed (status " + std::to_string(static_cast<int>(st)) + ") for M=" +
                               std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
#else
    if (beta == 0.f) c.setZero();
    else if (beta != 1.f) c *= beta;
    CMapMat a(A, ta ? K : M, ta ? M : K), b(B, tb ? N : K, tb ? K : N);
    if (!ta && !tb) c.noalias() += alpha * a * b;
    else if (!ta && tb) c.noalias() += alpha * a * b.transpose();
    else if (ta && !tb) c.noalias() += alpha * a.transpose() * b;
    else c.noalias() += alpha * a.transpose() * b.transpose();
#endif
  }

  void add_bias(float* y, const float* b, int64_t rows, int64_t cols) override {
#pragma omp parallel for schedule(static) if (rows * cols > kChunk)
    for (int64_t r = 0; r < rows; ++r) {
      float* yr = y + r * cols;
      for (int64_t c = 0; c < cols; ++c) yr[c] += b[c];
    }
  }

  void bias_grad(float* db, const float* dy, int64_t rows, int64_t cols) override {
    parallel_ranges(cols, 64, [&](int64_t c0, int64_t c1) {
      for (int64_t r = 0; r < rows; ++r) {
        const float* d = dy + r * cols;
        for (int64_t c = c0; c < c1; ++c) db[c] += d[c];
      }
    });
  }

  void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                         int64_t rows, int64_t cols, float eps) override {
#pragma omp parallel for schedule(static) if (rows * cols > kChunk)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      float m = 0;
      for (int64_t c = 0; c < cols; ++c) m += xr[c];
      m /= static_cast<float>(cols);
      float v = 0;
      for (int64_t c = 0; c < cols; ++c) v += (xr[c] - m) * (xr[c] - m);
      v /= static_cast<float>(cols);
      const float s = 1.0f / std::sqrt(v + eps);
      float* yr = y + r * cols;
      for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - m) * s * w[c] + b[c];
      mean[r] = m;
      rstd[r] = s;
    }
  }

  void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                          float* dx, float* dw, float* db, int64_t rows, int64_t cols) override {
    if (dx) {
#pragma omp parallel for schedule(static) if (rows * cols > kChunk)
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        const float* dyr = dy + r * cols;
        const float m = mean[r], s = rstd[r];
        float mean_dn = 0, mean_dn_n = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const float n = (xr[c] - m) * s, dn = dyr[c] * w[c];
          mean_dn += dn;
          mean_dn_n += dn * n;
        }
        mean_dn /= static_cast<float>(cols);
        mean_dn_n /= static_cast<float>(cols);
        float* dxr = dx + r * cols;
        for (int64_t c = 0; c < cols; ++c) {
          const float n = (xr[c] - m) * s, dn = dyr[c] * w[c];
          dxr[c] += s * (dn - mean_dn - n * mean_dn_n);
        }
      }
    }
    if (dw || db) {
      parallel_ranges(cols, 32, [&](int64_t c0, int64_t c1) {
        for (int64_t r = 0; r < rows; ++r) {
          const float* xr = x + r * cols;
          const float* dyr = dy + r * cols;
          const float m = mean[r], s = rstd[r];
          for (int64_t c = c0; c < c1; ++c) {
            if (dw) dw[c] += dyr[c] * (xr[c] - m) * s;
            if (db) db[c] += dyr[c];
          }
        }
      });
    }
  }

  // GELU on Eigen arrays: Eigen's vectorized tanh (SIMD polynomial, f32 accurate to ~1 ulp-ish),
  // in fixed chunks so threads split the work.
  void gelu_forward(const float* x, float* y, int64_t n) override {
    const float k = std::sqrt(2.0f / static_cast<float>(M_PI));
    const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t b = c * kChunk, len = std::min(kChunk, n - b);
      Eigen::Map<const Eigen::ArrayXf> xv(x + b, len);
      Eigen::Map<Eigen::ArrayXf> yv(y + b, len);
      yv = 0.5f * xv * (1.0f + (k * (xv + 0.044715f * xv.cube())).tanh());
    }
  }

  void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) override {
    const float k = std::sqrt(2.0f / static_cast<float>(M_PI));
    const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t b = c * kChunk, len = std::min(kChunk, n - b);
      Eigen::Map<const Eigen::ArrayXf> xv(x + b, len), dyv(dy + b, len);
      Eigen::Map<Eigen::ArrayXf> dxv(dx + b, len);
      const Eigen::ArrayXf t = (k * (xv + 0.044715f * xv.cube())).tanh();
      dxv += dyv * (0.5f * (1.0f + t) + 0.5f * xv * (1.0f - t.square()) * (k * (1.0f + 3.0f * 0.044715f * xv.square())));
    }
  }

  void embedding_forward(const float* wte, const float* wpe, const int32_t* tokens, float* out, int64_t B,
                         int64_t T, int64_t C) override {
#pragma omp parallel for schedule(static) if (B * T * C > kChunk)
    for (int64_t i = 0; i < B * T; ++i) {
      const float* e = wte + static_cast<int64_t>(tokens[i]) * C;
      float* o = out + i * C;
      if (wpe) {
        const float* p = wpe + (i % T) * C;
        for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
      } else {
        std::memcpy(o, e, static_cast<size_t>(C) * sizeof(float));
      }
    }
  }

  void embedding_backward(const float* dout, const int32_t* tokens, const int32_t* /*index*/, int64_t /*index_numel*/,
                          float* dwte, float* dwpe, int64_t B, int64_t T, int64_t C) override {
    parallel_ranges(C, 16, [&](int64_t c0, int64_t c1) {
      for (int64_t i = 0; i < B * T; ++i) {
        const float* d = dout + i * C;
        if (dwte) {
          float* e = dwte + static_cast<int64_t>(tokens[i]) * C;
          for (int64_t c = c0; c < c1; ++c) e[c] += d[c];
        }
        if (dwpe) {
          float* p = dwpe + (i % T) * C;
          for (int64_t c = c0; c < c1; ++c) p[c] += d[c];
        }
      }
    });
  }

  // Causal softmax in place on p [T, T] (row i holds q_i k^T): softmax(scale * row[0..i]), zeros after i.
  static void causal_softmax(float* p, int64_t T, float scale) {
    for (int64_t i = 0; i < T; ++i) {
      float* row = p + i * T;
      float mx = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, row[j] * scale);
      float sum = 0;
      for (int64_t j = 0; j <= i; ++j) {
        row[j] = std::exp(row[j] * scale - mx);
        sum += row[j];
      }
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
      for (int64_t j = i + 1; j < T; ++j) row[j] = 0.0f;
    }
  }

  void attention_max_logits(const float* qkv, float* max_out, int64_t B, int64_t T, int64_t C, int64_t H) override {
    const int64_t d = C / H;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
#pragma omp parallel for schedule(static) if (B * H > 1)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const float* base = qkv + (bh / H) * T * 3 * C + (bh % H) * d;
      float mx = -INFINITY;
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          const float* q = base + i * 3 * C;
          const float* k = base + j * 3 * C + C;
          float dot = 0.0f;
          for (int64_t e = 0; e < d; ++e) dot += q[e] * k[e];
          mx = std::max(mx, dot * scale);
        }
      max_out[bh] = mx;
    }
  }

  void gqa_attention_forward(const float* q, const float* k, const float* v, float* out, float* probs,
                             const AttentionDims& a) override {
    const int64_t B = a.B, T = a.T, H = a.H, d = a.d, g = a.H / a.Hkv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
#pragma omp parallel for schedule(static) if (B * H > 1)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H, kv = (h / g) * d;
      CSMap qh(q + b * T * a.ldq + h * d, T, d, Stride(a.ldq));
      CSMap kh(k + b * T * a.ldkv + kv, T, d, Stride(a.ldkv)), vh(v + b * T * a.ldkv + kv, T, d, Stride(a.ldkv));
      MapMat p(probs + bh * T * T, T, T);
      p.noalias() = qh * kh.transpose();
      causal_softmax(p.data(), T, scale);
      SMap o(out + b * T * H * d + h * d, T, d, Stride(H * d));
      o.noalias() = p * vh;
    }
  }

  // Parallel over (sample, key/value head); the query heads of a group run in order, so the shared
  // dk/dv sums are deterministic and no two threads write the same element.
  void gqa_attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* probs,
                              float* dq, float* dk, float* dv, const AttentionDims& a) override {
    const int64_t B = a.B, T = a.T, H = a.H, Hkv = a.Hkv, d = a.d, g = a.H / a.Hkv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
#pragma omp parallel for schedule(static) if (B * Hkv > 1)
    for (int64_t bj = 0; bj < B * Hkv; ++bj) {
      const int64_t b = bj / Hkv, kv = (bj % Hkv) * d;
      CSMap kh(k + b * T * a.ldkv + kv, T, d, Stride(a.ldkv)), vh(v + b * T * a.ldkv + kv, T, d, Stride(a.ldkv));
      SMap dkh(dk + b * T * a.ldkv + kv, T, d, Stride(a.ldkv)), dvh(dv + b * T * a.ldkv + kv, T, d, Stride(a.ldkv));
      RowMat dp(T, T);
      for (int64_t h = (bj % Hkv) * g; h < (bj % Hkv + 1) * g; ++h) {
        CSMap qh(q + b * T * a.ldq + h * d, T, d, Stride(a.ldq));
        SMap dqh(dq + b * T * a.ldq + h * d, T, d, Stride(a.ldq));
        CSMap dO(dout + b * T * H * d + h * d, T, d, Stride(H * d));
        CMapMat p(probs + (b * H + h) * T * T, T, T);
        dp.noalias() = dO * vh.transpose();
        dvh.noalias() += p.transpose() * dO;
        // softmax backward: ds = p * (dp - sum_j p dp), then the 1/sqrt(d) scale of the logits
        for (int64_t i = 0; i < T; ++i) {
          const float* pr = p.data() + i * T;
          float* r = dp.data() + i * T;
          float dot = 0;
          for (int64_t j = 0; j <= i; ++j) dot += pr[j] * r[j];
          for (int64_t j = 0; j <= i; ++j) r[j] = pr[j] * (r[j] - dot) * scale;
          for (int64_t j = i + 1; j < T; ++j) r[j] = 0.0f;
        }
        dqh.noalias() += dp * kh;
        dkh.noalias() += dp.transpose() * qh;
      }
    }
  }

  // Fused (flash) attention, blockwise: a block of kFlashRows queries sees only its causal key
  // prefix, so a thread holds [kFlashRows, T] scores instead of a head's [T, T] probabilities.
  static constexpr int64_t kFlashRows = 64;

  // In place on s [rows, keys] (row r is query i0 + r against keys 0..keys-1): the scaled logits of
  // the causal window become exp(logit - lse) with lse computed here (forward) or given (backward);
  // entries after the window become 0.
  static void flash_probs(float* s, int64_t rows, int64_t keys, int64_t i0, float scale, float* lse_out,
                          const float* lse_in) {
    for (int64_t r = 0; r < rows; ++r) {
      float* row = s + r * keys;
      const int64_t n = i0 + r + 1;
      float l;
      if (lse_in) {
        l = lse_in[r];
      } else {
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) mx = std::max(mx, row[j] * scale);
        float sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(row[j] * scale - mx);
        l = mx + std::log(sum);
        lse_out[r] = l;
      }
      for (int64_t j = 0; j < n; ++j) row[j] = std::exp(row[j] * scale - l);
      for (int64_t j = n; j < keys; ++j) row[j] = 0.0f;
    }
  }

  void flash_attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                               const AttentionDims& a) override {
    const int64_t B = a.B, T = a.T, H = a.H, d = a.d, g = a.H / a.Hkv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
#pragma omp parallel for schedule(static) if (B * H > 1)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H, kv = (h / g) * d;
      RowMat s;
      for (int64_t i0 = 0; i0 < T; i0 += kFlashRows) {
        const int64_t rows = std::min(kFlashRows, T - i0), keys = i0 + rows;
        CSMap qb(q + (b * T + i0) * a.ldq + h * d, rows, d, Stride(a.ldq));
        CSMap kp(k + b * T * a.ldkv + kv, keys, d, Stride(a.ldkv)), vp(v + b * T * a.ldkv + kv, keys, d, Stride(a.ldkv));
        s.noalias() = qb * kp.transpose();
        flash_probs(s.data(), rows, keys, i0, scale, lse + bh * T + i0, nullptr);
        SMap(out + (b * T + i0) * H * d + h * d, rows, d, Stride(H * d)).noalias() = s * vp;
      }
    }
  }

  // Parallel over (sample, key/value head) as gqa_attention_backward; D_i = dout_i . out_i replaces
  // the row sums of p * dp, and p is recomputed from lse.
  void flash_attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* out,
                                const float* lse, float* dq, float* dk, float* dv, const AttentionDims& a) override {
    const int64_t B = a.B, T = a.T, H = a.H, Hkv = a.Hkv, d = a.d, g = a.H / a.Hkv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
#pragma omp parallel for schedule(static) if (B * Hkv > 1)
    for (int64_t bj = 0; bj < B * Hkv; ++bj) {
      const int64_t b = bj / Hkv, kv = (bj % Hkv) * d;
      RowMat p, dp;
      for (int64_t h = (bj % Hkv) * g; h < (bj % Hkv + 1) * g; ++h) {
        for (int64_t i0 = 0; i0 < T; i0 += kFlashRows) {
          const int64_t rows = std::min(kFlashRows, T - i0), keys = i0 + rows;
          CSMap kp(k + b * T * a.ldkv + kv, keys, d, Stride(a.ldkv)), vp(v + b * T * a.ldkv + kv, keys, d, Stride(a.ldkv));
          SMap dkp(dk + b * T * a.ldkv + kv, keys, d, Stride(a.ldkv)), dvp(dv + b * T * a.ldkv + kv, keys, d, Stride(a.ldkv));
          CSMap qb(q + (b * T + i0) * a.ldq + h * d, rows, d, Stride(a.ldq));
          SMap dqb(dq + (b * T + i0) * a.ldq + h * d, rows, d, Stride(a.ldq));
          CSMap dob(dout + (b * T + i0) * H * d + h * d, rows, d, Stride(H * d));
          CSMap ob(out + (b * T + i0) * H * d + h * d, rows, d, Stride(H * d));
          p.noalias() = qb * kp.transpose();
          flash_probs(p.data(), rows, keys, i0, scale, nullptr, lse + (b * H + h) * T + i0);
          dp.noalias() = dob * vp.transpose();
          for (int64_t r = 0; r < rows; ++r) {
            const float D = dob.row(r).dot(ob.row(r));
            float* dr = dp.data() + r * keys;
            const float* pr = p.data() + r * keys;
            for (int64_t j = 0; j < keys; ++j) dr[j] = pr[j] * (dr[j] - D) * scale;
          }
          dqb.noalias() += dp * kp;
          dkp.noalias() += dp.transpose() * qb;
          dvp.noalias() += p.transpose() * dob;
        }
      }
    }
  }

  void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols,
                       float eps) override {
#pragma omp parallel for schedule(static) if (rows * cols > kChunk)
    for (int64_t r = 0; r < rows; ++r) {
      Eigen::Map<const Eigen::ArrayXf> xr(x + r * cols, cols), wr(w, cols);
      const float s = 1.0f / std::sqrt(xr.square().mean() + eps);
      Eigen::Map<Eigen::ArrayXf>(y + r * cols, cols) = (xr * s) * wr;
      rstd[r] = s;
    }
  }

  void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                        int64_t rows, int64_t cols) override {
    if (dx) {
#pragma omp parallel for schedule(static) if (rows * cols > kChunk)
      for (int64_t r = 0; r < rows; ++r) {
        Eigen::Map<const Eigen::ArrayXf> xr(x + r * cols, cols), dyr(dy + r * cols, cols), wr(w, cols);
        const float s = rstd[r];
        const Eigen::ArrayXf dn = dyr * wr;
        const float mean_dn_n = (dn * xr).mean() * s;  // mean(dn * n) with n = x * rstd
        Eigen::Map<Eigen::ArrayXf>(dx + r * cols, cols) += s * (dn - xr * (s * mean_dn_n));
      }
    }
    if (dw) {
      parallel_ranges(cols, 32, [&](int64_t c0, int64_t c1) {
        for (int64_t r = 0; r < rows; ++r) {
          const float* xr = x + r * cols;
          const float* dyr = dy + r * cols;
          for (int64_t c = c0; c < c1; ++c) dw[c] += dyr[c] * (xr[c] * rstd[r]);
        }
      });
    }
  }

  void rope(const float* x, float* y, int64_t B, int64_t T, int64_t heads, int64_t d, float theta,
            bool transpose) override {
    const int64_t half = d / 2, C = heads * d;
    std::vector<float> cs(static_cast<size_t>(T * half)), sn(cs.size());
    for (int64_t i = 0; i < half; ++i) {
      const float inv_freq = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(d));
      for (int64_t t = 0; t < T; ++t) {
        const float ang = static_cast<float>(t) * inv_freq;
        cs[t * half + i] = std::cos(ang);
        sn[t * half + i] = std::sin(ang);
      }
    }
#pragma omp parallel for schedule(static) if (B * T * C > kChunk)
    for (int64_t row = 0; row < B * T; ++row) {
      const float* c = cs.data() + (row % T) * half;
      const float* s = sn.data() + (row % T) * half;
      for (int64_t h = 0; h < heads; ++h) {
        const float* xr = x + row * C + h * d;
        float* yr = y + row * C + h * d;
        for (int64_t i = 0; i < half; ++i) {
          const float a = xr[i], b = xr[i + half];
          if (transpose) {
            yr[i] += a * c[i] + b * s[i];
            yr[i + half] += b * c[i] - a * s[i];
          } else {
            yr[i] = a * c[i] - b * s[i];
            yr[i + half] = b * c[i] + a * s[i];
          }
        }
      }
    }
  }

  void swiglu_forward(const float* g, const float* u, float* y, int64_t n) override {
    const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t b = c * kChunk, len = std::min(kChunk, n - b);
      Eigen::Map<const Eigen::ArrayXf> gv(g + b, len), uv(u + b, len);
      Eigen::Map<Eigen::ArrayXf>(y + b, len) = gv / (1.0f + (-gv).exp()) * uv;
    }
  }

  void swiglu_backward(const float* g, const float* u, const float* dy, float* dg, float* du, int64_t n) override {
    const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t b = c * kChunk, len = std::min(kChunk, n - b);
      Eigen::Map<const Eigen::ArrayXf> gv(g + b, len), uv(u + b, len), dyv(dy + b, len);
      const Eigen::ArrayXf sig = 1.0f / (1.0f + (-gv).exp());
      if (dg) Eigen::Map<Eigen::ArrayXf>(dg + b, len) += dyv * uv * (sig * (1.0f + gv * (1.0f - sig)));
      if (du) Eigen::Map<Eigen::ArrayXf>(du + b, len) += dyv * (gv * sig);
    }
  }

  // Softmax cross-entropy with Eigen's vectorized exp; the row's log-sum-exp is accumulated in f64.
  static double row_logsumexp(const float* row, int64_t V) {
    Eigen::Map<const Eigen::ArrayXf> r(row, V);
    const float mx = r.maxCoeff();
    return static_cast<double>(mx) + std::log((r - mx).exp().template cast<double>().sum());
  }

  void sum_to_scalar(const float* x, int64_t n, double divisor, float* out) override {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += x[i];
    out[0] = static_cast<float>(s / divisor);
  }

  void cross_entropy_forward(const float* logits, const int32_t* targets, float* losses, int64_t N, int64_t V,
                             int64_t Vp) override {
#pragma omp parallel for schedule(static) if (N * V > kChunk)
    for (int64_t n = 0; n < N; ++n) {
      const float* row = logits + n * Vp;
      losses[n] = static_cast<float>(row_logsumexp(row, V) - row[targets[n]]);
    }
  }

  void cross_entropy_backward(const float* logits, const int32_t* targets, float dloss, float* dlogits, int64_t N,
                              int64_t V, int64_t Vp) override {
#pragma omp parallel for schedule(static) if (N * V > kChunk)
    for (int64_t n = 0; n < N; ++n) {
      const float* row = logits + n * Vp;
      const float lse = static_cast<float>(row_logsumexp(row, V));
      Eigen::Map<const Eigen::ArrayXf> r(row, V);
      Eigen::Map<Eigen::ArrayXf> d(dlogits + n * Vp, V);
      d += dloss * (r - lse).exp();
      dlogits[n * Vp + targets[n]] -= dloss;
    }
  }

  void cross_entropy_fused(float* logits, const int32_t* targets, float* losses, float dloss, bool grad, int64_t N,
                           int64_t V, int64_t Vp) override {
#pragma omp parallel for schedule(static) if (N * V > kChunk)
    for (int64_t n = 0; n < N; ++n) {
      float* row = logits + n * Vp;
      const double lse = row_logsumexp(row, V);
      losses[n] = static_cast<float>(lse - row[targets[n]]);
      if (!grad) continue;
      Eigen::Map<Eigen::ArrayXf> r(row, V);  // in place: the same expression cross_entropy_backward adds into 0
      r = dloss * (r - static_cast<float>(lse)).exp();
      row[targets[n]] -= dloss;
      std::fill(row + V, row + Vp, 0.0f);
    }
  }

 private:
  std::vector<float> widened_a_, widened_b_;  // gemm_bf16's f32 copies of its operands (reused)
};

}  // namespace

Kernels& cuda_kernels();  // runtime/cuda/kernels_cuda.cu, or the stub below when built without CUDA

Kernels& kernels(Device device) {
  static CpuKernels cpu;
  if (device == Device::CPU) return cpu;
  return cuda_kernels();
}

int cpu_threads() { return omp_get_max_threads(); }

void set_cpu_threads(int n) {
  n = std::max(1, n);
  omp_set_num_threads(n);
  Eigen::setNbThreads(n);
}

}  // namespace mfsdp
