// Fused causal grouped-query attention on CUDA (see flash_attention.h). f32 storage and math; a
// query row's (forward, dq) or key row's (dk, dv) vectors live in registers, split across kLanes
// threads, and the rows it meets stream through shared-memory tiles. Causality skips whole tiles
// above the diagonal.
#include "runtime/cuda/flash_attention.h"

#include <cooperative_groups.h>

#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "runtime/core/cuda_check.h"

namespace mfsdp::cuda_flash {
namespace {

namespace cg = cooperative_groups;

constexpr int kRows = 64;   // rows a block owns (query rows forward and for dq, key rows for dk/dv)
constexpr int kLanes = 8;   // threads per row: element c of a row's d-vector lives on lane c % kLanes
constexpr int kThreads = kRows * kLanes;
constexpr int kTile = 32;   // rows per shared-memory tile (key rows forward and for dq, query rows for dk/dv)
using RowGroup = cg::thread_block_tile<kLanes>;

// The kLanes threads of one row, and this thread's place among them.
__device__ __forceinline__ RowGroup row_group() { return cg::tiled_partition<kLanes>(cg::this_thread_block()); }
__device__ __forceinline__ int row_of_thread() { return static_cast<int>(threadIdx.x) / kLanes; }

// Sum over the row's lanes by a butterfly: every lane ends with the same bits (each step adds the
// same two values on both lanes of a pair), so the lanes' online-softmax state never diverges.
__device__ __forceinline__ float row_sum(const RowGroup& g, float x) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) x += g.shfl_xor(x, o);
  return x;
}

// tile[r][c] = base[(r0 + r) * ld + c] for rows < T and columns < d, else 0.
template <int DMAX>
__device__ __forceinline__ void load_tile(float (*tile)[DMAX], const float* __restrict__ base, int64_t ld, int r0,
                                          int T, int d) {
  for (int e = threadIdx.x; e < kTile * DMAX; e += blockDim.x) {
    const int r = e / DMAX, c = e % DMAX, row = r0 + r;
    tile[r][c] = (row < T && c < d) ? base[static_cast<int64_t>(row) * ld + c] : 0.f;
  }
}

// This lane's E elements of a row: dst[e] = src[e * kLanes + lane] (0 past d).
template <int E>
__device__ __forceinline__ void load_row(float (&dst)[E], const float* __restrict__ src, int d, int lane) {
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int c = e * kLanes + lane;
    dst[e] = c < d ? src[c] : 0.f;
  }
}

// This lane's part of a . row (row in shared memory, full width), four independent partial sums.
template <int E>
__device__ __forceinline__ float dot_part(const float (&a)[E], const float* row, int lane) {
  static_assert(E % 4 == 0, "elements per lane come in fours");
  float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int e = 0; e < E; ++e) s[e % 4] += a[e] * row[e * kLanes + lane];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// grid (query blocks, B*H); kLanes threads per query row i. Online softmax over key tiles: running
// max m, running sum l, unnormalised output acc (rescaled by exp(m_old - m_new) when the max grows).
template <int DMAX>
__global__ void __launch_bounds__(kThreads, 1)
    flash_forward_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                         float* __restrict__ out, float* __restrict__ lse, Dims a, float scale) {
  constexpr int E = DMAX / kLanes;
  __shared__ float ks[kTile][DMAX];
  __shared__ float vs[kTile][DMAX];
  const RowGroup g = row_group();
  const int lane = static_cast<int>(g.thread_rank());
  const int T = static_cast<int>(a.T), d = static_cast<int>(a.d);
  const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, kvh = h / (a.H / a.Hkv);
  const int i0 = blockIdx.x * kRows, i = i0 + row_of_thread();
  const bool active = i < T;  // the same on a row's lanes, as every branch below
  const int ir = active ? i : T - 1;
  float qr[E], acc[E];
  load_row<E>(qr, q + (b * a.T + ir) * a.ldq + h * a.d, d, lane);
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  float m = -INFINITY, l = 0.f;
  const float* kb = k + b * a.T * a.ldkv + kvh * a.d;
  const float* vb = v + b * a.T * a.ldkv + kvh * a.d;
  const int last = min(T, i0 + kRows) - 1;
  for (int j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();  // the previous tile is no longer read
    load_tile<DMAX>(ks, kb, a.ldkv, j0, T, d);
    load_tile<DMAX>(vs, vb, a.ldkv, j0, T, d);
    __syncthreads();
    if (!active || j0 > i) continue;
    float s[kTile];
    float tile_max = -INFINITY;
#pragma unroll
    for (int r = 0; r < kTile; ++r) {
      const float x = row_sum(g, dot_part<E>(qr, ks[r], lane)) * scale;
      s[r] = j0 + r <= i ? x : -INFINITY;
      tile_max = fmaxf(tile_max, s[r]);
    }
    const float m_new = fmaxf(m, tile_max);  // finite: key j0 <= i is in the window
    const float corr = expf(m - m_new);      // 0 on the first tile (m = -inf)
    l *= corr;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] *= corr;
#pragma unroll
    for (int r = 0; r < kTile; ++r) {
      const float p = expf(s[r] - m_new);  // 0 outside the window
      l += p;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] += p * vs[r][e * kLanes + lane];
    }
    m = m_new;
  }
  if (!active) return;
  float* o = out + (b * a.T + i) * (a.H * a.d) + h * a.d;
  const float inv = 1.f / l;
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (e * kLanes + lane < d) o[e * kLanes + lane] = acc[e] * inv;
  if (lane == 0) lse[bh * a.T + i] = m + logf(l);
}

// grid (query blocks, B*H); kLanes threads per query row i: D_i = dout_i . out_i (saved for the
// dk/dv kernel) and dq_i += scale * sum_j p_ij (dout_i . v_j - D_i) k_j.
template <int DMAX>
__global__ void __launch_bounds__(kThreads, 1)
    flash_backward_dq_kernel(const float* __restrict__ dout, const float* __restrict__ q, const float* __restrict__ k,
                             const float* __restrict__ v, const float* __restrict__ out,
                             const float* __restrict__ lse, float* __restrict__ dq, float* __restrict__ rowdot, Dims a,
                             float scale) {
  constexpr int E = DMAX / kLanes;
  __shared__ float ks[kTile][DMAX];
  __shared__ float vs[kTile][DMAX];
  const RowGroup g = row_group();
  const int lane = static_cast<int>(g.thread_rank());
  const int T = static_cast<int>(a.T), d = static_cast<int>(a.d);
  const int64_t bh = blockIdx.y, b = bh / a.H, h = bh % a.H, kvh = h / (a.H / a.Hkv);
  const int i0 = blockIdx.x * kRows, i = i0 + row_of_thread();
  const bool active = i < T;
  const int ir = active ? i : T - 1;
  const int64_t orow = (b * a.T + ir) * (a.H * a.d) + h * a.d;
  float qr[E], dor[E], outr[E], dqa[E];
  load_row<E>(qr, q + (b * a.T + ir) * a.ldq + h * a.d, d, lane);
  load_row<E>(dor, dout + orow, d, lane);
  load_row<E>(outr, out + orow, d, lane);
  float part = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) part += dor[e] * outr[e];
  const float D = row_sum(g, part);
  const float L = lse[bh * a.T + ir];
  if (active && lane == 0) rowdot[bh * a.T + i] = D;
#pragma unroll
  for (int e = 0; e < E; ++e) dqa[e] = 0.f;
  const float* kb = k + b * a.T * a.ldkv + kvh * a.d;
  const float* vb = v + b * a.T * a.ldkv + kvh * a.d;
  const int last = min(T, i0 + kRows) - 1;
  for (int j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();
    load_tile<DMAX>(ks, kb, a.ldkv, j0, T, d);
    load_tile<DMAX>(vs, vb, a.ldkv, j0, T, d);
    __syncthreads();
    if (!active || j0 > i) continue;
#pragma unroll 4
    for (int r = 0; r < kTile; ++r) {
      if (j0 + r > i) break;
      const float p = expf(row_sum(g, dot_part<E>(qr, ks[r], lane)) * scale - L);
      const float ds = p * (row_sum(g, dot_part<E>(dor, vs[r], lane)) - D);
#pragma unroll
      for (int e = 0; e < E; ++e) dqa[e] += ds * ks[r][e * kLanes + lane];
    }
  }
  if (!active) return;
  float* dqr = dq + (b * a.T + i) * a.ldq + h * a.d;
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (e * kLanes + lane < d) dqr[e * kLanes + lane] += dqa[e] * scale;
}

// grid (key blocks, B*Hkv); kLanes threads per key row j of key/value head kvh: over the group's
// query heads in increasing order and the query rows i >= j, dv_j += p_ij dout_i and
// dk_j += scale * p_ij (dout_i . v_j - D_i) q_i.
template <int DMAX>
__global__ void __launch_bounds__(kThreads, 1)
    flash_backward_dkdv_kernel(const float* __restrict__ dout, const float* __restrict__ q,
                               const float* __restrict__ k, const float* __restrict__ v,
                               const float* __restrict__ lse, const float* __restrict__ rowdot,
                               float* __restrict__ dk, float* __restrict__ dv, Dims a, float scale) {
  constexpr int E = DMAX / kLanes;
  __shared__ float qs[kTile][DMAX];
  __shared__ float dos[kTile][DMAX];
  __shared__ float ls[kTile], Ds[kTile];
  const RowGroup g = row_group();
  const int lane = static_cast<int>(g.thread_rank());
  const int T = static_cast<int>(a.T), d = static_cast<int>(a.d);
  const int64_t bj = blockIdx.y, b = bj / a.Hkv, kvh = bj % a.Hkv, gq = a.H / a.Hkv;
  const int j0 = blockIdx.x * kRows, j = j0 + row_of_thread();
  const bool active = j < T;
  const int jr = active ? j : T - 1;
  float kr[E], vr[E], dka[E], dva[E];
  load_row<E>(kr, k + (b * a.T + jr) * a.ldkv + kvh * a.d, d, lane);
  load_row<E>(vr, v + (b * a.T + jr) * a.ldkv + kvh * a.d, d, lane);
#pragma unroll
  for (int e = 0; e < E; ++e) dka[e] = dva[e] = 0.f;
  for (int64_t h = kvh * gq; h < (kvh + 1) * gq; ++h) {
    const float* qb = q + b * a.T * a.ldq + h * a.d;
    const float* dob = dout + b * a.T * (a.H * a.d) + h * a.d;
    const int64_t row0 = (b * a.H + h) * a.T;  // lse / rowdot of this (sample, head)
    for (int i0 = j0; i0 < T; i0 += kTile) {
      __syncthreads();
      load_tile<DMAX>(qs, qb, a.ldq, i0, T, d);
      load_tile<DMAX>(dos, dob, a.H * a.d, i0, T, d);
      if (threadIdx.x < kTile) {
        const int row = i0 + static_cast<int>(threadIdx.x);
        ls[threadIdx.x] = row < T ? lse[row0 + row] : 0.f;
        Ds[threadIdx.x] = row < T ? rowdot[row0 + row] : 0.f;
      }
      __syncthreads();
      if (!active) continue;
#pragma unroll 4
      for (int r = 0; r < kTile; ++r) {
        const int i = i0 + r;
        if (i < j || i >= T) continue;
        const float p = expf(row_sum(g, dot_part<E>(kr, qs[r], lane)) * scale - ls[r]);
        const float ds = p * (row_sum(g, dot_part<E>(vr, dos[r], lane)) - Ds[r]);
#pragma unroll
        for (int e = 0; e < E; ++e) {
          dva[e] += p * dos[r][e * kLanes + lane];
          dka[e] += ds * qs[r][e * kLanes + lane];
        }
      }
    }
  }
  if (!active) return;
  float* dkr = dk + (b * a.T + j) * a.ldkv + kvh * a.d;
  float* dvr = dv + (b * a.T + j) * a.ldkv + kvh * a.d;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int c = e * kLanes + lane;
    if (c < d) {
      dkr[c] += dka[e] * scale;
      dvr[c] += dva[e];
    }
  }
}

// Checks the launch limits and calls fn(std::integral_constant<int, DMAX>) with the smallest
// compiled head-dimension bound >= d.
template <class F>
void with_head_dim(const Dims& a, const char* op, F fn) {
  auto fail = [&](const std::string& what) { throw std::invalid_argument(std::string("[") + op + "] " + what); };
  if (a.d > kMaxHeadDim)
    fail("head dimension " + std::to_string(a.d) + " exceeds the fused kernels' " + std::to_string(kMaxHeadDim) +
         "; use the unfused attention kernel (runtime.attention unfused)");
  if (a.Hkv <= 0 || a.H % a.Hkv != 0) fail("Hkv=" + std::to_string(a.Hkv) + " must divide H=" + std::to_string(a.H));
  if (a.T > INT_MAX / 2) fail("T=" + std::to_string(a.T) + " too long");
  if (a.B * a.H > 65535) fail("B*H=" + std::to_string(a.B * a.H) + " exceeds the grid's 65535");
  if (a.d <= 32) fn(std::integral_constant<int, 32>{});
  else if (a.d <= 64) fn(std::integral_constant<int, 64>{});
  else fn(std::integral_constant<int, 128>{});
}

unsigned blocks_of(int64_t rows) { return static_cast<unsigned>((rows + kRows - 1) / kRows); }

}  // namespace

void forward(const float* q, const float* k, const float* v, float* out, float* lse, const Dims& a) {
  if (a.B <= 0 || a.T <= 0 || a.d <= 0) return;
  const float scale = 1.0f / std::sqrt(static_cast<float>(a.d));
  with_head_dim(a, "flash_attention_forward", [&](auto dmax) {
    const dim3 grid(blocks_of(a.T), static_cast<unsigned>(a.B * a.H));
    flash_forward_kernel<decltype(dmax)::value><<<grid, kThreads>>>(q, k, v, out, lse, a, scale);
    CUDA_CHECK_LAUNCH("flash_forward_kernel");
  });
}

void backward(const float* dout, const float* q, const float* k, const float* v, const float* out, const float* lse,
              float* dq, float* dk, float* dv, float* rowdot, const Dims& a) {
  if (a.B <= 0 || a.T <= 0 || a.d <= 0) return;
  const float scale = 1.0f / std::sqrt(static_cast<float>(a.d));
  with_head_dim(a, "flash_attention_backward", [&](auto dmax) {
    constexpr int D = decltype(dmax)::value;
    const dim3 grid_q(blocks_of(a.T), static_cast<unsigned>(a.B * a.H));
    flash_backward_dq_kernel<D><<<grid_q, kThreads>>>(dout, q, k, v, out, lse, dq, rowdot, a, scale);
    CUDA_CHECK_LAUNCH("flash_backward_dq_kernel");
    const dim3 grid_kv(blocks_of(a.T), static_cast<unsigned>(a.B * a.Hkv));
    flash_backward_dkdv_kernel<D><<<grid_kv, kThreads>>>(dout, q, k, v, lse, rowdot, dk, dv, a, scale);
    CUDA_CHECK_LAUNCH("flash_backward_dkdv_kernel");
  });
}

}  // namespace mfsdp::cuda_flash
