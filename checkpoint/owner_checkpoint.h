// Owner-shard checkpoints: each rank writes the pieces it owns (parameter, momentum, AdamW
// moments) to its own safetensors file; rank 0 writes manifest.json last and renames the
// directory into place. Because owners hold whole matrices, loading at another world size or
// placement is reassignment: every rank reads exactly the logical ranges it will own from
// whichever files hold them. The layout and the save protocol are described in
// checkpoint/README.md.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/data/data_loader.h"
#include "runtime/engine/sharded_engine.h"

namespace mfsdp {

/// A missing, incomplete, corrupted or incompatible checkpoint, or a failed save. The message
/// names the file (and the tensor or manifest field).
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Run state saved next to the tensors.
struct CheckpointMeta {
  int64_t step = 0;    ///< optimizer steps completed (the next step index)
  int64_t tokens = 0;  ///< training tokens consumed
  LoaderState loader;  ///< data position in global terms
  nlohmann::json config;           ///< the effective config at save time
  std::string state_fingerprint;   ///< ShardedEngine::state_fingerprint() at save time
  /// The run's data files as the manifest's "data" records them (any JSON object; the trainer's
  /// data_fingerprints: each train/val file and its content fingerprint); null: not recorded.
  nlohmann::json data;
};

/// One saved piece: a logical range [offset, offset + numel) of one state tensor in one file.
struct CheckpointPiece {
  std::string file;  ///< file name inside the checkpoint directory
  std::string key;   ///< tensor key inside that file
  int64_t offset = 0, numel = 0;
  uint64_t xxh64 = 0;  ///< XXH3-64 of the piece's little-endian f32 bytes
};

/// A parsed, validated manifest.json.
struct CheckpointManifest {
  /// 2: the manifest begins with its own checksum (seal_manifest); version 1 had none and is refused.
  static constexpr int kFormatVersion = 2;
  std::string dir;  ///< the checkpoint directory it was read from
  int64_t step = 0, tokens = 0, optimizer_steps = 0;
  int world_size = 0;
  std::string placement;
  LoaderState loader;
  nlohmann::json config, plan;
  std::string state_fingerprint;
  /// The manifest's "data": an object (CheckpointMeta::data), or null when the manifest has none
  /// (written by a build that did not record the data files).
  nlohmann::json data;
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    std::string optimizer;  ///< "muon" or "adamw"
    /// pieces[kind]: sorted by offset, tiling [0, numel) exactly; kind v: AdamW tensors, and Muon
    /// tensors saved under variant normuon, whose v tiles [0, rows) (one value per row).
    std::vector<CheckpointPiece> pieces[3];
  };
  std::vector<Tensor> tensors;

  /// Reads and validates `dir`/manifest.json: a regular file whose checksum line matches its
  /// content (checked before any field is read), then format and version, types of every field,
  /// the step against a directory named step_<digits>, pieces that tile each tensor exactly.
  /// Throws CheckpointError naming the file and field.
  static CheckpointManifest read(const std::string& dir);
  const Tensor* find(const std::string& name) const;
};

/// The manifest text as written: `body` (a JSON object dumped with a line break after its '{')
/// with a first field "manifest_xxh3" inserted on its own line, holding the XXH3-64 (16 lowercase
/// hex digits) of every byte after that line. Any change to the file then fails
/// CheckpointManifest::read. Throws std::invalid_argument when `body` does not start with "{\n".
std::string seal_manifest(const std::string& body);

/// Watches the steps of save_checkpoint. The default does nothing; a test binary installs its own
/// (set_save_observer) to stop a rank at a chosen point of the save protocol.
class SaveObserver {
 public:
  virtual ~SaveObserver() = default;
  /// Called on every rank right after it wrote its rank file `path` of the checkpoint of `step`,
  /// before any rank learns whether the others succeeded and before the manifest is written.
  virtual void after_rank_file(int64_t /*step*/, int /*rank*/, int /*world*/, const std::string& /*path*/) {}
  /// Called on rank 0 right after it published the checkpoint `dir` of `step` (manifest, rename,
  /// latest pointer, pruning), before the other ranks learn the outcome.
  virtual void after_publish(int64_t /*step*/, const std::string& /*dir*/) {}
};

/// The observer save_checkpoint calls (the do-nothing default unless one was installed).
SaveObserver& save_observer();
/// Installs `observer` for the following saves (nullptr: back to the default); returns the
/// previous one. The caller keeps `observer` alive while it is installed.
SaveObserver* set_save_observer(SaveObserver* observer);

/// The timeouts of save_checkpoint's waits (Communicator::set_timeout, seconds and the name timeout
/// reports give them). Three waits stand behind file I/O and get `io`: for rank 0's temporary
/// directory, for every rank's file, for rank 0's manifest, rename and pruning. The exchange of
/// piece records, and everything after the save, get `collective`.
struct SaveWaitBounds {
  double io_seconds = 0;
  std::string io_name;
  double collective_seconds = 0;
  std::string collective_name;
};

/// Saves a checkpoint of `engine` under `root` as step_<8-digit step>/ (collective: every rank
/// calls it at the same step). Ranks write into step_N.tmp/, rank 0 then writes manifest.json,
/// renames the directory into place, points `root`/latest at it and deletes the oldest complete
/// checkpoints beyond `keep_last` (0 keeps all). With `waits`, its waits run under those bounds
/// (without, under the communicator's own). Returns the directory. Throws CheckpointError on
/// every rank when any rank failed to write (the previous checkpoints are untouched).
std::string save_checkpoint(ShardedEngine& engine, const std::string& root, const CheckpointMeta& meta, int keep_last,
                            const SaveWaitBounds* waits = nullptr);

/// Resolves training.resume: "" -> "" (start fresh); "auto" -> the newest complete checkpoint
/// under `root` ("" when there is none; `note` then says so, and mentions incomplete ones);
/// anything else -> that directory, which must hold a manifest (else CheckpointError).
/// Local and deterministic: every rank resolves the same directory from the same files.
std::string resolve_resume(const std::string& resume, const std::string& root, std::string* note);

/// Checks that the manifest describes the engine's model (the same tensors, shapes and optimizer
/// kinds); then reads every range this rank needs under the engine's plan, verifying the
/// checksum of each piece it touches, and loads it (ShardedEngine::load_state). Local (no
/// collective). Throws CheckpointError naming the file and tensor.
void load_checkpoint(ShardedEngine& engine, const CheckpointManifest& manifest);

/// The full logical tensor `name` (kind param, m or v; a Muon v is NorMuon's [rows] state, empty when
/// not saved) assembled from its pieces, checksums
/// verified. Throws CheckpointError naming the file and tensor.
std::vector<float> read_full_tensor(const CheckpointManifest& manifest, const std::string& name, StateKind kind);

/// Checks every piece of every tensor (file present, key, dtype, length, checksum); returns one
/// message per problem (empty when the checkpoint is intact).
std::vector<std::string> verify_checkpoint(const CheckpointManifest& manifest);

/// Why `dir` (a step_N.tmp path) must not be removed as a partial checkpoint: "" when it is absent
/// or a directory holding only what a save writes there (rank_<digits>.safetensors, manifest.json
/// and their SwapFile temporaries; empty included), else "<dir> holds <entry>, which no checkpoint
/// save writes" (or "is not a directory"). Saves refuse such a path; start-up cleanup keeps it.
std::string foreign_partial_checkpoint(const std::string& dir);

/// Complete checkpoints under `root` (directories step_* with a manifest.json), oldest first.
std::vector<std::string> list_checkpoints(const std::string& root);

}  // namespace mfsdp
