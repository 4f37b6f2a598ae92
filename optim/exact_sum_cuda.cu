// The exact sum of squares on CUDA (optim_cuda.h): the integer digits of every element's exact
// square summed into the bins of optim/exact_sum.h, so the state (and the rounded value) is
// bitwise the CPU's. Any number of device buffers go in one launch and one device->host copy: the
// global gradient norm of everything a rank owns costs one synchronization, not one per tensor.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "optim/optim_cuda.h"
#include "runtime/core/cuda_check.h"

namespace mfsdp {
namespace {

constexpr int kThreads = 256;

// ---- exact sum of squares (integer digits; the layout of optim/exact_sum.h) ----
//
// x^2 of an f32 x = mx * 2^e (mx < 2^24, e = expf - 150, or -149 for subnormals) is the integer
// mx^2 < 2^48 times 2^(p - 1074), p = 2e + 1074 in [776, 1282]. Shifted by p & 31 it is an 80-bit
// integer whose three 32-bit digits go to bins p>>5, p>>5 + 1, p>>5 + 2 (the CPU's add_scaled).
// Digits are summed with u64 integer atomics: exact and commutative, so the bins (and the value
// rounded from them) do not depend on the block / thread schedule. Each piece (a buffer, or a part
// of one) covers at most kExactMaxChunk elements and has its own bins; a bin receives at most one
// digit (< 2^32) per element, so a piece's bins stay below 2^60 (no u64 overflow, and within the
// |bin| < 2^62 that ExactSum::from_words takes).

constexpr int kExactBins = ExactSum::kBins;
constexpr int kExactWords = ExactSum::kWords;  // bins, then the non-finite flags
constexpr int64_t kExactMaxChunk = int64_t(1) << 28;
constexpr int kExactMaxBlocks = 2048;
constexpr int64_t kExactMaxPiecesPerLaunch = 65535;  // gridDim.y

/// One launch row: x[0..n) on the device, n <= kExactMaxChunk.
struct ExactPiece {
  const float* x;
  int64_t n;
};
static_assert(kExactWords == kExactBins + 1, "ExactSum words are its bins followed by one flag word");

/// Adds a thread's 4-bin window (bins base .. base+3) into the block's shared bins.
__device__ __forceinline__ void exact_flush(unsigned long long* bins, int base, unsigned long long a0,
                                            unsigned long long a1, unsigned long long a2, unsigned long long a3) {
  if (base < 0) return;
  if (a0) atomicAdd(bins + base, a0);
  if (a1) atomicAdd(bins + base + 1, a1);
  if (a2) atomicAdd(bins + base + 2, a2);
  if (a3) atomicAdd(bins + base + 3, a3);
}

/// out[0..kExactBins) += the digits of sum x[i]^2 (i < n); out[kExactBins] |= non-finite flags
/// (bit 0 NaN, bit 1 +Inf: a square is never -Inf). Each thread first sums digits in registers over
/// a window of two consecutive digit positions (x^2 of typical data shares p>>5), then flushes to
/// shared memory; each block then adds its nonzero bins to `out`. The blocks of one grid row
/// (blockIdx.x) share the piece; blockIdx.y picks it.
__global__ void __launch_bounds__(kThreads)
    exact_sumsq_pieces_kernel(const ExactPiece* __restrict__ pieces, unsigned long long* __restrict__ words) {
  const float* __restrict__ x = pieces[blockIdx.y].x;
  const int64_t n = pieces[blockIdx.y].n;
  unsigned long long* __restrict__ out = words + static_cast<int64_t>(blockIdx.y) * kExactWords;
  __shared__ unsigned long long bins[kExactBins];
  for (int t = threadIdx.x; t < kExactBins; t += kThreads) bins[t] = 0;
  __syncthreads();
  int base = -1;
  unsigned long long a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  unsigned int flags = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const uint32_t b = __float_as_uint(x[i]);
    const uint32_t frac = b & 0x7fffffu;
    const int expf = static_cast<int>((b >> 23) & 0xffu);
    if (expf == 0xff) {
      flags |= frac ? 1u : 2u;
      continue;
    }
    const unsigned long long mx = expf == 0 ? frac : (frac | 0x800000u);
    if (mx == 0) continue;  // +-0 adds nothing
    const int p = 2 * (expf == 0 ? -149 : expf - 150) + 1074;
    const int s = p & 31, k = p >> 5;
    const unsigned long long prod = mx * mx;  // < 2^48
    const unsigned long long w = prod << s;   // low 64 bits of prod * 2^s (< 2^79)
    const unsigned long long lo = w & 0xffffffffull, mid = w >> 32, hi = s ? prod >> (64 - s) : 0ull;
    if (k == base) {
      a0 += lo;
      a1 += mid;
      a2 += hi;
    } else if (k == base + 1) {
      a1 += lo;
      a2 += mid;
      a3 += hi;
    } else {
      exact_flush(bins, base, a0, a1, a2, a3);
      base = k;
      a0 = lo;
      a1 = mid;
      a2 = hi;
      a3 = 0;
    }
  }
  exact_flush(bins, base, a0, a1, a2, a3);
  if (flags) atomicOr(out + kExactBins, static_cast<unsigned long long>(flags));
  __syncthreads();
  for (int t = threadIdx.x; t < kExactBins; t += kThreads)
    if (bins[t]) atomicAdd(out + t, bins[t]);
}

// The pieces of every buffer (at most kExactMaxChunk elements each, so one piece's bins stay
// below 2^60), their digits in one device buffer, one copy back, then the exact merge on the host:
// pieces added in order with carries after each, so the running bins stay in [0, 2^32) below the
// top one. Integer sums: the state is the same for any split into buffers, pieces or launches.
void exact_sum_of_squares_impl(const char* op, const std::vector<const float*>& xs, const std::vector<int64_t>& ns,
                               ExactSum& acc, int64_t chunk, cudaStream_t stream) {
  if (xs.size() != ns.size())
    throw std::invalid_argument(std::string("[") + op + "] " + std::to_string(xs.size()) + " buffers but " +
                                std::to_string(ns.size()) + " lengths");
  if (chunk < 1 || chunk > kExactMaxChunk)
    throw std::invalid_argument(std::string("[") + op + "] chunk " + std::to_string(chunk) + " is outside [1, 2^28]");
  std::vector<ExactPiece> pieces;
  int64_t longest = 0;
  for (size_t b = 0; b < xs.size(); ++b) {
    if (ns[b] < 0) throw std::invalid_argument(std::string("[") + op + "] n " + std::to_string(ns[b]) + " is negative");
    if (ns[b] > 0 && !xs[b])
      throw std::invalid_argument(std::string("[") + op + "] null buffer with n " + std::to_string(ns[b]));
    for (int64_t begin = 0; begin < ns[b]; begin += chunk) {
      pieces.push_back({xs[b] + begin, std::min(chunk, ns[b] - begin)});
      longest = std::max(longest, pieces.back().n);
    }
  }
  if (pieces.empty()) return;
  const int64_t P = static_cast<int64_t>(pieces.size());
  const size_t table_bytes = static_cast<size_t>(P) * sizeof(ExactPiece);
  const size_t word_bytes = static_cast<size_t>(P) * kExactWords * sizeof(unsigned long long);
  unsigned char* dev = nullptr;
  CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&dev), table_bytes + word_bytes, stream));
  auto* words = reinterpret_cast<unsigned long long*>(dev + table_bytes);  // 16-byte pieces keep it aligned
  std::vector<unsigned long long> host(static_cast<size_t>(P) * kExactWords);
  try {
    CUDA_CHECK(cudaMemcpyAsync(dev, pieces.data(), table_bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemsetAsync(words, 0, word_bytes, stream));
    // enough blocks per piece for the longest, fewer when there are many pieces
    const int64_t want = (longest + kThreads - 1) / kThreads;
    const int bx = static_cast<int>(std::clamp<int64_t>(want, 1, std::max<int64_t>(32, kExactMaxBlocks * 8 / P)));
    for (int64_t first = 0; first < P; first += kExactMaxPiecesPerLaunch) {
      const int rows = static_cast<int>(std::min(kExactMaxPiecesPerLaunch, P - first));
      exact_sumsq_pieces_kernel<<<dim3(static_cast<unsigned>(std::min(bx, kExactMaxBlocks)), rows), kThreads, 0, stream>>>(
          reinterpret_cast<const ExactPiece*>(dev) + first, words + first * kExactWords);
      CUDA_CHECK_LAUNCH("exact_sumsq_pieces_kernel");
    }
    CUDA_CHECK(cudaMemcpyAsync(host.data(), words, word_bytes, cudaMemcpyDeviceToHost, stream));
  } catch (...) {
    cudaFreeAsync(dev, stream);
    throw;
  }
  CUDA_CHECK(cudaFreeAsync(dev, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));  // the pieces table (pageable) and the digits are done
  std::array<int64_t, ExactSum::kWords> total{};
  unsigned long long flags = 0;
  for (int64_t c = 0; c < P; ++c) {
    const unsigned long long* w = host.data() + c * kExactWords;
    for (int i = 0; i < kExactBins; ++i) total[i] += static_cast<int64_t>(w[i]);
    for (int i = 0; i + 1 < kExactBins; ++i) {
      total[i + 1] += total[i] >> 32;
      total[i] &= 0xffffffffll;
    }
    flags |= w[kExactBins];
  }
  total[kExactBins] = static_cast<int64_t>(flags & 7u);
  acc.merge(ExactSum::from_words(total));
}

}  // namespace

namespace detail {
void exact_sum_of_squares_cuda_chunked(const float* x, int64_t n, ExactSum& acc, int64_t chunk,
                                       cudaStream_t stream) {
  exact_sum_of_squares_impl("exact_sum_of_squares_cuda", {x}, {n}, acc, chunk, stream);
}
}  // namespace detail

void exact_sum_of_squares_cuda(const float* x, int64_t n, ExactSum& acc, cudaStream_t stream) {
  exact_sum_of_squares_impl("exact_sum_of_squares_cuda", {x}, {n}, acc, kExactMaxChunk, stream);
}

void exact_sum_of_squares_cuda(const std::vector<const float*>& xs, const std::vector<int64_t>& ns, ExactSum& acc,
                               cudaStream_t stream) {
  exact_sum_of_squares_impl("exact_sum_of_squares_cuda", xs, ns, acc, kExactMaxChunk, stream);
}

}  // namespace mfsdp
