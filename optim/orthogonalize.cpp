// CPU orthogonalizers (Newton-Schulz 5, Polar Express, Gram Newton-Schulz) on single-threaded
// GEMM kernels (Eigen's; oneDNN's SGEMM for matrices with at least kLibraryGemmMinRows rows) run
// in fixed bands under OpenMP: bitwise independent of the thread count.
#include "optim/orthogonalize.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "optim/clip.h"
#include "optim/muon.h"
#include "optim/newton_schulz_bf16.h"
#include "runtime/core/dtype.h"
#include "runtime/cpu_sgemm_serial.h"

namespace mfsdp {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<RowMat>;
using ConstMatMap = Eigen::Map<const RowMat>;
// The m x m matrices (Gram matrix and polynomials in it) are symmetric; their buffers are mapped
// column-major (for a symmetric matrix the layout is immaterial, and it keeps GEMMs on Eigen's
// fast path).
using ColMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;
using SymMap = Eigen::Map<ColMat>;

/// Scratch reused across calls on one thread (grown, never shrunk): no allocation per step.
/// x, y: [m, n] iterates; a, b: [m, m] (A and B of the quintic step, R and Z of the Gram form);
/// q, t, rz: [m, m] (Gram form only: Q, a product temporary, R Z).
struct OrthoScratch {
  std::vector<float> x, y, a, b, q, t, rz;
  static void grow(std::vector<float>& v, int64_t size) {
    if (static_cast<int64_t>(v.size()) < size) v.resize(static_cast<size_t>(size));
  }
  void reserve(int64_t m, int64_t n, bool gram) {
    grow(x, m * n);
    grow(y, m * n);
    grow(a, m * m);
    grow(b, m * m);
    if (gram) {
      grow(q, m * m);
      grow(t, m * m);
      grow(rz, m * m);
    }
  }
};

OrthoScratch& ortho_scratch() {
  thread_local OrthoScratch s;
  return s;
}

// Work is split into a fixed number of bands that depend only on the shape (never on the thread
// count) and run under `omp parallel for schedule(dynamic)`, each band one single-threaded GEMM with
// the whole K reduction (gemm_serial below). So the result is bitwise independent of the number of
// OpenMP threads, and the dynamic schedule tolerates a busy core better than one split GEMM.
constexpr int64_t kSymBandRows = 128;   // rows of A per band of a symmetric product (max 16 bands)
constexpr int64_t kColBandWidth = 192;  // columns of X per band of B X (max 32 bands)
// From this many rows (m, the small side) on, the f32 products run on oneDNN's SGEMM (about 20%
// faster than Eigen's kernel on one AVX-512 core at 768), and a symmetric product is cut into
// row bands of kLibrarySymBandRows rows, each one GEMM over the band's rows up to its diagonal
// (the diagonal block computed whole: kLibrarySymBandRows / m extra work). Smaller matrices keep
// Eigen's kernels and bands, so their results are the same bits as before the switch.
constexpr int64_t kLibraryGemmMinRows = 256;
constexpr int64_t kLibrarySymBandRows = 64;

/// Whether the f32 products of an orthogonalization whose Gram matrix is m x m use oneDNN.
bool library_gemm(int64_t m) { return m >= kLibraryGemmMinRows && cpu_sgemm_serial_available(); }

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

/// dst = alpha * lhs * rhs + beta * dst on the calling thread only, through oneDNN's row-major
/// SGEMM: a column-major block is handed over as the transpose of its row-major storage, and a
/// column-major dst is computed as dst^T = rhs^T lhs^T. Operands as for gemm_serial.
template <class Dst, class Lhs, class Rhs>
void gemm_library(Dst&& dst, const Lhs& lhs, const Rhs& rhs, float alpha, float beta) {
  using D = std::remove_reference_t<Dst>;
  constexpr bool kLhsRow = Lhs::Flags & Eigen::RowMajorBit;
  constexpr bool kRhsRow = Rhs::Flags & Eigen::RowMajorBit;
  constexpr bool kDstRow = D::Flags & Eigen::RowMajorBit;
  const int64_t rows = dst.rows(), cols = dst.cols(), depth = lhs.cols();
  if (kDstRow)
    cpu_sgemm_serial(!kLhsRow, !kRhsRow, rows, cols, depth, alpha, lhs.data(), lhs.outerStride(), rhs.data(),
                     rhs.outerStride(), beta, dst.data(), dst.outerStride());
  else
    cpu_sgemm_serial(kRhsRow, kLhsRow, cols, rows, depth, alpha, rhs.data(), rhs.outerStride(), lhs.data(),
                     lhs.outerStride(), beta, dst.data(), dst.outerStride());
}

/// Copies the lower triangle of the symmetric out [m, m] into its upper triangle.
void mirror_lower(SymMap out) {
  const int64_t m = out.rows();
  float* o = out.data();  // column-major: (i, j) lives at j*m + i
#pragma omp parallel for schedule(static)
  for (int64_t j = 1; j < m; ++j)
    for (int64_t i = 0; i < j; ++i) o[j * m + i] = o[i * m + j];
}

/// symmetric_product on oneDNN's SGEMM: row bands of kLibrarySymBandRows rows, band b one GEMM
/// out[r0:r0+h, 0:r0+h] = L[r0:r0+h, :] R[:, 0:r0+h] (largest bands first), then the mirror.
template <class Lhs, class Rhs>
void symmetric_product_library(const Lhs& L, const Rhs& R, SymMap out) {
  const int64_t m = out.rows();
  const int64_t bands = std::max<int64_t>(1, (m + kLibrarySymBandRows - 1) / kLibrarySymBandRows);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < bands; ++i) {
    const int64_t b = bands - 1 - i;
    const int64_t r0 = m * b / bands, h = m * (b + 1) / bands - r0;
    gemm_library(out.block(r0, 0, h, r0 + h), L.middleRows(r0, h), R.leftCols(r0 + h), 1.0f, 0.0f);
  }
  mirror_lower(out);
}

/// out [m, m] = L [m, k] * R [k, m] for a product known to be symmetric (X X^T, A A, and products
/// of commuting polynomials in one Gram matrix): computes the lower triangle only (in equal-area
/// row bands: a rectangle GEMM plus a triangular GEMM each, about half the FLOPs) and mirrors it
/// into the upper triangle.
template <class Lhs, class Rhs>
void symmetric_product(const Lhs& L, const Rhs& R, SymMap out) {
  const int64_t m = out.rows();
  if (library_gemm(m)) {
    symmetric_product_library(L, R, out);
    return;
  }
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
  mirror_lower(out);
}

/// Y [m, n] = a*X + B X (B [m, m]), in column bands of X. a == 0 gives exactly B X.
/// (Band GEMMs on oneDNN when library_gemm(m), else Eigen's.)
void left_multiply(const MatMap& X, const SymMap& B, MatMap Y, float a) {
  const int64_t n = X.cols();
  const bool library = library_gemm(B.rows());
  const int64_t bands = std::clamp<int64_t>(n / kColBandWidth, 1, 32);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < bands; ++b) {
    const int64_t c0 = n * b / bands, w = n * (b + 1) / bands - c0;
    if (a == 0.0f)
      Y.middleCols(c0, w).setZero();
    else
      Y.middleCols(c0, w) = a * X.middleCols(c0, w);
    if (library)
      gemm_library(Y.middleCols(c0, w), B, X.middleCols(c0, w), 1.0f, 1.0f);
    else
      gemm_serial(Y.middleCols(c0, w), B, X.middleCols(c0, w), 1.0f);
  }
}

struct Coeffs32 {
  float a, b, c;
};

Coeffs32 coeffs32(Orthogonalizer method, int t) {
  const QuinticCoeffs k = orthogonalizer_coeffs(method, t);
  return {static_cast<float>(k.a), static_cast<float>(k.b), static_cast<float>(k.c)};
}

/// `steps` quintic steps X <- a X + (b A + c A^2) X on X [m, n] (m <= n) in s.x / s.y; returns
/// the buffer holding the result.
float* quintic_iterations(OrthoScratch& s, int64_t m, int64_t n, int steps, Orthogonalizer method) {
  SymMap A(s.a.data(), m, m);
  SymMap B(s.b.data(), m, m);
  float* xp = s.x.data();
  float* yp = s.y.data();
  for (int it = 0; it < steps; ++it) {
    const Coeffs32 k = coeffs32(method, it);
    MatMap Xc(xp, m, n);
    MatMap Yc(yp, m, n);
    symmetric_product(Xc, Xc.transpose(), A);  // A = X X^T
    symmetric_product(A, A, B);                // B = A A
    B = k.c * B + k.b * A;                     // B = b*A + c*A A
    left_multiply(Xc, B, Yc, k.a);             // X' = a*X + B X
    std::swap(xp, yp);
  }
  return xp;
}

/// The bf16 quintic steps (newton_schulz_bf16.h) on s.x and s.y; returns the buffer holding X.
float* bf16_iterations(OrthoScratch& s, int64_t m, int64_t n, int steps, Orthogonalizer method) {
  std::vector<QuinticStep> ks;
  for (int it = 0; it < steps; ++it) {
    const Coeffs32 k = coeffs32(method, it);
    ks.push_back({k.a, k.b, k.c});
  }
  return quintic_iterations_bf16(s.x.data(), s.y.data(), m, n, ks);
}

/// Gram Newton-Schulz (see orthogonalize.h): the same polynomials as quintic_iterations, with the
/// loop on R = X X^T and Q (both [m, m]) and restarts; returns the buffer holding the result.
float* gram_iterations(OrthoScratch& s, int64_t m, int64_t n, int steps, Orthogonalizer method) {
  float* xp = s.x.data();
  float* yp = s.y.data();
  if (steps == 0) return xp;
  SymMap R(s.a.data(), m, m);
  SymMap Z(s.b.data(), m, m);
  SymMap Q(s.q.data(), m, m);
  SymMap T(s.t.data(), m, m);
  SymMap RZ(s.rz.data(), m, m);
  symmetric_product(MatMap(xp, m, n), MatMap(xp, m, n).transpose(), R);  // R = X X^T
  bool have_q = false;
  for (int it = 0; it < steps; ++it) {
    const Coeffs32 k = coeffs32(method, it);
    if (it > 0 && gram_newton_schulz_restarts_before(it)) {
      MatMap Xc(xp, m, n);
      left_multiply(Xc, Q, MatMap(yp, m, n), 0.0f);  // X <- Q X
      std::swap(xp, yp);
      MatMap Xn(xp, m, n);
      symmetric_product(Xn, Xn.transpose(), R);  // R <- X X^T
      have_q = false;                            // Q <- I
    }
    symmetric_product(R, R, Z);
    Z = k.c * Z + k.b * R;  // Z = b R + c R^2
    if (!have_q) {
      Q = Z;  // Q = I * (a I + Z)
      Q.diagonal().array() += k.a;
      have_q = true;
    } else {
      symmetric_product(Q, Z, T);
      Q = k.a * Q + T;  // Q <- Q (a I + Z)
    }
    const bool last_of_segment = it + 1 == steps || gram_newton_schulz_restarts_before(it + 1);
    if (!last_of_segment) {
      symmetric_product(R, Z, T);
      RZ = k.a * R + T;  // RZ = R (a I + Z)
      symmetric_product(Z, RZ, T);
      R = k.a * RZ + T;  // R <- (a I + Z) R (a I + Z)
    }
  }
  left_multiply(MatMap(xp, m, n), Q, MatMap(yp, m, n), 0.0f);  // X <- Q X
  return yp;
}

void check_args(const char* op, int64_t rows, int64_t cols, int steps, Orthogonalizer method, NsDType dtype) {
  if (dtype == NsDType::bf16 && method == Orthogonalizer::gram_newton_schulz)
    throw std::invalid_argument(std::string("[") + op + "] ns_dtype bf16 is not supported by gram_newton_schulz");
  if (rows < 0 || cols < 0)
    throw std::invalid_argument(std::string("[") + op + "] negative shape [" + std::to_string(rows) +
                                ", " + std::to_string(cols) + "]");
  if (steps < 0)
    throw std::invalid_argument(std::string("[") + op + "] steps " + std::to_string(steps) + " is negative");
}

/// dst = alpha * src (transpose: alpha * src^T, dst [cols, rows]) for the row-major src [rows, cols],
/// over OpenMP (64 x 64 tiles when transposing): one f32 multiply per element, as Eigen's scaled
/// copy computes it, so the bits do not depend on the thread count.
void scaled_copy(const float* src, int64_t rows, int64_t cols, bool transpose, float alpha, float* dst) {
  if (!transpose) {
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t(1) << 16))
    for (int64_t i = 0; i < rows * cols; ++i) dst[i] = alpha * src[i];
    return;
  }
  constexpr int64_t kTile = 64;
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t(1) << 16))
  for (int64_t t = 0; t < row_tiles * col_tiles; ++t) {
    const int64_t r0 = t / col_tiles * kTile, c0 = t % col_tiles * kTile;
    const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] = alpha * src[r * cols + c];
  }
}

/// orthogonalize_cpu after argument checks and counting.
void orthogonalize_one(const float* G, float* out, int64_t rows, int64_t cols, int steps,
                       Orthogonalizer method, NsDType dtype) {
  if (rows == 0 || cols == 0) return;
  const bool transposed = rows > cols;
  const int64_t m = transposed ? cols : rows;  // m <= n: X X^T is the small Gram matrix
  const int64_t n = transposed ? rows : cols;
  const bool gram = method == Orthogonalizer::gram_newton_schulz;
  OrthoScratch& s = ortho_scratch();
  s.reserve(m, n, gram);

  // Normalize in f32 (norm accumulated in f64) before anything else. For newton_schulz5 the scale
  // is 1.0 (norm * 1.0 == norm exactly) and the eps the f32 constant, as newton_schulz_cpu always did.
  const double norm = std::sqrt(sum_of_squares_cpu(G, rows * cols));
  const double denom = method == Orthogonalizer::newton_schulz5
                           ? norm + static_cast<double>(kNewtonSchulzNormEps)
                           : norm * kPolarExpressNormScale + kPolarExpressNormEps;
  const float inv = static_cast<float>(1.0 / denom);
  scaled_copy(G, rows, cols, transposed, inv, s.x.data());  // X = G / denom, [m, n]

  float* result = gram                    ? gram_iterations(s, m, n, steps, method)
                  : dtype == NsDType::bf16 ? bf16_iterations(s, m, n, steps, method)
                                           : quintic_iterations(s, m, n, steps, method);

  scaled_copy(result, m, n, transposed, 1.0f, out);
}

}  // namespace



QuinticCoeffs orthogonalizer_coeffs(Orthogonalizer method, int t) {
  if (method == Orthogonalizer::newton_schulz5) return {kNewtonSchulzA, kNewtonSchulzB, kNewtonSchulzC};
  const size_t i = std::min<size_t>(static_cast<size_t>(std::max(t, 0)), kPolarExpressCoeffs.size() - 1);
  return kPolarExpressCoeffs[i];
}

void orthogonalize_cpu(const float* G, float* out, int64_t rows, int64_t cols, int steps,
                       Orthogonalizer method, NsDType dtype) {
  check_args("orthogonalize_cpu", rows, cols, steps, method, dtype);
  detail::count_newton_schulz_call();
  if (rows != 0 && cols != 0 && (G == nullptr || out == nullptr))
    throw std::invalid_argument("[orthogonalize_cpu] null buffer for a [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "] matrix");
  orthogonalize_one(G, out, rows, cols, steps, method, dtype);
}

void orthogonalize_batched_cpu(const float* const* G, float* const* out, int64_t count, int64_t rows,
                               int64_t cols, int steps, Orthogonalizer method, NsDType dtype) {
  check_args("orthogonalize_batched_cpu", rows, cols, steps, method, dtype);
  if (count < 0)
    throw std::invalid_argument("[orthogonalize_batched_cpu] count " + std::to_string(count) + " is negative");
  if (count > 0 && (G == nullptr || out == nullptr))
    throw std::invalid_argument("[orthogonalize_batched_cpu] null pointer array");
  const bool empty = rows == 0 || cols == 0;
  for (int64_t i = 0; i < count; ++i)
    if (!empty && (G[i] == nullptr || out[i] == nullptr))
      throw std::invalid_argument("[orthogonalize_batched_cpu] null buffer for matrix " + std::to_string(i));
  for (int64_t i = 0; i < count; ++i) detail::count_newton_schulz_call();
  // Small matrices have too little work per band to use the threads: run the batch in parallel
  // instead (the nested kernels then run on one thread each; bands keep the bits the same).
  // bf16: every call runs at the top level (the bf16 GEMM threads each product itself).
  // Not `parallel for ... if (across)`: a serialized region still opens a nesting level, and every
  // parallel region inside it (the bands, oneDNN's GEMMs) would then start and end threads of its
  // own: thousands of thread creations per optimizer step.
  const bool across = dtype == NsDType::f32 && count > 1 && std::min(rows, cols) < 2 * kSymBandRows;
  if (!across) {
    for (int64_t i = 0; i < count; ++i) orthogonalize_one(G[i], out[i], rows, cols, steps, method, dtype);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < count; ++i) orthogonalize_one(G[i], out[i], rows, cols, steps, method, dtype);
}

void orthogonalize_strided_cpu(const float* G, float* out, int64_t count, int64_t rows, int64_t cols,
                               int steps, Orthogonalizer method, NsDType dtype) {
  check_args("orthogonalize_strided_cpu", rows, cols, steps, method, dtype);
  if (count < 0)
    throw std::invalid_argument("[orthogonalize_strided_cpu] count " + std::to_string(count) + " is negative");
  if (count > 0 && rows > 0 && cols > 0 && (G == nullptr || out == nullptr))
    throw std::invalid_argument("[orthogonalize_strided_cpu] null buffer");
  std::vector<const float*> gs(static_cast<size_t>(count));
  std::vector<float*> os(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    gs[static_cast<size_t>(i)] = G == nullptr ? nullptr : G + i * rows * cols;
    os[static_cast<size_t>(i)] = out == nullptr ? nullptr : out + i * rows * cols;
  }
  orthogonalize_batched_cpu(gs.data(), os.data(), count, rows, cols, steps, method, dtype);
}

void orthogonalize_heads_cpu(const float* G, float* out, int64_t rows, int64_t cols, int64_t head_dim,
                             int steps, Orthogonalizer method, NsDType dtype) {
  check_args("orthogonalize_heads_cpu", rows, cols, steps, method, dtype);
  if (head_dim < 1 || rows % head_dim != 0)
    throw std::invalid_argument("[orthogonalize_heads_cpu] head_dim " + std::to_string(head_dim) +
                                " must be >= 1 and divide rows " + std::to_string(rows));
  orthogonalize_strided_cpu(G, out, rows / head_dim, head_dim, cols, steps, method, dtype);
}

}  // namespace mfsdp
