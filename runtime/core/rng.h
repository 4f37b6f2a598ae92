// Portable pseudo-random numbers: the same stream on every platform, compiler and rank, so
// initialisation and data order depend only on seeds.
#pragma once
#include <cstdint>

namespace mfsdp {

/// splitmix64's increment (the golden-ratio "gamma" of Vigna's reference implementation).
inline constexpr uint64_t kSplitmix64Gamma = 0x9e3779b97f4a7c15ULL;

/// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014;
/// the constants of Vigna's reference implementation): advances `state` and returns 64 mixed bits.
/// The stream is counter-based: the k-th draw (0-based) from state s is the first draw from
/// s + k * kSplitmix64Gamma, so any stretch of it can be produced without the ones before.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += kSplitmix64Gamma);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// A double uniform in the open interval (0, 1) from the top 53 bits of splitmix64.
inline double uniform01(uint64_t& state) {
  return (static_cast<double>(splitmix64(state) >> 11) + 0.5) * 0x1.0p-53;
}

}  // namespace mfsdp
