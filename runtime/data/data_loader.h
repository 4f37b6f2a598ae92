// Training data loader over llm.c token shards, and the validation-split enumerator.
//
// Notation: B micro-batch size (sequences per rank per micro-batch), T sequence length,
// W world size, A grad_accum (micro-batches per step), r rank, k micro-batch index in the step.
// A *global batch* is the data of one optimizer step: G = W*A*B*T tokens (+1 for the last target).
// Each shard holds nb = floor((ntok - 1) / G) global batches (windows); shards must hold at least
// one (validate_shards with min_tokens = G + 1). Micro-batch (k, r) of a global batch that starts at
// token `base` reads the B*T+1 tokens at base + (k*W + r)*B*T: inputs are the first B*T, targets the
// same shifted by one, both row-major [B, T] int32.
//
// Order with shuffle = false (llm.c's): shards in sorted glob order; at step s of the current shard
// base = s*G, i.e. rank r reads from offset ((s*A + k)*W + r)*B*T; after the last window that fits
// (the next global batch would pass the end) the loader moves to the next shard, wrapping from the
// last shard to the first (a new epoch).
// Order with shuffle = true: epoch e visits the shards in a permutation P_e of the shard indices,
// and within shard P_e[i] the nb windows in a permutation Q_{e,i}; both are Fisher-Yates shuffles
// driven by splitmix64 seeded from (seed, e) and (seed, e, i), so the order is a deterministic
// function of the seed, independent of the platform's standard library.
// In both orders the global batch content depends only on G (not on how it splits into W, A, B):
// runs with the same W*A*B see the same tokens at every step, whatever the world size.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/data/token_shards.h"

namespace mfsdp {

/// Loader position at a step boundary, in global terms (valid at any world size with the same
/// global batch G). shard: position in the epoch's shard order (the file index when shuffle is
/// false); batch: global-batch index within that shard's window order; global_batch_tokens: G.
struct LoaderState {
  int64_t epoch = 0;
  int64_t shard = 0;
  int64_t batch = 0;
  int64_t global_batch_tokens = 0;
  bool operator==(const LoaderState&) const = default;
};
void to_json(nlohmann::json& j, const LoaderState& s);
/// Throws DataError when a key is missing or not an integer.
void from_json(const nlohmann::json& j, LoaderState& s);

/// Deterministic training loader (see the file comment for the order). Shards stay memory-mapped.
class DataLoader {
 public:
  /// Validates every shard of `glob` (validate_shards with min_tokens = W*A*B*T + 1) and positions
  /// at the start. Throws std::invalid_argument for B, T, world, grad_accum < 1 or rank outside
  /// [0, world), DataError for any data problem.
  DataLoader(const std::string& glob, int B, int T, int rank, int world, int grad_accum, bool shuffle,
             uint64_t seed, int64_t vocab_size);

  /// Fills inputs and targets ([B, T] int32 each) with this rank's next micro-batch; after A calls
  /// the loader moves to the next global batch.
  void next(int32_t* inputs, int32_t* targets);

  /// Position of the next global batch. Throws std::logic_error when called mid-step (after
  /// 1..A-1 calls of next()).
  LoaderState state() const;
  /// Restores a position saved by state(), possibly at another world size. With shuffle = false a
  /// different G is converted through the token offset (rounded up to the next window); with
  /// shuffle = true G must match. Throws DataError when the state does not fit these shards.
  void set_state(const LoaderState& s);
  /// Back to the start (epoch 0, first shard, first window).
  void reset() { set_state(LoaderState{0, 0, 0, global_batch_tokens()}); }

  int64_t global_batch_tokens() const { return G_; }
  int64_t num_shards() const { return static_cast<int64_t>(shards_.size()); }
  /// Token offset (in its shard) and shard file index of the micro-batch the next call reads.
  int64_t next_offset() const;
  int64_t next_shard_file() const { return file_index(); }
  const std::vector<ShardInfo>& shards() const { return info_; }

 private:
  int64_t windows(int64_t file) const { return (shards_[file].num_tokens() - 1) / G_; }
  int64_t file_index() const;    // file of the current (epoch, shard)
  int64_t window_index() const;  // window of the current (epoch, shard, batch)
  void refresh_orders();         // recompute the permutations for the current epoch/shard

  int B_, T_, rank_, world_, accum_;
  bool shuffle_;
  uint64_t seed_;
  int64_t G_;
  std::vector<TokenShard> shards_;
  std::vector<ShardInfo> info_;
  LoaderState pos_;
  int micro_ = 0;
  std::vector<int64_t> shard_order_;   // shuffle: P_e
  std::vector<int64_t> window_order_;  // shuffle: Q_{e,i}
};

/// The validation split as consecutive [T+1]-token windows with stride T: shard by shard (sorted),
/// sequence j of a shard covers tokens [j*T, j*T + T] so every token except the shard's first is a
/// target exactly once. A shard with (ntok - 1) % T != 0 ends in a partial window; with
/// pad_last = true it is included, its missing inputs padded with 0 and missing targets set to -1
/// ("ignore": the loss must skip them); with pad_last = false it is dropped (its tail tokens are
/// not evaluated). The sequences are read in *global batches* of B consecutive sequences (the
/// last may be short); global batch g goes to rank g % W as that rank's batch g / W. Every batch
/// therefore holds the same sequences at every world size, and so has the same loss bits.
class EvalSplit {
 public:
  /// max_tokens > 0 limits the split to its first ceil(max_tokens / T) sequences (eval_tokens);
  /// 0 means the whole split. Validates the shards (vocab, header; at least T+1 tokens each).
  EvalSplit(const std::string& glob, int T, int rank, int world, int64_t vocab_size,
            int64_t max_tokens = 0, bool pad_last = false);

  int64_t num_sequences() const { return n_; }  ///< over all ranks
  /// Batches of up to B sequences for this rank.
  int64_t num_batches(int B) const;
  /// Max of num_batches over all ranks: every rank must run this many evaluation forwards if the
  /// forward involves collectives (ranks past their range get 0-row batches).
  int64_t num_batches_all_ranks(int B) const;
  /// Fills rows of this rank's batch b (global batch b*W + rank; [rows, T] int32 each; rows <= B)
  /// and returns rows (0 when that global batch is past the split). Targets of padded positions
  /// are -1. The sequences are [first_sequence(b, B), first_sequence(b, B) + rows).
  int64_t batch(int64_t b, int B, int32_t* inputs, int32_t* targets) const;
  /// Global index of the first sequence of this rank's batch b.
  int64_t first_sequence(int64_t b, int B) const { return (b * world_ + rank_) * B; }
  /// Number of targets (!= -1) in sequences [begin, end) — to weight per-rank losses.
  int64_t num_targets(int64_t begin, int64_t end) const;
  /// Fills one sequence (global index) and returns its number of targets.
  int64_t sequence(int64_t index, int32_t* inputs, int32_t* targets) const;

 private:
  int T_, rank_, world_;
  std::vector<TokenShard> shards_;
  std::vector<int64_t> first_seq_;  // prefix sums of per-shard sequence counts
  int64_t n_ = 0;
};

}  // namespace mfsdp
