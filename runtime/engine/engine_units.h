// Private to the engine's .cpp files: one FSDP unit's buffers on a rank, the parameter
// bindings into them, and the owned pieces with their optimizer state.
#pragma once
#include <vector>

#include "runtime/engine/sharded_engine.h"

namespace mfsdp {

/// A parameter of a unit: where its full value lives while the unit is gathered.
struct ShardedEngine::Binding {
  int shard = 0;        // index into plan_.shards
  bool direct = false;  // true: a view into Unit::full at `offset`; false: into Unit::unpacked
  int64_t offset = 0;
  Tensor param;         // the tensor bound to the model
};

/// A piece of a parameter this rank updates, with its optimizer state.
struct ShardedEngine::OwnedPiece {
  int shard = 0;
  int64_t shard_offset = 0;  // element offset in Unit::shard / Unit::shard_grad
  int64_t param_offset = 0;
  int64_t numel = 0;         // may be 0 for an fsdp2 matrix this rank holds no rows of
  Tensor m, v;               // Muon momentum | AdamW first and second moments
};

/// One FSDP unit's buffers on this rank.
struct ShardedEngine::Unit {
  int index = 0;
  std::vector<int64_t> counts;     // per-rank segment numel
  int64_t total = 0, my_offset = 0, my_count = 0;
  Tensor shard, shard_grad;        // owned segment (persistent)
  Tensor full, full_grad;          // whole unit buffer (comm layout), released when not in use
  Tensor unpacked, unpacked_grad;  // params whose pieces are not one contiguous run
  std::vector<Binding> params;
  std::vector<OwnedPiece> owned;
  bool any_direct = false;  // some parameter is a view into `full` (else `full` is only a staging buffer)
  bool gathered = false, grads_live = false;
};

}  // namespace mfsdp
