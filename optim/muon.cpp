// CPU Muon: Newton-Schulz on single-threaded Eigen GEMM kernels run in fixed bands under OpenMP
// (bitwise independent of the thread count), momentum and update in OpenMP loops.
#include "optim/muon.h"

#include <Eigen/Dense>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "optim/clip.h"

namespace mfsdp {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<RowMat>;
using ConstMatMap = Eigen::Map<const RowMat>;
// The Gram matrices A = X X^T and B are symmetric; their buffers are mapped column-major (for a
// symmetric matrix the layout is immaterial, and it keeps GEMMs on Eigen's fast path).
using ColMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;
using SymMap = Eigen::Map<ColMat>;

std::atomic<int64_t> g_ns_calls{0};

/// Scratch reused across calls on one thread (grown, never shrunk): no allocation per step.
struct NsScratch {
  std::vector<float> x, y, a, b;
  void reserve(int64_t m, int64_t n) {
    auto grow = [](std::vector<float>& v, int64_t size) {
      if (static_cast<int64_t>(v.size()) < size) v.resize(static_cast<size_t>(size));
    };
    grow(x, m * n);
    grow(y, m * n);
    grow(a, m * m);
    grow(b, m * m);
  }
};

NsScratch& ns_scratch() {
  thread_local NsScratch s;
  return s;
}

std::vector<float>& update_scratch() {
  thread_local std::vector<float> u;
  return u;
}

// Work is split into a fixed number of bands that depend only on the shape (never on the thread
// count) and run under `omp parallel for schedule(dynamic)`, each band one single-threaded GEMM with
// the whole K reduction (gemm_serial below). So the result is bitwise independent of the number of
// OpenMP threads, and the dynamic schedule tolerates a busy core better than one split GEMM.
constexpr int64_t kSymBandRows = 128;   // rows of A per band of a symmetric product (max 16 bands)
constexpr int64_t kColBandWidth = 192;  // columns of X per band of B X (max 32 bands)

/// dst += alpha * lhs * rhs on the calling thread only: Eigen's blocked GEMM kernel with the
/// single-thread blocking, called directly. Eigen's own product expression would go through its
/// OpenMP parallelizer, which splits the product (and re-derives the K blocking from the thread
/// count) whenever it runs in a team of one thread while Eigen::nbThreads() > 1 (set_cpu_threads
/// sets it; a nested call or OMP_DYNAMIC gives such a team), so its bits could depend on the thread
/// count. Always the GEMM kernel (no GEMV / coefficient-based fallback for thin or tiny shapes).
/// lhs, rhs, dst: Eigen blocks with direct access and unit inner stride.
template <class Dst, class Lhs, class Rhs>
void gemm_serial(Dst&& dst, const Lhs& lhs, const Rhs& rhs, float alpha) {
  namespace ei = Eigen::internal;
  using Index = Eigen::Index;
  using D = std::remove_reference_t<Dst>;
  const Index rows = dst.rows(), cols = dst.cols(), depth = lhs.cols();
  if (rows == 0 || cols == 0 || depth == 0) return;
  constexpr int kLhsOrder = (Lhs::Flags & Eigen::RowMajorBit) ? Eigen::RowMajor : Eigen::ColMajor;
  constexpr int kRhsOrder = (Rhs::Flags & Eigen::RowMajorBit) ? Eigen::RowMajor : Eigen::ColMajor;
  constexpr int kDstOrder = (D::Flags & Eigen::RowMajorBit) ? Eigen::RowMajor : Eigen::ColMajor;
  static_assert(Lhs::InnerStrideAtCompileTime == 1 && Rhs::InnerStrideAtCompileTime == 1 &&
                    D::InnerStrideAtCompileTime == 1,
                "gemm_serial: operands need unit inner stride");
  ei::gemm_blocking_space<kDstOrder, float, float, Eigen::Dynamic, Eigen::Dynamic, Eigen::Dynamic> blocking(
      rows, cols, depth, 1, true);
  ei::general_matrix_matrix_product<Index, float, kLhsOrder, false, float, kRhsOrder, false, kDstOrder, 1>::run(
      rows, cols, depth, lhs.data(), lhs.outerStride(), rhs.data(), rhs.outerStride(), dst.data(), 1,
      dst.outerStride(), alpha, blocking, nullptr);
}

/// out [m, m] = L [m, k] * R [k, m] for a product known to be symmetric (X X^T, A A): computes the
/// lower triangle only (in equal-area row bands: a rectangle GEMM plus a triangular GEMM each, about
/// half the FLOPs) and mirrors it into the upper triangle.
template <class Lhs, class Rhs>
void symmetric_product(const Lhs& L, const Rhs& R, SymMap out) {
  const int64_t m = out.rows();
  const int64_t bands = std::clamp<int64_t>(m / kSymBandRows, 1, 16);
  int64_t cut[17];
  for (int64_t b = 0; b <= bands; ++b)
    cut[b] = static_cast<int64_t>(std::llround(static_cast<double>(m) * std::sqrt(static_cast<double>(b) / bands)));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < bands; ++b) {
    const int64_t r0 = cut[b], h = cut[b + 1] - cut[b];
    if (h <= 0) continue;
    if (r0 > 0) {
      out.block(r0, 0, h, r0).setZero();
      gemm_serial(out.block(r0, 0, h, r0), L.middleRows(r0, h), R.leftCols(r0), 1.0f);
    }
    // Eigen's triangular product (general_matrix_matrix_triangular_product) is always sequential.
    out.block(r0, r0, h, h).template triangularView<Eigen::Lower>() = L.middleRows(r0, h) * R.middleCols(r0, h);
  }
  float* o = out.data();  // column-major: (i, j) lives at j*m + i
#pragma omp parallel for schedule(static)
  for (int64_t j = 1; j < m; ++j)
    for (int64_t i = 0; i < j; ++i) o[j * m + i] = o[i * m + j];
}

/// Y [m, n] = a*X + B X, in column bands of X.
void quintic_update(const MatMap& X, const SymMap& B, MatMap Y) {
  const int64_t n = X.cols();
  const int64_t bands = std::clamp<int64_t>(n / kColBandWidth, 1, 32);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < bands; ++b) {
    const int64_t c0 = n * b / bands, w = n * (b + 1) / bands - c0;
    Y.middleCols(c0, w) = kNewtonSchulzA * X.middleCols(c0, w);
    gemm_serial(Y.middleCols(c0, w), B, X.middleCols(c0, w), 1.0f);
  }
}

void check_shape(const char* op, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument(std::string("[") + op + "] negative shape [" + std::to_string(rows) +
                                ", " + std::to_string(cols) + "]");
}

}  // namespace

MuonScaleRule parse_muon_scale_rule(const std::string& s) {
  if (s == "original") return MuonScaleRule::original;
  if (s == "match_rms_adamw") return MuonScaleRule::match_rms_adamw;
  throw std::invalid_argument("[parse_muon_scale_rule] unknown scale rule '" + s +
                              "' (expected original or match_rms_adamw)");
}

const char* muon_scale_rule_name(MuonScaleRule r) {
  return r == MuonScaleRule::original ? "original" : "match_rms_adamw";
}

int64_t newton_schulz_call_count() { return g_ns_calls.load(std::memory_order_relaxed); }
void reset_newton_schulz_call_count() { g_ns_calls.store(0, std::memory_order_relaxed); }

namespace detail {

void count_newton_schulz_call() { g_ns_calls.fetch_add(1, std::memory_order_relaxed); }

void validate_muon_options(const MuonOptions& opt, const char* op) {
  if (!(opt.momentum >= 0.0 && opt.momentum < 1.0))
    throw std::invalid_argument(std::string("[") + op + "] momentum " + std::to_string(opt.momentum) +
                                " is outside [0, 1)");
  if (opt.ns_steps < 0)
    throw std::invalid_argument(std::string("[") + op + "] ns_steps " + std::to_string(opt.ns_steps) +
                                " is negative");
  if (!std::isfinite(opt.weight_decay) || opt.weight_decay < 0.0)
    throw std::invalid_argument(std::string("[") + op + "] weight_decay " +
                                std::to_string(opt.weight_decay) + " must be finite and >= 0");
}

int64_t muon_block_count(int64_t rows, int64_t cols, const MuonOptions& opt, int qkv_blocks,
                         const char* op) {
  if (rows <= 0 || cols <= 0)
    throw std::invalid_argument(std::string("[") + op + "] matrix shape [" + std::to_string(rows) +
                                ", " + std::to_string(cols) + "] must be positive");
  if (qkv_blocks < 1)
    throw std::invalid_argument(std::string("[") + op + "] qkv_blocks " + std::to_string(qkv_blocks) +
                                " must be >= 1");
  if (!opt.split_qkv || qkv_blocks == 1) return 1;
  if (rows % qkv_blocks != 0)
    throw std::invalid_argument(std::string("[") + op + "] split_qkv: rows " + std::to_string(rows) +
                                " not divisible by qkv_blocks " + std::to_string(qkv_blocks));
  return qkv_blocks;
}

}  // namespace detail

double muon_scale(int64_t rows, int64_t cols, MuonScaleRule rule) {
  if (rows <= 0 || cols <= 0)
    throw std::invalid_argument("[muon_scale] shape [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "] must be positive");
  const double m = static_cast<double>(rows), n = static_cast<double>(cols);
  if (rule == MuonScaleRule::original) return std::sqrt(std::max(1.0, m / n));
  return 0.2 * std::sqrt(std::max(m, n));
}

void newton_schulz_cpu(const float* G, float* out, int64_t rows, int64_t cols, int steps) {
  check_shape("newton_schulz_cpu", rows, cols);
  if (steps < 0)
    throw std::invalid_argument("[newton_schulz_cpu] steps " + std::to_string(steps) + " is negative");
  detail::count_newton_schulz_call();
  if (rows == 0 || cols == 0) return;
  if (G == nullptr || out == nullptr)
    throw std::invalid_argument("[newton_schulz_cpu] null buffer for a [" + std::to_string(rows) +
                                ", " + std::to_string(cols) + "] matrix");

  const bool transposed = rows > cols;
  const int64_t m = transposed ? cols : rows;  // m <= n: A = X X^T is the small Gram matrix
  const int64_t n = transposed ? rows : cols;
  NsScratch& s = ns_scratch();
  s.reserve(m, n);

  // Normalize in f32 (norm accumulated in f64) before anything else.
  const double norm = std::sqrt(sum_of_squares_cpu(G, rows * cols));
  const float inv = static_cast<float>(1.0 / (norm + static_cast<double>(kNewtonSchulzNormEps)));
  ConstMatMap g(G, rows, cols);
  MatMap X(s.x.data(), m, n);
  if (transposed)
    X.noalias() = inv * g.transpose();
  else
    X.noalias() = inv * g;

  SymMap A(s.a.data(), m, m);
  SymMap B(s.b.data(), m, m);
  float* xp = s.x.data();
  float* yp = s.y.data();
  for (int it = 0; it < steps; ++it) {
    MatMap Xc(xp, m, n);
    MatMap Yc(yp, m, n);
    symmetric_product(Xc, Xc.transpose(), A);  // A = X X^T
    symmetric_product(A, A, B);                // B = A A
    B = kNewtonSchulzC * B + kNewtonSchulzB * A;  // B = b*A + c*A A
    quintic_update(Xc, B, Yc);                 // X' = a*X + B X
    std::swap(xp, yp);
  }

  MatMap o(out, rows, cols);
  MatMap Xf(xp, m, n);
  if (transposed)
    o.noalias() = Xf.transpose();
  else
    o = Xf;
}

void muon_step_cpu(float* W, const float* G, float* M, int64_t rows, int64_t cols, double lr,
                   const MuonOptions& opt, int qkv_blocks) {
  detail::validate_muon_options(opt, "muon_step_cpu");
  const int64_t blocks = detail::muon_block_count(rows, cols, opt, qkv_blocks, "muon_step_cpu");
  if (W == nullptr || G == nullptr || M == nullptr)
    throw std::invalid_argument("[muon_step_cpu] null W, G or M buffer");
  if (!std::isfinite(lr))
    throw std::invalid_argument("[muon_step_cpu] learning rate " + std::to_string(lr) + " is not finite");

  const int64_t numel = rows * cols;
  std::vector<float>& ubuf = update_scratch();
  if (static_cast<int64_t>(ubuf.size()) < numel) ubuf.resize(static_cast<size_t>(numel));
  float* U = ubuf.data();

  muon_momentum_cpu(G, M, U, numel, opt);

  // O overwrites U block by block (newton_schulz_cpu reads its input into scratch first).
  const int64_t brows = rows / blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    float* ub = U + b * brows * cols;
    newton_schulz_cpu(ub, ub, brows, cols, opt.ns_steps);
  }

  muon_apply_update_cpu(W, U, numel, lr, muon_scale(brows, cols, opt.scale_rule), opt.weight_decay);
}

void muon_momentum_cpu(const float* G, float* M, float* U, int64_t n, const MuonOptions& opt) {
  const float beta = static_cast<float>(opt.momentum);
  const float one_minus_beta = static_cast<float>(1.0 - opt.momentum);
  const bool nesterov = opt.nesterov;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float g = G[i];
    const float m = beta * M[i] + one_minus_beta * g;
    M[i] = m;
    U[i] = nesterov ? one_minus_beta * g + beta * m : m;
  }
}

void muon_apply_update_cpu(float* W, const float* O, int64_t n, double lr, double scale, double weight_decay) {
  const float decay = static_cast<float>(1.0 - lr * weight_decay);
  const float step = static_cast<float>(lr * scale);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) W[i] = W[i] * decay - step * O[i];
}

}  // namespace mfsdp
