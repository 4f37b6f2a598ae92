// ||got - want|| / max(||want||, 1e-30) in f64: the relative error the model tests compare with.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

inline double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}
