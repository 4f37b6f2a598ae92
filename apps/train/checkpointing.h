// The trainer's side of owner-shard checkpoints: resuming a run (every rank loads its pieces and
// all agree before training) and saving with a progress line, plus clearing leftovers of
// interrupted writes. The format itself is checkpoint/owner_checkpoint.h.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apps/train/run_log.h"
#include "apps/train/train_config.h"
#include "checkpoint/owner_checkpoint.h"
#include "runtime/data/data_loader.h"
#include "runtime/engine/sharded_engine.h"

namespace mfsdp {

/// Resolves training.resume against `ckpt_root` and, when it names a checkpoint, loads it into
/// `engine` and `loader` on every rank. Collective (the run's first): when any rank fails, every
/// rank throws InputError (the failing rank's message, or a pointer to it). Before loading, every
/// rank checks the data against the manifest (check_data_files). The loaded state's
/// fingerprint must equal the manifest's. Rank 0 logs where it resumed and any config changes
/// since the checkpoint. Returns the manifest, or nothing when starting fresh.
std::optional<CheckpointManifest> resume_run(const TrainConfig& cfg, const std::string& ckpt_root,
                                             ShardedEngine& engine, DataLoader& loader, bool lead);

/// The manifest's own config (CheckpointManifest::config) as a TrainConfig. Throws CheckpointError
/// naming the manifest and the config key.
TrainConfig saved_config(const CheckpointManifest& m);

/// The checks of a checkpoint's run state against a config and the data, shared by resume and
/// mfsdp-ckpt verify (one place for each rule): loader.global_batch_tokens must be the global
/// batch of the saved config at the saved world size (world_size x sharding.replicate x
/// training.grad_accum x training.micro_batch_size x model.seq_len), and the loader position must
/// fit `loader`'s shards and global batch (DataLoader::set_state: shard and batch in range; a
/// shuffled run keeps its global batch). Positions `loader` there. Throws CheckpointError naming
/// the manifest and the field.
void check_run_state(const CheckpointManifest& m, DataLoader& loader);

/// Every check of check_run_state for `m` without a run: against a loader over the saved config's
/// data.train at the saved world size; and check_data_files against `run`'s data (the config of
/// the run that would resume; nullptr: the saved config's), its notice in `note`. Returns one
/// message per problem (empty when none).
std::vector<std::string> verify_run_state(const CheckpointManifest& m, const TrainConfig* run = nullptr,
                                          std::string* note = nullptr);

/// The run's data files as checkpoint manifests record them (CheckpointMeta::data, the manifest's
/// "data"): {"train": [{"file": path, "fingerprint": file_fingerprint(path)}, ...], "val": [...]},
/// each split's files in expand_glob order (an empty array when the split is not configured).
nlohmann::json data_fingerprints(const TrainConfig& cfg);

/// The data a run resumes on must be the data the checkpoint was trained on (resume and
/// mfsdp-ckpt verify alike): data.train names as many files as the manifest's "data" records, each
/// with the recorded content fingerprint at its place (paths may change, content may not); so does
/// data.val when both the run and the checkpoint have one. Throws CheckpointError naming the data
/// file, the manifest and how to go on (restore the data, or start a new run from the checkpoint's
/// export via model.init_from). A manifest without "data" (an older build's) passes: returns a
/// one-line notice saying the data is not checked; otherwise "".
std::string check_data_files(const CheckpointManifest& m, const TrainConfig& cfg);

/// An upper bound of the bytes a checkpoint of `engine` writes, all ranks' files together: 12 per
/// parameter (f32 value, momentum or AdamW m, AdamW v). Bounds the ranks' waits while they save.
int64_t checkpoint_bytes_bound(const ShardedEngine& engine);

/// "" when `engine`'s state fingerprint (collective) equals the manifest's, else a message naming
/// the manifest (an edited or mismatched checkpoint). Resume and verify use it alike.
std::string fingerprint_mismatch(ShardedEngine& engine, const CheckpointManifest& m);

/// The checks resume runs on the loaded state, for `m` without a run: the saved config's model
/// (on the CPU, no replicas) at `comm`'s world size loads the checkpoint (load_checkpoint: tensors,
/// shapes, optimizer routing, every piece's checksum) and its state fingerprint must equal the
/// manifest's. Collective over `comm`; needs memory for the whole model and its optimizer state
/// at world size 1. Returns one message per problem (empty when none).
std::vector<std::string> verify_loaded_state(const CheckpointManifest& m, Communicator& comm);

/// Saves a checkpoint of step `step` (collective) and logs its directory, size and time. The waits
/// behind file writes are bounded by lead_io_timeout_seconds(checkpoint_bytes_bound), named in the
/// timeout report; the exchanges by sharding.collective_timeout_s.
void save_run_checkpoint(const TrainConfig& cfg, const std::string& ckpt_root, ShardedEngine& engine,
                         const CheckpointMeta& meta, RunLog& log);

/// Takes the lock of the run's checkpoint directory (checkpoint.dir, or <logging.run_dir>/checkpoints)
/// for this process until it exits: one job per checkpoint directory (lock_checkpoint_root). Rank 0
/// calls it before any other check touches the directory. Returns "" when held (or when the run has
/// no checkpoint directory), else "<config>: checkpoint.dir: ..." naming the holder's run directory.
std::string lock_checkpoint_dir(const TrainConfig& cfg);

/// Removes leftovers of interrupted writes, saying so: the SwapFile temporaries of config.json and
/// summary.json in the run directory and of latest under the checkpoint root (names
/// ".<file>.tmp-<pid>-<hex>", is_temp_name_of), and step_N.tmp directories holding only what a save
/// writes (foreign_partial_checkpoint; any other is kept, with a warning). A user's own
/// "<file>.tmp" and complete files are never touched. Rank 0 only.
void remove_stale_temporaries(const std::string& run_dir, const std::string& ckpt_root);

}  // namespace mfsdp
