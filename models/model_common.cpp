#include "models/model_common.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "runtime/autograd.h"
#include "runtime/core/rng.h"
#include "runtime/ops.h"

namespace mfsdp {
namespace {

uint64_t hash_name(const std::string& s) {  // FNV-1a
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

}  // namespace

BoundParams::BoundParams(const ParamInventory& inv, std::string owner) : owner_(std::move(owner)) {
  for (const auto& p : inv.params) shapes_[p.name] = p.shape;
}

void BoundParams::bind(const std::string& name, const Tensor& t) {
  const std::string op = owner_ + "::bind";
  auto it = shapes_.find(name);
  check_arg(it != shapes_.end(), op.c_str(), "unknown parameter '" + name + "'");
  check_arg(t.shape() == it->second, op.c_str(),
            name + ": expected shape " + shape_str(it->second) + ", got " + t.describe());
  params_[name] = t;
}

const Tensor& BoundParams::get(const std::string& name) const {
  auto it = params_.find(name);
  if (it == params_.end()) {
    const std::string op = owner_ + "::param";
    check_arg(shapes_.count(name) > 0, op.c_str(), "unknown parameter '" + name + "'");
    throw std::logic_error("[" + op + "] parameter '" + name + "' is not bound");
  }
  return it->second;
}

void BoundParams::allocate_local(const ParamInventory& inv, const std::function<void(const ParamSpec&, float*)>& init,
                                 Device device) {
  int64_t total = 0;
  for (const auto& p : inv.params) total += p.numel();
  {
    MemCategoryScope s(MemCategory::parameters);
    local_params_ = Tensor::empty({total}, DType::f32, Device::CPU);
  }
  {
    MemCategoryScope s(MemCategory::gradients);
    local_grads_ = Tensor::zeros({total}, DType::f32, device);
  }
  int64_t off = 0;
  for (const auto& p : inv.params) {
    init(p, local_params_.data_f32() + off);
    off += p.numel();
  }
  if (device != Device::CPU) {
    MemCategoryScope s(MemCategory::parameters);
    local_params_ = local_params_.to(device);
  }
  off = 0;
  for (const auto& p : inv.params) {
    Tensor t = local_params_.view(off, p.shape);
    t.set_requires_grad(true);
    t.set_grad(local_grads_.view(off, p.shape));
    bind(p.name, t);
    off += p.numel();
  }
}

void normal_init(uint64_t seed, const std::string& name, double std, int64_t first, int64_t count, float* out) {
  const uint64_t stream = seed * 0x2545F4914F6CDD1DULL ^ hash_name(name);
  const int64_t end = first + count;
  for (int64_t i = first; i < end;) {  // Box-Muller: element 2p is pair p's cosine, 2p+1 its sine
    const int64_t pair = i / 2;
    uint64_t state = stream + static_cast<uint64_t>(2 * pair) * kSplitmix64Gamma;  // two draws per pair
    const double u1 = uniform01(state), u2 = uniform01(state);
    const double r = std::sqrt(-2.0 * std::log(u1));
    if (i % 2 == 0) out[i - first] = static_cast<float>(std * r * std::cos(2.0 * M_PI * u2));
    if (i % 2 == 1 || i + 1 < end) out[pair * 2 + 1 - first] = static_cast<float>(std * r * std::sin(2.0 * M_PI * u2));
    i = pair * 2 + 2;
  }
}

void zero_from(int64_t from, int64_t first, int64_t count, float* out) {
  const int64_t start = std::max(from, first);
  if (start < first + count) std::fill(out + (start - first), out + count, 0.0f);
}

std::vector<int32_t> sample_from_logits(const std::function<Tensor(const Tensor&)>& logits_of, int seq_len,
                                        int vocab_size, std::vector<int32_t> prompt, int n, float temperature,
                                        int top_k, uint64_t seed) {
  NoGradGuard no_grad;
  if (prompt.empty()) prompt.push_back(0);
  uint64_t state = seed;
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(prompt.size()), seq_len);
    std::vector<int32_t> ctx(prompt.end() - T, prompt.end());
    Tensor logits = logits_of(tokens_tensor(ctx, {1, T})).to(Device::CPU);
    const float* last = logits.data_f32() + (T - 1) * logits.size(1);
    std::vector<double> p(vocab_size);
    double mx = -INFINITY;
    for (int v = 0; v < vocab_size; ++v) mx = std::max(mx, static_cast<double>(last[v]));
    const double temp = std::max(1e-4f, temperature);
    if (top_k > 0 && top_k < vocab_size) {
      std::vector<float> sorted(last, last + vocab_size);
      std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<float>());
      const float kth = sorted[top_k - 1];
      for (int v = 0; v < vocab_size; ++v) p[v] = last[v] >= kth ? std::exp((last[v] - mx) / temp) : 0.0;
    } else {
      for (int v = 0; v < vocab_size; ++v) p[v] = std::exp((last[v] - mx) / temp);
    }
    const double total = std::accumulate(p.begin(), p.end(), 0.0);
    double r = uniform01(state) * total;
    int32_t next = vocab_size - 1;
    for (int v = 0; v < vocab_size; ++v) {
      r -= p[v];
      if (r <= 0) {
        next = v;
        break;
      }
    }
    prompt.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace mfsdp
