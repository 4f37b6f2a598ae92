#include "apps/train/output_files.h"

#include "models/hf_checkpoint.h"
#include "runtime/core/file_checks.h"

namespace mfsdp {

namespace fs = std::filesystem;

std::string foreign_outputs(const std::vector<OwnedOutput>& files, const std::string& key,
                            const std::string& input_config) {
  const std::string fix = " (move it or use another " + key + ")";
  for (const OwnedOutput& f : files) {
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(f.path, ec);
    if (!fs::exists(st)) continue;
    if (fs::is_symlink(st))  // written through, it would change the file it points to
      return f.path.string() + " is a symbolic link (to " + fs::read_symlink(f.path, ec).string() +
             "); the run would write through it" + fix;
    if (!input_config.empty() && fs::equivalent(f.path, input_config, ec))
      return f.path.string() + " is the input config; the run would overwrite it (use another " + key + ")";
    if (const std::string special = special_input_file(f.path.string()); !special.empty())
      return special + "; the run would write it" + fix;  // stat only: a FIFO is never opened
    bool ours = false;
    try {
      ours = f.ours(f.path);
    } catch (const std::exception& e) {
      return std::string(e.what()) + "; the run would write it" + fix;
    }
    if (!ours)
      return f.path.string() + " was not written by mfsdp-train as " + f.what + "; refusing to overwrite it" + fix;
  }
  return "";
}

std::string foreign_export_files(const std::string& export_path, const std::string& key) {
  const HfExportPaths out = hf_export_paths(export_path);
  std::vector<OwnedOutput> files = {
      {out.weights, "an export's weights", [](const fs::path& p) { return is_export_weights(p.string()); }}};
  if (!out.config.empty())
    files.push_back({out.config, "an export's config.json",
                     [w = out.weights](const fs::path& p) { return is_export_config(p.string(), w); }});
  if (std::string e = foreign_outputs(files, key); !e.empty()) return e;
  if (out.config.empty()) {  // a single file: never the weights of an earlier directory export
    const fs::path dir = fs::path(out.weights).parent_path(), config = dir / "config.json";
    std::error_code ec;
    // (a run directory's own config.json, beside an export named model.safetensors, is no export's)
    if (fs::is_regular_file(config, ec) && is_export_config(config.string(), out.weights))
      return out.weights + " is the weights file of the Hugging Face export directory " + dir.string() +
             " (its config.json describes them); a single-file export would leave that config.json beside other " +
             "weights (set " + key + " to the directory itself to replace the whole export, or choose another file name)";
    return "";
  }
  std::string names;
  for (const std::string& n : hf_other_weight_files(export_path)) names += (names.empty() ? "" : ", ") + n;
  if (names.empty()) return "";
  return export_path + " holds other weights (" + names + "); the export would leave them beside its " +
         "model.safetensors, where a loader may take them for the model (remove them or use another " + key + ")";
}

}  // namespace mfsdp
