#include "optim/exact_sum.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace mfsdp {
namespace {

using u128 = unsigned __int128;
constexpr int64_t kDigit = int64_t(1) << 32;
constexpr int64_t kNormalizeAfter = int64_t(1) << 30;  // each addition adds < 2^32 to a bin
constexpr uint8_t kNaN = 1, kPosInf = 2, kNegInf = 4;

// Adds (or subtracts) the integer m * 2^p (units of 2^-1074; m < 2^64, 0 <= p <= 2045): three
// 32-bit digits, each < 2^32.
inline void add_scaled(int64_t* bins, uint64_t m, int p, bool negative) {
  const u128 wide = static_cast<u128>(m) << (p & 31);
  const int i = p >> 5;
  const int64_t lo = static_cast<int64_t>(wide & 0xffffffffu);
  const int64_t mid = static_cast<int64_t>((wide >> 32) & 0xffffffffu);
  const int64_t hi = static_cast<int64_t>(wide >> 64);
  if (negative) {
    bins[i] -= lo;
    bins[i + 1] -= mid;
    bins[i + 2] -= hi;
  } else {
    bins[i] += lo;
    bins[i + 1] += mid;
    bins[i + 2] += hi;
  }
}

}  // namespace

void ExactSum::add_finite_bits(uint64_t bits, bool negative) {
  const int exp = static_cast<int>((bits >> 52) & 0x7ff);
  const uint64_t frac = bits & ((uint64_t(1) << 52) - 1);
  // x = m * 2^(p - 1074): subnormals have p = 0, normals p = exp - 1 with the implicit bit.
  const uint64_t m = exp == 0 ? frac : frac | (uint64_t(1) << 52);
  const int p = exp == 0 ? 0 : exp - 1;
  add_scaled(bins_.data(), m, p, negative);
  if (++pending_ >= kNormalizeAfter) normalize();
}

void ExactSum::add(double x) {
  const uint64_t bits = std::bit_cast<uint64_t>(x);
  const bool negative = (bits >> 63) != 0;
  if (((bits >> 52) & 0x7ff) == 0x7ff) {
    nonfinite_ |= (bits & ((uint64_t(1) << 52) - 1)) ? kNaN : negative ? kNegInf : kPosInf;
    return;
  }
  add_finite_bits(bits, negative);
}

void ExactSum::add_squares(const float* x, int64_t n) {
  // x = mx * 2^e with an integer mx < 2^24 and e = expf - 150 (e = -149 for subnormals), so
  // x^2 = mx^2 * 2^(2e): squares sharing an f32 exponent field are integer multiples of one
  // power of two. Each block first sums mx^2 per exponent field in 64-bit integers (4 lanes of
  // 256 buckets, so consecutive updates rarely wait on one another), then adds each bucket to
  // the bins once. A lane takes at most kBlock / kLanes = 2^14 squares < 2^48 per bucket, and
  // the four lanes of a bucket sum to < 2^64.
  constexpr int kLanes = 4;
  constexpr int64_t kBlock = int64_t(1) << 16;
  uint64_t bucket[kLanes][256];
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    std::fill(&bucket[0][0], &bucket[0][0] + kLanes * 256, uint64_t(0));
    int64_t i = begin;
    for (; i + kLanes <= end; i += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const uint32_t b = std::bit_cast<uint32_t>(x[i + l]);
        const uint32_t expf = (b >> 23) & 0xff;
        const uint64_t mx = (b & 0x7fffffu) | (expf ? 0x800000u : 0u);
        bucket[l][expf] += mx * mx;
      }
    for (; i < end; ++i) {
      const uint32_t b = std::bit_cast<uint32_t>(x[i]);
      const uint32_t expf = (b >> 23) & 0xff;
      const uint64_t mx = (b & 0x7fffffu) | (expf ? 0x800000u : 0u);
      bucket[0][expf] += mx * mx;
    }
    // Exponent field 255 is Inf or NaN (its bucket is non-zero exactly when one occurred).
    if (bucket[0][255] | bucket[1][255] | bucket[2][255] | bucket[3][255]) [[unlikely]]
      for (int64_t j = begin; j < end; ++j) {
        const uint32_t b = std::bit_cast<uint32_t>(x[j]);
        if (((b >> 23) & 0xff) == 0xff) nonfinite_ |= (b & 0x7fffffu) ? kNaN : kPosInf;  // a square is never -Inf
      }
    for (int expf = 0; expf < 255; ++expf) {
      const uint64_t total = bucket[0][expf] + bucket[1][expf] + bucket[2][expf] + bucket[3][expf];
      if (total == 0) continue;
      const int e = expf == 0 ? -149 : expf - 150;
      add_scaled(bins_.data(), total, 2 * e + 1074, false);  // 2e + 1074 >= 776
      ++pending_;
    }
    if (pending_ >= kNormalizeAfter) normalize();
  }
}

void ExactSum::normalize() {
  for (int i = 0; i + 1 < kBins; ++i) {
    const int64_t carry = bins_[i] >> 32;  // floor division by 2^32 (arithmetic shift)
    bins_[i] -= carry * kDigit;
    bins_[i + 1] += carry;
  }
  pending_ = 0;
}

void ExactSum::merge(const ExactSum& other) {
  for (int i = 0; i < kBins; ++i) bins_[i] += other.bins_[i];
  nonfinite_ |= other.nonfinite_;
  pending_ += other.pending_ + 1;
  if (pending_ >= kNormalizeAfter) normalize();
}

bool ExactSum::is_zero() const {
  ExactSum c = *this;
  c.normalize();
  return c.nonfinite_ == 0 && std::all_of(c.bins_.begin(), c.bins_.end(), [](int64_t b) { return b == 0; });
}

double ExactSum::value() const {
  if (nonfinite_ & kNaN || (nonfinite_ & kPosInf && nonfinite_ & kNegInf))
    return std::numeric_limits<double>::quiet_NaN();
  if (nonfinite_ & kPosInf) return std::numeric_limits<double>::infinity();
  if (nonfinite_ & kNegInf) return -std::numeric_limits<double>::infinity();
  ExactSum c = *this;
  c.normalize();
  const bool negative = c.bins_[kBins - 1] < 0;
  if (negative) {
    for (int64_t& b : c.bins_) b = -b;
    c.normalize();
  }
  int h = kBins - 1;
  while (h >= 0 && c.bins_[h] == 0) --h;
  if (h < 0) return 0.0;
  // Top 96 bits of the magnitude (bins h, h-1, h-2), plus a sticky bit for everything below.
  const int base = std::max(0, h - 2);
  u128 v = 0;
  for (int i = h; i >= base; --i) v = (v << 32) | static_cast<u128>(static_cast<uint64_t>(c.bins_[i]));
  bool sticky = false;
  for (int i = 0; i < base; ++i) sticky = sticky || c.bins_[i] != 0;
  int exponent = 32 * base - 1074;
  const uint64_t top = static_cast<uint64_t>(v >> 64);
  const int lead = top ? 127 - std::countl_zero(top) : 63 - std::countl_zero(static_cast<uint64_t>(v));
  if (lead > 63) {
    const int shift = lead - 63;
    sticky = sticky || (v & ((static_cast<u128>(1) << shift) - 1)) != 0;
    v >>= shift;
    exponent += shift;
  }
  // 64 significant bits with the sticky bit OR-ed into bit 0: the hardware conversion rounds to
  // nearest even correctly (the sticky bit lies below the rounding position).
  const uint64_t bits64 = static_cast<uint64_t>(v) | (sticky ? 1u : 0u);
  const double r = std::ldexp(static_cast<double>(bits64), exponent);
  return negative ? -r : r;
}

std::array<int64_t, ExactSum::kWords> ExactSum::to_words() const {
  ExactSum c = *this;
  c.normalize();
  std::array<int64_t, kWords> w{};
  std::copy(c.bins_.begin(), c.bins_.end(), w.begin());
  w[kBins] = c.nonfinite_;
  return w;
}

ExactSum ExactSum::from_words(const std::array<int64_t, kWords>& words) {
  ExactSum s;
  std::copy(words.begin(), words.begin() + kBins, s.bins_.begin());
  s.nonfinite_ = static_cast<uint8_t>(words[kBins] & 7);
  s.pending_ = 1;
  return s;
}

void exact_sum_of_squares_cpu(const float* x, int64_t n, ExactSum& acc) {
  if (n < 0) throw std::invalid_argument("[exact_sum_of_squares_cpu] n " + std::to_string(n) + " is negative");
  if (n > 0 && x == nullptr)
    throw std::invalid_argument("[exact_sum_of_squares_cpu] null buffer with n " + std::to_string(n));
  constexpr int64_t kChunk = int64_t(1) << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks <= 1 || omp_get_max_threads() == 1) {
    acc.add_squares(x, n);
    return;
  }
  // Any split gives the same integer bins, so the thread count cannot change the result.
#pragma omp parallel
  {
    ExactSum local;
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t begin = c * kChunk;
      local.add_squares(x + begin, std::min(kChunk, n - begin));
    }
#pragma omp critical(mfsdp_exact_sum_merge)
    acc.merge(local);
  }
}

}  // namespace mfsdp
