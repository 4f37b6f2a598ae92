// Exact, order-independent summation of f64 values (a Kulisch-style long accumulator).
//
// Every finite double is m * 2^e with an integer m < 2^53 and e >= -1074, so the exact sum of any
// number of doubles is an integer multiple of 2^-1074. ExactSum keeps that integer in 32-bit
// "digits" stored in signed 64-bit bins (bin i weighs 2^(32*i - 1074)); adding a value adds its
// mantissa, split at a 32-bit boundary, to three bins. Integer addition is associative, so the
// state after adding a multiset of values is the same in any order, on any thread split and on any
// rank split; merging two accumulators is bin-wise integer addition. The result is rounded to
// double once (round to nearest, ties to even) by value().
//
// Squares of f32 values are exact in f64 (24-bit mantissas give 48-bit products), so
// add_squares() gives the exact sum of squares of f32 data: the global gradient norm is then the
// same bits at every world size and placement. The approach follows the exact (binned) summation
// of Demmel and Nguyen (ReproBLAS) and Kulisch's long accumulator, with integer bins.
#pragma once
#include <array>
#include <cstdint>
#include <string>

namespace mfsdp {

/// Exact sum of f64 values. Non-finite inputs are tracked apart (a NaN, +Inf or -Inf flag) and
/// value() returns NaN, +Inf or -Inf as IEEE addition would. Not thread-safe: give each thread its
/// own accumulator and merge().
class ExactSum {
 public:
  /// 32 * kBins bits cover 2^-1074 .. 2^1024 (2098 bits) with two bins of headroom for carries.
  static constexpr int kBins = 68;

  /// Adds one value exactly.
  void add(double x);
  /// Adds x[i]^2 for i in [0, n) exactly (f32 squares are exact in f64).
  void add_squares(const float* x, int64_t n);
  /// Adds every value of `other` (integer bin sums; exact, commutative, associative).
  void merge(const ExactSum& other);
  /// The exact sum rounded once to the nearest double (ties to even); +-Inf when it overflows.
  double value() const;
  /// True when no value (or only zeros) was added.
  bool is_zero() const;

  /// Serialized form for collectives: normalized bins followed by the three non-finite flags.
  /// Ranks combine states with merge(); see optim/README.md ("exact sums").
  static constexpr int kWords = kBins + 1;
  std::array<int64_t, kWords> to_words() const;
  static ExactSum from_words(const std::array<int64_t, kWords>& words);

 private:
  void add_finite_bits(uint64_t bits, bool negative);
  void normalize();  // carries so that bins 0..kBins-2 lie in [0, 2^32)

  std::array<int64_t, kBins> bins_{};
  int64_t pending_ = 0;  // additions since the last normalize (each adds < 2^32 to a bin)
  uint8_t nonfinite_ = 0;  // bit 0: NaN, bit 1: +Inf, bit 2: -Inf
};

/// Exact sum of squares of x[0..n) added to `acc`, split over the rank's OpenMP threads (one
/// accumulator per fixed chunk, merged exactly: the result does not depend on the thread count).
/// Throws std::invalid_argument for n < 0 or a null x with n > 0.
void exact_sum_of_squares_cpu(const float* x, int64_t n, ExactSum& acc);

}  // namespace mfsdp
