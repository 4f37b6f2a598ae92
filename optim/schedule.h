// Learning-rate schedules: linear warmup, then constant / cosine / linear decay / warmup-stable-decay.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/core/name_table.h"

namespace mfsdp {

/// Shape of the schedule after warmup.
enum class DecayKind { constant, cosine, linear, wsd };
/// "constant", "cosine", "linear", "wsd".
inline constexpr NameTable<DecayKind, 4> kDecayKindNames{
    {{{DecayKind::constant, "constant"}, {DecayKind::cosine, "cosine"}, {DecayKind::linear, "linear"}, {DecayKind::wsd, "wsd"}}}};

/// Parses "constant" / "cosine" / "linear" / "wsd"; throws std::invalid_argument naming the value.
DecayKind parse_decay_kind(const std::string& s);
/// The config name of `k`.
const char* decay_kind_name(DecayKind k);

/// LR multiplier schedule (lr = base_lr * multiplier(step)); each optimizer group applies it to its
/// own base lr. Steps are 0-based. With W = warmup_steps, T = total_steps, f = floor:
///  - step < W: (step + 1) / W (linear ramp from 0, reaching 1 at step W-1; llm.c's convention);
///  - constant: 1;
///  - cosine:  f + (1-f) * 0.5 * (1 + cos(pi * p)), p = (step - W) / (T - W) clamped to [0, 1];
///  - linear:  1 - (1-f) * p;
///  - wsd:     1 until D = max(W, T - round(decay_fraction * T)), then 1 - (1-f) * (step - D) / (T - D)
///             (linear to the floor over the last decay_fraction of T).
/// Steps >= T stay at the end value (f for cosine/linear/wsd, 1 for constant).
struct LRSchedule {
  int64_t warmup_steps = 0, total_steps = 1;
  DecayKind kind = DecayKind::cosine;
  double floor = 0.1;            ///< final multiplier, in [0, 1]
  double decay_fraction = 0.2;   ///< wsd only: fraction of total_steps spent decaying, in [0, 1]

  /// lr / base_lr at 0-based `step`. Throws std::invalid_argument for step < 0 or invalid fields.
  double multiplier(int64_t step) const;
  /// Throws std::invalid_argument naming the field unless: total_steps >= 1, 0 <= warmup_steps,
  /// floor and decay_fraction in [0, 1].
  void validate() const;
};

}  // namespace mfsdp
