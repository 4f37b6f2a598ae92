#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace mfsdp {

DecayKind parse_decay_kind(const std::string& s) { return kDecayKindNames.parse(s, "decay kind"); }

const char* decay_kind_name(DecayKind k) { return kDecayKindNames.name(k); }

void LRSchedule::validate() const {
  if (total_steps < 1)
    throw std::invalid_argument("[LRSchedule] total_steps " + std::to_string(total_steps) + " must be >= 1");
  if (warmup_steps < 0)
    throw std::invalid_argument("[LRSchedule] warmup_steps " + std::to_string(warmup_steps) + " is negative");
  if (!(floor >= 0.0 && floor <= 1.0))
    throw std::invalid_argument("[LRSchedule] floor " + std::to_string(floor) + " is outside [0, 1]");
  if (!(decay_fraction >= 0.0 && decay_fraction <= 1.0))
    throw std::invalid_argument("[LRSchedule] decay_fraction " + std::to_string(decay_fraction) +
                                " is outside [0, 1]");
}

double LRSchedule::multiplier(int64_t step) const {
  validate();
  if (step < 0) throw std::invalid_argument("[LRSchedule::multiplier] step " + std::to_string(step) + " is negative");
  if (step < warmup_steps) return static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == DecayKind::constant) return 1.0;

  int64_t decay_start = warmup_steps;
  if (kind == DecayKind::wsd) {
    const auto decay_steps = static_cast<int64_t>(std::llround(decay_fraction * static_cast<double>(total_steps)));
    decay_start = std::max(warmup_steps, total_steps - decay_steps);
    if (step < decay_start) return 1.0;
  }
  const int64_t span = total_steps - decay_start;
  if (span <= 0 || step >= total_steps) return floor;
  const double p = std::clamp(static_cast<double>(step - decay_start) / static_cast<double>(span), 0.0, 1.0);
  if (kind == DecayKind::cosine) return floor + (1.0 - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
  return 1.0 - (1.0 - floor) * p;  // linear and the decay phase of wsd
}

}  // namespace mfsdp
