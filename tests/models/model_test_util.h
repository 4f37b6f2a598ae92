// Helpers of the model tests: the relative error they compare with, loading fixture weights,
// and the unpadded logit columns.
#pragma once
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <vector>

#include "checkpoint/safetensors.h"

/// ||got - want|| / max(||want||, 1e-30) in f64.
inline double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

/// Copies every inventory parameter of `model` (GPT or Llama, allocate_local'ed) from `file`.
template <class M>
void load_fixture_weights(const mfsdp::SafetensorsFile& file, M& model) {
  for (const auto& p : model.inventory().params) {
    auto v = file.read_f32(p.name);
    REQUIRE(static_cast<int64_t>(v.size()) == p.numel());
    std::copy(v.begin(), v.end(), model.param(p.name).data_f32());
  }
}

/// The first V of every Vp columns of logits [rows, Vp] (the fixture's unpadded [rows, V]).
inline std::vector<float> unpadded_columns(const std::vector<float>& all, int64_t rows, int64_t V, int64_t Vp) {
  std::vector<float> got;
  for (int64_t n = 0; n < rows; ++n) got.insert(got.end(), all.begin() + n * Vp, all.begin() + n * Vp + V);
  return got;
}
