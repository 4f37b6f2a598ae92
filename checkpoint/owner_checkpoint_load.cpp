// Loading owner-shard checkpoints (checkpoint/owner_checkpoint.h): each piece's file, key, dtype,
// length and checksum checked when first read; the model's tensors matched against the manifest;
// every rank reads the logical ranges it owns under its plan from whichever pieces hold them.
#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "checkpoint/owner_checkpoint.h"
#include "checkpoint/safetensors.h"
#include "runtime/core/json_limits.h"

namespace mfsdp {
namespace fs = std::filesystem;

namespace {

// Opens the files of one checkpoint on demand and hands out each piece's f32 data after checking
// its key, dtype, length and (once) its checksum. Throws CheckpointError naming the file.
class PieceReader {
 public:
  explicit PieceReader(const CheckpointManifest& m) : m_(m) {}
  const float* data(const CheckpointPiece& p, const std::string& tensor) {
    auto it = files_.find(p.file);
    const std::string path = (fs::path(m_.dir) / p.file).string();
    if (it == files_.end()) {
      std::error_code ec;
      if (!fs::is_regular_file(path, ec))  // a FIFO or device would block or never end
        throw CheckpointError(path + ": not a regular file (checkpoint " + m_.dir + ")");
      try {
        it = files_.emplace(p.file, std::make_unique<SafetensorsFile>(path)).first;
      } catch (const std::exception& e) {
        throw CheckpointError(std::string(e.what()) + " (checkpoint " + m_.dir + ")");
      }
    }
    const SafetensorsFile& file = *it->second;
    if (!file.contains(p.key)) throw CheckpointError(path + ": missing tensor '" + clip_for_message(p.key) + "' of '" + tensor + "'");
    const TensorInfo& info = file.info(p.key);
    if (info.dtype != "F32" || info.numel() != p.numel)
      throw CheckpointError(path + ": tensor '" + clip_for_message(p.key) + "' is " + info.dtype + " with " + std::to_string(info.numel()) +
                            " elements, the manifest says F32 with " + std::to_string(p.numel));
    const auto raw = file.raw(p.key);
    if (!verified_.count(&p)) {
      if (XXH3_64bits(raw.data(), raw.size()) != p.xxh64)
        throw CheckpointError(path + ": tensor '" + clip_for_message(p.key) + "' fails its checksum (corrupted file)");
      verified_.insert(&p);
    }
    return reinterpret_cast<const float*>(raw.data());
  }

 private:
  const CheckpointManifest& m_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  std::set<const CheckpointPiece*> verified_;
};

}  // namespace

std::vector<float> read_full_tensor(const CheckpointManifest& m, const std::string& name, StateKind kind) {
  const CheckpointManifest::Tensor* t = m.find(name);
  if (!t) throw CheckpointError((fs::path(m.dir) / "manifest.json").string() + ": no tensor '" + clip_for_message(name) + "'");
  int64_t numel = 1;
  for (int64_t d : t->shape) numel *= d;
  if (kind == StateKind::v && t->optimizer == "muon") numel = t->pieces[2].empty() ? 0 : t->shape[0];  // NorMuon rows
  std::vector<float> out(static_cast<size_t>(numel));
  PieceReader reader(m);
  for (const CheckpointPiece& p : t->pieces[static_cast<int>(kind)]) {
    const float* src = reader.data(p, name);
    std::copy(src, src + p.numel, out.begin() + p.offset);
  }
  return out;
}

std::vector<std::string> verify_checkpoint(const CheckpointManifest& m) {
  std::vector<std::string> problems;
  PieceReader reader(m);
  for (const auto& t : m.tensors)
    for (const auto& kind : t.pieces)
      for (const CheckpointPiece& p : kind) {
        try {
          reader.data(p, t.name);
        } catch (const std::exception& e) {
          problems.push_back(e.what());
        }
      }
  return problems;
}

void load_checkpoint(ShardedEngine& engine, const CheckpointManifest& m) {
  const std::string where = (fs::path(m.dir) / "manifest.json").string();
  const ShardPlan& plan = engine.plan();
  auto shape_str = [](const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  };
  std::set<std::string> model_names;
  for (const MatrixShard& s : plan.shards) {
    model_names.insert(s.name);
    const CheckpointManifest::Tensor* t = m.find(s.name);
    if (!t) throw CheckpointError(where + ": has no tensor '" + s.name + "' (saved from another model?)");
    if (t->shape != s.shape)
      throw CheckpointError(where + ": tensor '" + s.name + "' has shape " + shape_str(t->shape) + ", the model " +
                            shape_str(s.shape));
    const std::string opt = s.optimizer == OptimizerKind::muon ? "muon" : "adamw";
    if (t->optimizer != opt)
      throw CheckpointError(where + ": tensor '" + s.name + "' was trained with " + t->optimizer + ", the run routes it to " + opt);
    if (opt == "muon" && engine.options().muon.variant == MuonVariant::normuon && t->pieces[2].empty())
      throw CheckpointError(where + ": tensor '" + s.name + "' has no NorMuon per-row state (saved with "
                            "optimizer.muon.variant=muon); the run uses variant normuon");
  }
  for (const auto& t : m.tensors)
    if (!model_names.count(t.name))
      throw CheckpointError(where + ": tensor '" + clip_for_message(t.name) + "' is not in the model (saved from another model?)");

  PieceReader reader(m);
  engine.load_state(
      [&](const MatrixShard& s, StateKind kind, int64_t offset, int64_t numel, float* dst) {
        const auto& pieces = m.find(s.name)->pieces[static_cast<int>(kind)];
        // the first piece that ends after `offset`, then every piece overlapping the range
        auto it = std::upper_bound(pieces.begin(), pieces.end(), offset,
                                   [](int64_t o, const CheckpointPiece& p) { return o < p.offset + p.numel; });
        for (; it != pieces.end() && it->offset < offset + numel; ++it) {
          const float* src = reader.data(*it, s.name);
          const int64_t lo = std::max(offset, it->offset), hi = std::min(offset + numel, it->offset + it->numel);
          std::copy(src + (lo - it->offset), src + (hi - it->offset), dst + (lo - offset));
        }
      },
      m.optimizer_steps);
}

}  // namespace mfsdp
