// Start-up agreement: before the first training collective, every rank compares what it is about
// to act on — its effective config, its build, and the content of every input file — with every
// other rank. A node with a stale config, data file or binary is then refused with the differing
// keys named, instead of hanging inside MPI or silently training a wrong model.
#pragma once
#include <map>
#include <string>

#include "apps/train/train_config.h"
#include "comm/communicator.h"

namespace mfsdp {

/// The content fingerprint of the file `path`, as run_facts records it: "<size> bytes, whole-file
/// xxh3 <16 hex>" (files up to 64 MiB) or "<size> bytes, sampled xxh3 <16 hex>" (first and last
/// 64 KiB and 16 evenly spaced 4 KiB blocks); "refused" when it is missing or not a regular file.
/// Checkpoint manifests record it for each data file (apps/train/checkpointing.h data_fingerprints).
std::string file_fingerprint(const std::string& path);

/// The facts this rank will act on, flattened to "key -> value" strings:
///   config.<path>     every effective config value (resolved paths);
///   build.<name>      compiler, compile options and backends of this binary;
///   file:<path>       size and an XXH3-64 of the whole file up to 64 MiB, else of its first and
///                     last 64 KiB and 16 evenly spaced 4 KiB blocks (content, not mtime, so copies
///                     on other nodes agree), for the
///                     train and val shards, the tokenizer files, model.init_from and the manifest of
///                     training.resume.
/// Every file is opened by open_input_file (O_NONBLOCK, fstat of the descriptor): one that is
/// missing or not a regular file (a FIFO swapped in after the preflight check) is recorded as
/// "refused", and the first such message ("input file: <path> is a FIFO ...") lands in `problem`.
std::map<std::string, std::string> run_facts(const TrainConfig& cfg, std::string& problem);

/// Collective over `comm` (host data; the host communicator of comm/comm_factory.h): one
/// all-gather of a 64-bit digest of the facts, and only on a mismatch a second exchange of the
/// facts themselves. Returns "" when every rank agrees, else a message naming each differing key
/// with the value each group of ranks holds (at most 12 keys, values clipped), the same text on
/// every rank. Each exchange is bounded by the communicator's timeout (a rank stuck or gone
/// before training ends the job with the communicator's report).
std::string check_agreement(const std::map<std::string, std::string>& facts, Communicator& comm);

}  // namespace mfsdp
