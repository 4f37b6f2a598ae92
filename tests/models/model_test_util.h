// Helpers of the model tests: the relative error they compare with, loading fixture weights,
// and the unpadded logit columns.
#pragma once
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <vector>

#include "checkpoint/safetensors.h"
#include "runtime/autograd.h"
#include "runtime/ops.h"

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

/// The fused head (head_loss) against logits + cross_entropy on `model` (GPT or Llama, fixture
/// weights loaded, B*T rows within one classifier chunk): the same loss and every parameter
/// gradient bit for bit, with f32 and with bf16 matmuls.
template <class M>
void check_fused_head_bits(M& model, const mfsdp::Tensor& tokens, const mfsdp::Tensor& targets) {
  using namespace mfsdp;
  const auto& cfg = model.config();
  const int64_t rows = tokens.numel();
  REQUIRE(rows <= classifier_chunk_rows(cfg.padded_vocab_size()));
  auto run = [&](bool fused) {
    model.local_grads().zero();
    Tensor x = model.embed(tokens);
    for (int l = 0; l < cfg.n_layer; ++l) x = model.block(l, x);
    Tensor loss = fused ? model.head_loss(x, targets) : cross_entropy(model.logits(x), targets.reshape({rows}), cfg.vocab_size);
    backward(loss);
    return std::make_pair(loss.item(), model.local_grads().to_vector());
  };
  for (DType mm : {DType::f32, DType::bf16}) {
    MatmulDTypeScope scope(mm);
    INFO("matmuls in " << dtype_name(mm));
    const auto fused = run(true), unfused = run(false);
    CHECK(fused.first == unfused.first);
    CHECK(fused.second == unfused.second);  // every parameter's gradient, the output matrix included
  }
}
