// Start-up precision decisions with injected GEMM rates (no timing), the notice for an explicit
// bf16 that measures slower, the MFU denominator, and MFU against its closed form for GPT-2 and
// Llama.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>

#include "apps/train/run_precision.h"
#include "models/gpt_spec.h"
#include "models/llama_spec.h"

using namespace mfsdp;

namespace {

TrainConfig with(DTypeChoice matmul, DTypeChoice ns, DType param = DType::f32) {
  TrainConfig c;
  c.precision.matmul = matmul;
  c.precision.ns = ns;
  c.optim.param_dtype = param;
  return c;
}

const GemmRates kBf16Slower{250, 150};   // AVX512-BF16 without AMX
const GemmRates kBf16Faster{260, 800};   // AMX
const GemmRates kNearTie{250, 270};      // within kBf16Margin

}  // namespace

TEST_CASE("auto picks bf16 only where the probe says it pays", "[precision]") {
  const TrainConfig c = with(DTypeChoice::auto_, DTypeChoice::auto_);
  RunPrecision p = decide_precision(c, Device::CPU, 1, true, kBf16Slower, kBf16Slower);
  CHECK(p.matmul == DType::f32);
  CHECK(p.ns == NsDType::f32);
  CHECK(p.notices.empty());
  p = decide_precision(c, Device::CPU, 1, true, kBf16Faster, kBf16Faster);
  CHECK(p.matmul == DType::bf16);
  CHECK(p.ns == NsDType::bf16);
  p = decide_precision(c, Device::CPU, 1, true, kNearTie, kBf16Faster);
  CHECK(p.matmul == DType::f32);
  CHECK(p.ns == NsDType::bf16);
  // the step probe times conversions too: measured faster is enough (AVX2's widened NS products)
  p = decide_precision(c, Device::CPU, 1, true, kNearTie, kNearTie);
  CHECK(p.matmul == DType::f32);
  CHECK(p.ns == NsDType::bf16);
  CHECK(decide_precision(c, Device::CPU, 1, true, kNearTie, {270, 250}).ns == NsDType::f32);
  // without a probe CPU auto stays f32; CUDA auto is bf16 without one
  CHECK(decide_precision(c, Device::CPU, 1, false, {}, {}).matmul == DType::f32);
  CHECK(decide_precision(c, Device::CUDA, 1, false, {}, {}).matmul == DType::bf16);
  // gram_newton_schulz has no bf16 products
  TrainConfig g = c;
  g.optim.muon.orthogonalizer = Orthogonalizer::gram_newton_schulz;
  CHECK(decide_precision(g, Device::CPU, 1, true, kBf16Faster, kBf16Faster).ns == NsDType::f32);
}

TEST_CASE("explicit and default values are kept; an explicit bf16 that is slower gets a notice", "[precision]") {
  // the defaults: matmuls as param_dtype, NS f32, whatever the rates
  RunPrecision p = decide_precision(with(DTypeChoice::param, DTypeChoice::f32), Device::CPU, 1, true, kBf16Faster,
                                    kBf16Faster);
  CHECK(p.matmul == DType::f32);
  CHECK(p.ns == NsDType::f32);
  CHECK(p.notices.empty());
  p = decide_precision(with(DTypeChoice::param, DTypeChoice::bf16, DType::bf16), Device::CPU, 1, true, kBf16Slower,
                       kBf16Slower);
  CHECK(p.matmul == DType::bf16);
  CHECK(p.ns == NsDType::bf16);
  REQUIRE(p.notices.size() == 2);
  CHECK(p.notices[0].find("precision.matmul_dtype") != std::string::npos);
  CHECK(p.notices[0].find("bf16 150 vs f32 250 GFLOP/s") != std::string::npos);
  CHECK(p.notices[1].find("optimizer.muon.ns_dtype") != std::string::npos);
  // bf16 parameters with f32 products
  p = decide_precision(with(DTypeChoice::f32, DTypeChoice::f32, DType::bf16), Device::CPU, 1, true, kBf16Slower,
                       kBf16Slower);
  CHECK(p.matmul == DType::f32);
  CHECK(p.notices.empty());
  // explicit bf16 where it is faster: no notice
  CHECK(decide_precision(with(DTypeChoice::bf16, DTypeChoice::bf16), Device::CPU, 1, true, kBf16Faster, kBf16Faster)
            .notices.empty());
}

TEST_CASE("the MFU denominator: measured on CPU, datasheet on CUDA, the config's when set", "[precision][mfu]") {
  TrainConfig c = with(DTypeChoice::auto_, DTypeChoice::f32);
  RunPrecision p = decide_precision(c, Device::CPU, 2, true, {500, 300}, {500, 300});  // summed over 2 ranks
  CHECK(p.peak_tflops_total == Approx(0.5));
  CHECK(p.peak_source.find("measured f32") != std::string::npos);
  p = decide_precision(c, Device::CPU, 2, true, kBf16Faster, kBf16Faster);
  CHECK(p.peak_tflops_total == Approx(0.8));
  CHECK(decide_precision(c, Device::CUDA, 4, false, {}, {}).peak_tflops_total == Approx(4 * kCudaPeakTflops));
  c.logging.peak_tflops = 0.25;
  p = decide_precision(c, Device::CPU, 2, true, kBf16Faster, kBf16Faster);
  CHECK(p.peak_tflops_total == Approx(0.5));
  CHECK(p.peak_source.find("logging.peak_tflops") != std::string::npos);
  CHECK(std::isnan(model_flops_utilization(1e9, 1e3, 0.0)));
}

TEST_CASE("MFU matches its closed form for GPT-2 and Llama", "[precision][mfu]") {
  const double tok_s = 1234.5, peak = 0.8;  // TFLOP/s over all ranks
  GPTConfig g;
  g.n_layer = 3, g.n_head = 4, g.n_embd = 64, g.seq_len = 32, g.vocab_size = 100;
  const double L = 3, C = 64, T = 32, Vp = 128;  // tied head: wte [Vp, C] multiplies once
  const double gpt_flops = 6 * (L * 12 * C * C + Vp * C) + 12 * L * C * T;
  CHECK(g.flops_per_token(32) == Approx(gpt_flops).epsilon(1e-12));
  CHECK(model_flops_utilization(g.flops_per_token(32), tok_s, peak) == Approx(gpt_flops * tok_s / (peak * 1e12)));

  LlamaConfig l;
  l.n_layer = 2, l.n_head = 4, l.n_kv_head = 2, l.n_embd = 64, l.intermediate_size = 160, l.seq_len = 32,
  l.vocab_size = 65;
  const double Ll = 2, Cl = 64, kv = 2 * 16, I = 160, Vl = 128;  // untied head [Vp, C]; lookups free
  const double llama_flops = 6 * (Ll * (2 * Cl * Cl + 2 * kv * Cl + 3 * I * Cl) + Vl * Cl) + 12 * Ll * Cl * 32;
  CHECK(l.flops_per_token(32) == Approx(llama_flops).epsilon(1e-12));
  CHECK(model_flops_utilization(l.flops_per_token(32), tok_s, peak) == Approx(llama_flops * tok_s / (peak * 1e12)));
}

TEST_CASE("probe shapes follow the run and stay small", "[precision][probe]") {
  TrainConfig c;
  c.model.n_embd = 768, c.model.seq_len = 64, c.training.micro_batch_size = 4;
  const GemmShape m = matmul_probe_shape(c);
  CHECK(m.M == 256);
  CHECK(m.N == 3072);
  CHECK(m.K == 768);
  const GemmShape s = probe_shape(ns_probe_shape(c));
  CHECK(2.0 * s.M * s.N * s.K <= 2e8);
  CHECK(s.M >= 64);
  CHECK(bf16_pays({100, 115}));
  CHECK(!bf16_pays({100, 114}));
  CHECK(bf16_pays({100, 101}, kBf16StepMargin));
  CHECK(!bf16_pays({0, 0}));
}
