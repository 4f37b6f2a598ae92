// The rule every output of mfsdp-train follows before the run starts: a file already at an
// output's path is replaced only when mfsdp-train wrote it (recognised by its content), so a run
// never overwrites another program's file, a user's file or another kind of output of ours (a
// run's metrics.jsonl named as logging.trace, a run directory named as output.export).
#pragma once
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace mfsdp {

/// One file a run would write, and how to recognise what mfsdp-train writes there.
struct OwnedOutput {
  std::filesystem::path path;
  /// What mfsdp-train writes there, for the message ("a trace", "an export's config.json").
  std::string what;
  /// True when the existing regular file at `path` holds what mfsdp-train writes there. It may
  /// throw (an unreadable file): the message is reported.
  std::function<bool(const std::filesystem::path&)> ours;
};

/// Why the run must not write `files`: "" when each is absent or recognised by its `ours`.
/// Otherwise, for the first that is not: "<path> is the input config; the run would overwrite it
/// (use another <key>)" when it is `input_config`; "<path> is a symbolic link (to <target>); the run
/// would write through it (move it or use another <key>)"; "<why it cannot be read: a FIFO, a device, a
/// directory>; the run would write it (move it or use another <key>)" (never opened, so a FIFO
/// never blocks); or "<path> was not written by mfsdp-train as <what>; refusing to overwrite it
/// (move it or use another <key>)". `key` is the config key that names the output.
std::string foreign_outputs(const std::vector<OwnedOutput>& files, const std::string& key,
                            const std::string& input_config = "");

/// Why output.export (`export_path`, see hf_export_paths) must not be written: foreign_outputs over
/// its weights file and config.json (each replaced only when it is an earlier export of this
/// project, is_export_weights / is_export_config); a single file that is the weights of an earlier
/// directory export (its config.json beside it, is_export_config) is refused; then, for a directory, the weights it would
/// leave beside the new model.safetensors (hf_other_weight_files: the shards and index of a
/// sharded checkpoint, PyTorch .bin files): "<dir> holds other weights (<names>); ...". The
/// messages name `key`. "" when the export may be written.
std::string foreign_export_files(const std::string& export_path, const std::string& key);

}  // namespace mfsdp
