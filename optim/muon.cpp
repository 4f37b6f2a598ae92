// CPU Muon: momentum and update in OpenMP loops; the orthogonalization (Newton-Schulz and its
// variants) lives in optim/orthogonalize.cpp.
#include "optim/muon.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "optim/clip.h"

namespace mfsdp {

namespace {

std::atomic<int64_t> g_ns_calls{0};

std::vector<float>& update_scratch() {
  thread_local std::vector<float> u;
  return u;
}

void check_shape(const char* op, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument(std::string("[") + op + "] negative shape [" + std::to_string(rows) +
                                ", " + std::to_string(cols) + "]");
}

}  // namespace



int64_t newton_schulz_call_count() { return g_ns_calls.load(std::memory_order_relaxed); }
void reset_newton_schulz_call_count() { g_ns_calls.store(0, std::memory_order_relaxed); }

namespace detail {

void count_newton_schulz_call() { g_ns_calls.fetch_add(1, std::memory_order_relaxed); }

void validate_muon_options(const MuonOptions& opt, const char* op) {
  if (!(opt.momentum >= 0.0 && opt.momentum < 1.0))
    throw std::invalid_argument(std::string("[") + op + "] momentum " + std::to_string(opt.momentum) +
                                " is outside [0, 1)");
  if (opt.ns_steps < 0)
    throw std::invalid_argument(std::string("[") + op + "] ns_steps " + std::to_string(opt.ns_steps) +
                                " is negative");
  if (!std::isfinite(opt.weight_decay) || opt.weight_decay < 0.0)
    throw std::invalid_argument(std::string("[") + op + "] weight_decay " +
                                std::to_string(opt.weight_decay) + " must be finite and >= 0");
  if (!(opt.beta2 >= 0.0 && opt.beta2 < 1.0))
    throw std::invalid_argument(std::string("[") + op + "] beta2 " + std::to_string(opt.beta2) +
                                " is outside [0, 1)");
  if (!std::isfinite(opt.normuon_eps) || opt.normuon_eps < 0.0)
    throw std::invalid_argument(std::string("[") + op + "] normuon_eps " +
                                std::to_string(opt.normuon_eps) + " must be finite and >= 0");
  if (opt.ns_dtype == NsDType::bf16 && opt.orthogonalizer == Orthogonalizer::gram_newton_schulz)
    throw std::invalid_argument(std::string("[") + op +
                                "] ns_dtype bf16 is not supported with orthogonalizer gram_newton_schulz "
                                "(use f32, or newton_schulz5 / polar_express)");
  if (opt.split_heads && opt.head_dim < 1)
    throw std::invalid_argument(std::string("[") + op + "] split_heads needs head_dim >= 1, got " +
                                std::to_string(opt.head_dim));
}

int64_t muon_block_count(int64_t rows, int64_t cols, const MuonOptions& opt, int qkv_blocks,
                         const char* op) {
  if (rows <= 0 || cols <= 0)
    throw std::invalid_argument(std::string("[") + op + "] matrix shape [" + std::to_string(rows) +
                                ", " + std::to_string(cols) + "] must be positive");
  if (qkv_blocks < 1)
    throw std::invalid_argument(std::string("[") + op + "] qkv_blocks " + std::to_string(qkv_blocks) +
                                " must be >= 1");
  if (opt.split_heads && qkv_blocks > 1) {
    if (rows % qkv_blocks != 0 || (rows / qkv_blocks) % opt.head_dim != 0)
      throw std::invalid_argument(std::string("[") + op + "] split_heads: head_dim " +
                                  std::to_string(opt.head_dim) + " does not divide the " +
                                  std::to_string(qkv_blocks) + " blocks of rows " + std::to_string(rows));
    return rows / opt.head_dim;
  }
  if (!opt.split_qkv || qkv_blocks == 1) return 1;
  if (rows % qkv_blocks != 0)
    throw std::invalid_argument(std::string("[") + op + "] split_qkv: rows " + std::to_string(rows) +
                                " not divisible by qkv_blocks " + std::to_string(qkv_blocks));
  return qkv_blocks;
}

}  // namespace detail

double muon_scale(int64_t rows, int64_t cols, MuonScaleRule rule) {
  if (rows <= 0 || cols <= 0)
    throw std::invalid_argument("[muon_scale] shape [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "] must be positive");
  const double m = static_cast<double>(rows), n = static_cast<double>(cols);
  if (rule == MuonScaleRule::original) return std::sqrt(std::max(1.0, m / n));
  return 0.2 * std::sqrt(std::max(m, n));
}

void newton_schulz_cpu(const float* G, float* out, int64_t rows, int64_t cols, int steps) {
  check_shape("newton_schulz_cpu", rows, cols);
  if (steps < 0)
    throw std::invalid_argument("[newton_schulz_cpu] steps " + std::to_string(steps) + " is negative");
  if (rows != 0 && cols != 0 && (G == nullptr || out == nullptr))
    throw std::invalid_argument("[newton_schulz_cpu] null buffer for a [" + std::to_string(rows) +
                                ", " + std::to_string(cols) + "] matrix");
  orthogonalize_cpu(G, out, rows, cols, steps, Orthogonalizer::newton_schulz5);  // counts the call
}

void muon_step_cpu(float* W, const float* G, float* M, int64_t rows, int64_t cols, double lr,
                   const MuonOptions& opt, int qkv_blocks) {
  detail::validate_muon_options(opt, "muon_step_cpu");
  if (opt.variant != MuonVariant::muon)
    throw std::invalid_argument(std::string("[muon_step_cpu] variant ") + muon_variant_name(opt.variant) +
                                " needs its per-row state: run normuon_normalize_cpu between "
                                "orthogonalization and muon_apply_update_cpu");
  const int64_t blocks = detail::muon_block_count(rows, cols, opt, qkv_blocks, "muon_step_cpu");
  if (W == nullptr || G == nullptr || M == nullptr)
    throw std::invalid_argument("[muon_step_cpu] null W, G or M buffer");
  if (!std::isfinite(lr))
    throw std::invalid_argument("[muon_step_cpu] learning rate " + std::to_string(lr) + " is not finite");

  const int64_t numel = rows * cols;
  std::vector<float>& ubuf = update_scratch();
  if (static_cast<int64_t>(ubuf.size()) < numel) ubuf.resize(static_cast<size_t>(numel));
  float* U = ubuf.data();

  muon_momentum_cpu(G, M, U, numel, opt);

  // O overwrites U block by block (each orthogonalization reads its input into scratch first).
  const int64_t brows = rows / blocks;
  orthogonalize_strided_cpu(U, U, blocks, brows, cols, opt.ns_steps, opt.orthogonalizer, opt.ns_dtype);

  muon_apply_update_cpu(W, U, numel, lr, muon_scale(brows, cols, opt.scale_rule), opt.weight_decay);
}

void muon_momentum_cpu(const float* G, float* M, float* U, int64_t n, const MuonOptions& opt) {
  const float beta = static_cast<float>(opt.momentum);
  const float one_minus_beta = static_cast<float>(1.0 - opt.momentum);
  const bool nesterov = opt.nesterov;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float g = G[i];
    const float m = beta * M[i] + one_minus_beta * g;
    M[i] = m;
    U[i] = nesterov ? one_minus_beta * g + beta * m : m;
  }
}

void muon_apply_update_cpu(float* W, const float* O, int64_t n, double lr, double scale, double weight_decay) {
  const float decay = static_cast<float>(1.0 - lr * weight_decay);
  const float step = static_cast<float>(lr * scale);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) W[i] = W[i] * decay - step * O[i];
}

}  // namespace mfsdp
