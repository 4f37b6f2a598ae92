#include "runtime/data/data_loader.h"

#include <algorithm>
#include <stdexcept>

#include "runtime/core/rng.h"

namespace mfsdp {

namespace {

// Fisher-Yates permutation of 0..n-1 driven by splitmix64 from a mixed seed.
std::vector<int64_t> permutation(int64_t n, uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t state = seed;
  uint64_t mix = splitmix64(state) ^ (a * 0xd1b54a32d192ed03ull);
  mix = splitmix64(mix) ^ (b * 0x8cb92ba72f3d8dd7ull);
  state = splitmix64(mix);
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    // Unbiased enough for n << 2^64 (modulo bias < n / 2^64).
    const int64_t j = static_cast<int64_t>(splitmix64(state) % static_cast<uint64_t>(i + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

int64_t get_int(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j.at(key).is_number_integer())
    throw DataError(std::string("[LoaderState] key '") + key + "' missing or not an integer in " +
                    j.dump());
  return j.at(key).get<int64_t>();
}

}  // namespace

void to_json(nlohmann::json& j, const LoaderState& s) {
  j = nlohmann::json{{"epoch", s.epoch},
                     {"shard", s.shard},
                     {"batch", s.batch},
                     {"global_batch_tokens", s.global_batch_tokens}};
}

void from_json(const nlohmann::json& j, LoaderState& s) {
  s.epoch = get_int(j, "epoch");
  s.shard = get_int(j, "shard");
  s.batch = get_int(j, "batch");
  s.global_batch_tokens = get_int(j, "global_batch_tokens");
}

// ---------------------------------------------------------------------------------------------
// DataLoader

DataLoader::DataLoader(const std::string& glob, int B, int T, int rank, int world, int grad_accum,
                       bool shuffle, uint64_t seed, int64_t vocab_size)
    : B_(B), T_(T), rank_(rank), world_(world), accum_(grad_accum), shuffle_(shuffle), seed_(seed) {
  if (B < 1 || T < 1 || world < 1 || grad_accum < 1 || rank < 0 || rank >= world)
    throw std::invalid_argument("[DataLoader] need B, T, world, grad_accum >= 1 and 0 <= rank < world; got B=" +
                                std::to_string(B) + " T=" + std::to_string(T) + " rank=" +
                                std::to_string(rank) + " world=" + std::to_string(world) +
                                " grad_accum=" + std::to_string(grad_accum));
  G_ = static_cast<int64_t>(world) * grad_accum * B * T;
  info_ = validate_shards(glob, vocab_size, G_ + 1,
                          "one global batch (B*T*grad_accum*world + 1 = " + std::to_string(B) + "*" +
                              std::to_string(T) + "*" + std::to_string(grad_accum) + "*" +
                              std::to_string(world) + " + 1)");
  for (const ShardInfo& s : info_) shards_.emplace_back(s.path);
  pos_ = LoaderState{0, 0, 0, G_};
  refresh_orders();
}

void DataLoader::refresh_orders() {
  if (!shuffle_) return;
  shard_order_ = permutation(num_shards(), seed_, static_cast<uint64_t>(pos_.epoch), ~0ull);
  window_order_ = permutation(windows(shard_order_[pos_.shard]), seed_,
                              static_cast<uint64_t>(pos_.epoch), static_cast<uint64_t>(pos_.shard));
}

int64_t DataLoader::file_index() const { return shuffle_ ? shard_order_[pos_.shard] : pos_.shard; }

int64_t DataLoader::window_index() const { return shuffle_ ? window_order_[pos_.batch] : pos_.batch; }

int64_t DataLoader::next_offset() const {
  return window_index() * G_ + (static_cast<int64_t>(micro_) * world_ + rank_) * B_ * T_;
}

void DataLoader::next(int32_t* inputs, int32_t* targets) {
  const TokenShard& shard = shards_[file_index()];
  const int64_t n = static_cast<int64_t>(B_) * T_;
  const int64_t off = next_offset();
  // inputs = tokens [off, off+n), targets = tokens [off+1, off+n+1); read once into inputs + 1 token.
  shard.read(off, n, inputs);
  shard.read(off + 1, n, targets);
  if (++micro_ < accum_) return;
  micro_ = 0;
  if (++pos_.batch < windows(file_index())) return;
  pos_.batch = 0;
  if (++pos_.shard >= num_shards()) {
    pos_.shard = 0;
    ++pos_.epoch;
  }
  refresh_orders();
}

LoaderState DataLoader::state() const {
  if (micro_ != 0)
    throw std::logic_error("[DataLoader::state] called mid-step, after " + std::to_string(micro_) +
                           " of " + std::to_string(accum_) + " micro-batches");
  return pos_;
}

void DataLoader::set_state(const LoaderState& s) {
  const std::string where = "[DataLoader::set_state] ";
  if (s.epoch < 0 || s.shard < 0 || s.batch < 0 || s.shard >= num_shards())
    throw DataError(where + "state epoch=" + std::to_string(s.epoch) + " shard=" + std::to_string(s.shard) +
                    " batch=" + std::to_string(s.batch) + " does not fit " + std::to_string(num_shards()) +
                    " shard(s)");
  LoaderState p = s;
  if (s.global_batch_tokens != G_) {
    if (shuffle_ || s.global_batch_tokens <= 0)
      throw DataError(where + "saved global batch has " + std::to_string(s.global_batch_tokens) +
                      " tokens, this loader's has " + std::to_string(G_) +
                      " (keep world*grad_accum*B*T constant to resume a shuffled run)");
    const int64_t offset = s.batch * s.global_batch_tokens;
    p.batch = (offset + G_ - 1) / G_;
    p.global_batch_tokens = G_;
  }
  micro_ = 0;
  pos_ = p;
  pos_.batch = 0;
  refresh_orders();
  if (p.batch >= windows(file_index())) {
    if (s.global_batch_tokens == G_)
      throw DataError(where + "batch " + std::to_string(p.batch) + " is past the " +
                      std::to_string(windows(file_index())) + " global batches of shard " +
                      shards_[file_index()].path());
    // Converted position past the end of the shard: continue with the next shard.
    if (++pos_.shard >= num_shards()) {
      pos_.shard = 0;
      ++pos_.epoch;
    }
    refresh_orders();
    return;
  }
  pos_.batch = p.batch;
}

// ---------------------------------------------------------------------------------------------
// EvalSplit

EvalSplit::EvalSplit(const std::string& glob, int T, int rank, int world, int64_t vocab_size,
                     int64_t max_tokens, bool pad_last)
    : T_(T), rank_(rank), world_(world) {
  if (T < 1 || world < 1 || rank < 0 || rank >= world || max_tokens < 0)
    throw std::invalid_argument("[EvalSplit] need T, world >= 1, 0 <= rank < world, max_tokens >= 0; got T=" +
                                std::to_string(T) + " rank=" + std::to_string(rank) + " world=" +
                                std::to_string(world) + " max_tokens=" + std::to_string(max_tokens));
  const auto info = validate_shards(glob, vocab_size, static_cast<int64_t>(T) + 1, "one evaluation sequence (T + 1)");
  first_seq_.push_back(0);
  for (const ShardInfo& s : info) {
    shards_.emplace_back(s.path);
    const int64_t targets = s.num_tokens - 1;
    const int64_t seqs = pad_last ? (targets + T - 1) / T : targets / T;
    first_seq_.push_back(first_seq_.back() + seqs);
  }
  n_ = first_seq_.back();
  if (max_tokens > 0) n_ = std::min(n_, (max_tokens + T - 1) / T);
}

int64_t EvalSplit::num_batches(int B) const {
  if (B < 1) throw std::invalid_argument("[EvalSplit::num_batches] B must be >= 1, got " + std::to_string(B));
  const int64_t global = (n_ + B - 1) / B;  // global batches g = b*W + rank with g < global
  return global > rank_ ? (global - rank_ - 1) / world_ + 1 : 0;
}

int64_t EvalSplit::num_batches_all_ranks(int B) const {
  if (B < 1) throw std::invalid_argument("[EvalSplit::num_batches_all_ranks] B must be >= 1, got " + std::to_string(B));
  return ((n_ + B - 1) / B + world_ - 1) / world_;
}

int64_t EvalSplit::sequence(int64_t index, int32_t* inputs, int32_t* targets) const {
  if (index < 0 || index >= n_)
    throw std::out_of_range("[EvalSplit::sequence] index " + std::to_string(index) + " outside [0, " +
                            std::to_string(n_) + ")");
  const size_t s = static_cast<size_t>(std::upper_bound(first_seq_.begin(), first_seq_.end(), index) -
                                       first_seq_.begin() - 1);
  const TokenShard& shard = shards_[s];
  const int64_t start = (index - first_seq_[s]) * T_;
  const int64_t avail = std::min<int64_t>(T_, shard.num_tokens() - 1 - start);  // targets present
  shard.read(start, avail, inputs);
  shard.read(start + 1, avail, targets);
  for (int64_t t = avail; t < T_; ++t) {
    inputs[t] = 0;
    targets[t] = -1;
  }
  return avail;
}

int64_t EvalSplit::batch(int64_t b, int B, int32_t* inputs, int32_t* targets) const {
  if (B < 1 || b < 0)
    throw std::invalid_argument("[EvalSplit::batch] need b >= 0 and B >= 1, got b=" + std::to_string(b) +
                                " B=" + std::to_string(B));
  const int64_t first = first_sequence(b, B);
  const int64_t rows = std::max<int64_t>(0, std::min<int64_t>(B, n_ - first));
  for (int64_t i = 0; i < rows; ++i) sequence(first + i, inputs + i * T_, targets + i * T_);
  return rows;
}

int64_t EvalSplit::num_targets(int64_t begin, int64_t end) const {
  int64_t total = 0;
  for (size_t s = 0; s + 1 < first_seq_.size(); ++s) {
    const int64_t lo = std::max(begin, first_seq_[s]), hi = std::min({end, first_seq_[s + 1], n_});
    if (lo >= hi) continue;
    const int64_t targets = shards_[s].num_tokens() - 1;
    // Sequence j (local) has min(T, targets - j*T) targets; only the shard's last can be partial.
    total += (hi - lo) * T_;
    const int64_t last_local = first_seq_[s + 1] - 1 - first_seq_[s];
    if (hi - 1 == first_seq_[s] + last_local) total -= T_ - std::min<int64_t>(T_, targets - last_local * T_);
  }
  return total;
}

}  // namespace mfsdp
