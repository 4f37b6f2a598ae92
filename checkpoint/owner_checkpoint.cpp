#include "checkpoint/owner_checkpoint.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string_view>

#include "checkpoint/safetensors.h"
#include "runtime/core/file_checks.h"
#include "runtime/core/json_fields.h"
#include "runtime/core/json_limits.h"

namespace mfsdp {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "matrixfsdp-checkpoint";
constexpr const char* kManifest = "manifest.json";
constexpr size_t kMaxManifestBytes = size_t(1) << 30;

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t checksum(const void* data, int64_t bytes) { return XXH3_64bits(data, static_cast<size_t>(bytes)); }

// Every rank learns whether any rank failed; all throw together (the failing rank its message),
// after rank 0 removed the partial directory `cleanup` (if any). The wait is one behind file I/O:
// under `waits`' io bound when given, with its collective bound back after.
void agree(Communicator& comm, const SaveWaitBounds* waits, const std::string& error, const std::string& what,
           const fs::path& cleanup = {}) {
  if (waits) comm.set_timeout(waits->io_seconds, waits->io_name);
  const double bad = comm.all_reduce_scalar(error.empty() ? 0.0 : 1.0, ReduceOp::max, CommPhase::other);
  if (waits) comm.set_timeout(waits->collective_seconds, waits->collective_name);
  if (bad == 0.0) return;
  if (comm.rank() == 0 && !cleanup.empty()) {
    std::error_code ec;
    fs::remove_all(cleanup, ec);
  }
  throw CheckpointError(error.empty() ? what + ": another rank failed (see its message)" : error);
}

// Manifest fields: messages name the file and the field (runtime/core/json_fields.h).
using Fields = JsonFields<CheckpointError>;

}  // namespace

// ---------------------------------------------------------------------------------------- save

namespace {
SaveObserver g_default_observer;
SaveObserver* g_observer = nullptr;
}  // namespace

SaveObserver& save_observer() { return g_observer ? *g_observer : g_default_observer; }

SaveObserver* set_save_observer(SaveObserver* observer) {
  SaveObserver* previous = g_observer;
  g_observer = observer;
  return previous;
}

namespace {

std::string rank_file_name(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "rank_%05d.safetensors", rank);
  return buf;
}

// Step 1, rank 0: an empty temporary directory (a leftover of a crashed save is removed, any
// other file or directory of that name refused). Returns
// the error ("" when ready).
std::string prepare_save_dir(const fs::path& root_dir, const fs::path& final_dir, const fs::path& tmp_dir) {
  std::error_code ec;
  fs::create_directories(root_dir, ec);
  if (ec) return root_dir.string() + ": cannot create the checkpoint directory: " + ec.message();
  if (fs::exists(final_dir)) return final_dir.string() + ": a checkpoint of this step already exists";
  if (const std::string e = foreign_partial_checkpoint(tmp_dir.string()); !e.empty())
    return e + "; not a partial checkpoint, so it is kept (move it away to save this step)";
  fs::remove_all(tmp_dir, ec);
  if (!fs::create_directory(tmp_dir, ec) || ec) return tmp_dir.string() + ": cannot create: " + (ec ? ec.message() : "exists");
  return "";
}

// Step 2, every rank: writes the pieces it owns to tmp_dir/`file`; returns their records (name,
// kind, file, key, offset, numel, xxh64). Throws on a failed write.
json write_rank_file(ShardedEngine& engine, const fs::path& tmp_dir, const std::string& file, int64_t step, int rank) {
  json records = json::array();
  std::vector<TensorView> views;
  engine.for_each_saved_piece([&](const MatrixShard& s, StateKind kind, int64_t offset, int64_t numel, const float* data) {
    const std::string key = std::string(state_kind_name(kind)) + "/" + s.name + "/" + std::to_string(offset);
    views.push_back(TensorView{key, "F32", {numel}, data});
    records.push_back({{"name", s.name}, {"kind", state_kind_name(kind)}, {"file", file}, {"key", key},
                       {"offset", offset}, {"numel", numel},
                       {"xxh64", hex64(checksum(data, numel * static_cast<int64_t>(sizeof(float))))}});
  });
  write_safetensors((tmp_dir / file).string(), views, {{"rank", std::to_string(rank)}, {"step", std::to_string(step)}});
  return records;
}

// Step 3, collective: every rank's records (sizes first, then the padded texts), parsed on rank 0
// into name -> {"param": [...], "m": [...], "v": [...]} (empty on the other ranks).
std::map<std::string, json> gather_records(Communicator& comm, const json& records) {
  const int world = comm.world_size();
  const std::string mine = records.dump();
  const int64_t my_len = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lens(static_cast<size_t>(world));
  comm.all_gather_host(&my_len, lens.data(), sizeof(int64_t), CommPhase::other);
  const int64_t longest = *std::max_element(lens.begin(), lens.end());
  std::vector<char> padded(static_cast<size_t>(longest), ' '), all(static_cast<size_t>(longest * world));
  std::copy(mine.begin(), mine.end(), padded.begin());
  comm.all_gather_host(padded.data(), all.data(), longest, CommPhase::other);
  std::map<std::string, json> pieces;
  if (comm.rank() != 0) return pieces;
  for (int r = 0; r < world; ++r) {
    const json rec = json::parse(std::string(all.data() + r * longest, static_cast<size_t>(lens[r])));
    for (const json& p : rec)
      pieces[p["name"].get<std::string>()][p["kind"].get<std::string>()].push_back(
          {{"file", p["file"]}, {"key", p["key"]}, {"offset", p["offset"]}, {"numel", p["numel"]}, {"xxh64", p["xxh64"]}});
  }
  return pieces;
}

// The manifest's fields (without its checksum; seal_manifest adds it).
json manifest_json(ShardedEngine& engine, const CheckpointMeta& meta, std::map<std::string, json>& pieces) {
  const ShardPlan& plan = engine.plan();
  json tensors = json::array();
  for (const MatrixShard& s : plan.shards) {
    json t = {{"name", s.name}, {"shape", s.shape}, {"dtype", "F32"},
              {"optimizer", s.optimizer == OptimizerKind::muon ? "muon" : "adamw"}, {"pieces", pieces[s.name]}};
    for (auto& [kind, list] : t["pieces"].items())
      std::sort(list.begin(), list.end(), [](const json& a, const json& b) { return a["offset"] < b["offset"]; });
    tensors.push_back(std::move(t));
  }
  json loader;
  to_json(loader, meta.loader);
  return {{"format", kFormat},
          {"format_version", CheckpointManifest::kFormatVersion},
          {"step", meta.step},
          {"tokens", meta.tokens},
          {"optimizer_steps", engine.optimizer_steps()},
          {"world_size", engine.comm().world_size()},
          {"placement", placement_name(plan.placement)},
          {"loader", loader},
          {"state_fingerprint", meta.state_fingerprint},
          {"config", meta.config},
          {"plan", plan.to_json()},
          {"data", meta.data},
          {"tensors", tensors}};
}

// Step 4, rank 0: the manifest last, fsync, the rename into place, the latest pointer, and only
// then the oldest complete checkpoints beyond keep_last go. Throws on failure.
void publish(const json& manifest, const fs::path& root_dir, const fs::path& tmp_dir, const fs::path& final_dir, int keep_last) {
  write_file_swap((tmp_dir / kManifest).string(), seal_manifest(manifest.dump(1) + "\n"));
  if (!sync_path(tmp_dir)) throw CheckpointError(tmp_dir.string() + ": fsync failed");
  std::error_code ec;
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) throw CheckpointError(final_dir.string() + ": rename failed: " + ec.message());
  sync_path(root_dir);
  write_file_swap((root_dir / "latest").string(), final_dir.filename().string() + "\n");
  sync_path(root_dir);
  std::vector<std::string> complete = list_checkpoints(root_dir.string());
  for (size_t i = 0; keep_last > 0 && i + static_cast<size_t>(keep_last) < complete.size(); ++i)
    if (fs::path(complete[i]) != final_dir) fs::remove_all(complete[i], ec);
}

}  // namespace

std::string save_checkpoint(ShardedEngine& engine, const std::string& root, const CheckpointMeta& meta, int keep_last,
                            const SaveWaitBounds* waits) {
  Communicator& comm = engine.comm();
  const int rank = comm.rank(), world = comm.world_size();
  const fs::path root_dir(root), final_dir = root_dir / step_dir_name(meta.step);
  const fs::path tmp_dir = final_dir.string() + ".tmp";
  const std::string what = "checkpoint " + final_dir.string();
  std::string error;
  if (rank == 0) error = prepare_save_dir(root_dir, final_dir, tmp_dir);
  agree(comm, waits, error, what);

  const std::string file = rank_file_name(rank);
  json records;
  try {
    records = write_rank_file(engine, tmp_dir, file, meta.step, rank);
  } catch (const std::exception& e) {
    error = e.what();
  }
  save_observer().after_rank_file(meta.step, rank, world, (tmp_dir / file).string());
  agree(comm, waits, error, what, tmp_dir);

  std::map<std::string, json> pieces = gather_records(comm, records);
  if (rank == 0) {
    try {
      publish(manifest_json(engine, meta, pieces), root_dir, tmp_dir, final_dir, keep_last);
    } catch (const std::exception& e) {
      error = e.what();
      std::error_code ec;
      fs::remove_all(tmp_dir, ec);  // still there only when the rename did not happen
    }
    save_observer().after_publish(meta.step, final_dir.string());
  }
  agree(comm, waits, error, what);
  return final_dir.string();
}

std::string foreign_partial_checkpoint(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(dir, ec);
  if (!fs::exists(st)) return "";
  if (!fs::is_directory(st)) return dir + " is not a directory a checkpoint save made";
  const auto ours = [](const std::string& n) {  // manifest.json, rank_<digits>.safetensors
    const auto digit = [](char c) { return c >= '0' && c <= '9'; };
    return n == kManifest || (n.size() > 17 && n.rfind("rank_", 0) == 0 && n.compare(n.size() - 12, 12, ".safetensors") == 0 &&
                              std::all_of(n.begin() + 5, n.end() - 12, digit));
  };
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    const std::string base = n[0] == '.' && n.rfind(".tmp-") != std::string::npos ? n.substr(1, n.rfind(".tmp-") - 1) : "";
    if (!ours(n) && !(ours(base) && is_temp_name_of(n, base))) return dir + " holds " + n + ", which no checkpoint save writes";
  }
  return ec ? dir + ": cannot list: " + ec.message() : "";
}

// ---------------------------------------------------------------------------------------- read

std::vector<std::string> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() != 13 || name.rfind("step_", 0) != 0 || !entry.is_directory()) continue;
    if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    if (!fs::is_regular_file(entry.path() / kManifest, ec)) continue;
    found.push_back({std::stoll(name.substr(5)), entry.path().string()});
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

std::string resolve_resume(const std::string& resume, const std::string& root, std::string* note) {
  if (resume.empty()) return "";
  std::error_code ec;
  if (resume != "auto") {
    if (!fs::is_regular_file(fs::path(resume) / kManifest, ec))
      throw CheckpointError(resume + ": not a complete checkpoint (no " + kManifest + ")");
    return resume;
  }
  std::string msg;
  if (fs::is_directory(root, ec))
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("step_", 0) == 0 && (!fs::is_regular_file(entry.path() / kManifest, ec) || name.size() != 13))
        msg += "ignoring the incomplete checkpoint " + entry.path().string() + "; ";
    }
  // The newest complete checkpoint wins: `latest` can lag behind when a job died between the
  // rename of a new checkpoint and the update of the pointer.
  const std::vector<std::string> complete = list_checkpoints(root);
  const std::string chosen = complete.empty() ? "" : complete.back();
  std::string target;  // a pointer that is not a regular file is ignored (open_input_file: never blocks)
  try {
    target = read_input_file((fs::path(root) / "latest").string(), "", 4096, false);
  } catch (const std::exception&) {
  }
  target = target.substr(0, target.find('\n'));
  if (!target.empty() && !chosen.empty() && fs::path(chosen).filename().string() != target)
    msg += "the latest pointer names " + clip_for_message(target) + ", not the newest complete checkpoint; ";
  if (chosen.empty()) msg += "no complete checkpoint in " + root + ": starting fresh";
  else msg += "resuming from " + chosen;
  if (note) *note = msg;
  return chosen;
}

namespace {

constexpr std::string_view kSealPrefix = "{\n \"manifest_xxh3\": \"";
constexpr size_t kSealLine = kSealPrefix.size() + 16 + 3;  // kSealPrefix, 16 hex digits, "\",\n"

// The manifest text of `path` with its checksum verified, before any field is read. Throws
// CheckpointError naming the file.
std::string read_sealed_manifest(const std::string& path) {
  if (!fs::exists(path)) throw CheckpointError(path + ": cannot open (not a complete checkpoint?)");
  const std::string text = read_input_file<CheckpointError>(path, "", kMaxManifestBytes);  // over 1 GiB: refused
  const std::string hex = text.size() >= kSealLine ? text.substr(kSealPrefix.size(), 16) : "";
  if (hex.empty() || text.compare(0, kSealPrefix.size(), kSealPrefix) != 0 ||
      hex.find_first_not_of("0123456789abcdef") != std::string::npos ||
      text.compare(kSealPrefix.size() + 16, 3, "\",\n") != 0)
    throw CheckpointError(path + ": manifest_xxh3: missing; a manifest begins with its checksum line (format version " +
                          std::to_string(CheckpointManifest::kFormatVersion) +
                          "); one written by an older build, or rewritten by hand, is refused");
  if (hex64(checksum(text.data() + kSealLine, static_cast<int64_t>(text.size() - kSealLine))) != hex)
    throw CheckpointError(path + ": manifest_xxh3: the checksum " + hex +
                          " does not match the manifest's content (edited or damaged manifest)");
  if (json_nesting_depth(text) > kMaxJsonDepth) throw CheckpointError(path + ": nested deeper than 64 levels, refused");
  return text;
}

// The step of a directory named step_<digits> (-1 for any other name).
int64_t step_of_dir_name(const std::string& dir) {
  const fs::path norm = fs::path(dir).lexically_normal();
  const std::string name = norm.filename().empty() ? norm.parent_path().filename().string() : norm.filename().string();
  if (name.size() < 6 || name.size() > 23 || name.rfind("step_", 0) != 0) return -1;
  if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  return std::stoll(name.substr(5));
}

// The run-state fields: format, version, counters, placement, the step against the directory
// name, fingerprint, loader, config and plan.
void parse_run_state(const Fields& f, const json& j, CheckpointManifest& m) {
  if (f.at(j, "format").string() != kFormat) f.fail("format", "expected \"" + std::string(kFormat) + "\"");
  const int64_t version = f.at(j, "format_version").integer(0);
  if (version != CheckpointManifest::kFormatVersion)
    f.fail("format_version", std::to_string(version) + " is not supported (this build reads version " +
                                 std::to_string(CheckpointManifest::kFormatVersion) + ")");
  m.step = f.at(j, "step").integer(0);
  const int64_t named = step_of_dir_name(m.dir);
  if (named >= 0 && named != m.step)
    f.fail("step", std::to_string(m.step) + " does not match the directory " + fs::path(m.dir).lexically_normal().string() +
                       " (step " + std::to_string(named) + ")");
  m.tokens = f.at(j, "tokens").integer(0);
  m.optimizer_steps = f.at(j, "optimizer_steps").integer(0);
  if (m.optimizer_steps != m.step)  // optimizer_steps is part of the state fingerprint
    f.fail("step", std::to_string(m.step) + " differs from optimizer_steps " + std::to_string(m.optimizer_steps) +
                       " (each training step is one optimizer step)");
  const int64_t world_size = f.at(j, "world_size").integer(1);  // range-checked before narrowing
  if (world_size > (1 << 24)) f.fail("world_size", std::to_string(world_size) + " is larger than 2^24");
  m.world_size = static_cast<int>(world_size);
  m.placement = f.at(j, "placement").string();
  try {
    (void)parse_placement(m.placement);
  } catch (const std::exception&) {
    f.fail("placement", "unknown placement \"" + clip_for_message(m.placement) + "\"");
  }
  m.state_fingerprint = f.at(j, "state_fingerprint").string();
  try {
    from_json(f.at(j, "loader").value(), m.loader);
  } catch (const std::exception& e) {
    f.fail("loader", e.what());
  }
  if (m.loader.global_batch_tokens < 1) f.fail("loader.global_batch_tokens", "expected an integer >= 1");
  m.config = f.at(j, "config").value();
  if (!m.config.is_object()) f.fail("config", "expected an object");
  m.plan = f.at(j, "plan").value();
  if (m.data = j.value("data", json()); !m.data.is_null() && !m.data.is_object()) f.fail("data", "expected an object");
}

// One piece list (`f` reads at its level): pieces that tile [0, want) of `tensor` in order.
std::vector<CheckpointPiece> parse_pieces(const Fields& f, const json& list, const std::string& tensor, int64_t want) {
  if (!list.is_array()) f.fail("", "expected an array");
  std::vector<CheckpointPiece> out;
  int64_t expect = 0;
  for (size_t pi = 0; pi < list.size(); ++pi) {
    const Fields q = f.in("[" + std::to_string(pi) + "]");
    CheckpointPiece p;
    p.file = q.at(list[pi], "file").string();
    if (p.file.empty() || p.file.find('/') != std::string::npos || p.file == "." || p.file == "..")
      q.fail("file", "\"" + clip_for_message(p.file) + "\" is not a file name inside the checkpoint");
    p.key = q.at(list[pi], "key").string();
    p.offset = q.at(list[pi], "offset").integer(0);
    p.numel = q.at(list[pi], "numel").integer(1);
    const std::string h = q.at(list[pi], "xxh64").string();
    if (h.size() != 16 || h.find_first_not_of("0123456789abcdef") != std::string::npos)
      q.fail("xxh64", "expected 16 lowercase hex digits");
    p.xxh64 = std::stoull(h, nullptr, 16);
    if (p.offset != expect)
      q.fail("offset", std::to_string(p.offset) + ": the pieces of '" + clip_for_message(tensor) +
                           "' must tile it (expected " + std::to_string(expect) + ")");
    if (p.numel > want - expect) q.fail("numel", "runs past the end of '" + clip_for_message(tensor) + "'");
    expect += p.numel;
    out.push_back(std::move(p));
  }
  if (expect != want)
    f.fail("", "the pieces cover " + std::to_string(expect) + " of " + std::to_string(want) + " elements of '" +
                   clip_for_message(tensor) + "'");
  return out;
}

// One entry of "tensors" (`f` reads at its level): name, shape, dtype, optimizer and its pieces.
CheckpointManifest::Tensor parse_tensor(const Fields& f, const json& t) {
  CheckpointManifest::Tensor out;
  out.name = f.at(t, "name").string();
  const json& shape = f.at(t, "shape").value();
  if (!shape.is_array() || shape.size() > 8) f.fail("shape", "expected an array of at most 8 sizes");
  int64_t numel = 1;
  for (const json& d : shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t(1) << 40))
      f.fail("shape", "bad size " + clip_for_message(d.dump()));
    out.shape.push_back(d.get<int64_t>());
    if (numel > (int64_t(1) << 40) / std::max<int64_t>(1, d.get<int64_t>())) f.fail("shape", "too large");
    numel *= d.get<int64_t>();
  }
  if (f.at(t, "dtype").string() != "F32") f.fail("dtype", "expected \"F32\"");
  out.optimizer = f.at(t, "optimizer").string();
  if (out.optimizer != "muon" && out.optimizer != "adamw") f.fail("optimizer", "expected muon or adamw");
  const json& pieces = f.at(t, "pieces").value();
  const Fields pf = f.in("pieces");
  for (int k = 0; k < 3; ++k) {
    const std::string kind = state_kind_name(static_cast<StateKind>(k));
    // a Muon tensor has a v only under variant normuon: one value per row (per output neuron)
    const bool row_state = k == 2 && out.optimizer == "muon";
    if (row_state && !(pieces.is_object() && pieces.contains(kind))) continue;
    if (row_state && out.shape.size() != 2) pf.fail(kind, "a Muon tensor's per-row state needs a 2-D shape");
    out.pieces[k] = parse_pieces(pf.in(kind), pf.at(pieces, kind).value(), out.name, row_state ? out.shape[0] : numel);
  }
  return out;
}

}  // namespace

std::string seal_manifest(const std::string& body) {
  if (body.compare(0, 2, "{\n") != 0 || body.size() < 4)
    throw std::invalid_argument("seal_manifest: expected a JSON object written with a line break after '{'");
  const std::string tail = body.substr(2);
  return std::string(kSealPrefix) + hex64(checksum(tail.data(), static_cast<int64_t>(tail.size()))) + "\",\n" + tail;
}

CheckpointManifest CheckpointManifest::read(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifest).string();
  const Fields f{path};
  const std::string text = read_sealed_manifest(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw CheckpointError(path + ": not valid JSON (" + clip_for_message(e.what(), 200) + ")");
  }
  CheckpointManifest m;
  m.dir = dir;
  parse_run_state(f, j, m);
  const json& tensors = f.at(j, "tensors").value();
  if (!tensors.is_array()) f.fail("tensors", "expected an array");
  std::set<std::string> names;
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    m.tensors.push_back(parse_tensor(f.in("tensors[" + std::to_string(ti) + "]"), tensors[ti]));
    if (!names.insert(m.tensors.back().name).second)
      f.fail("tensors[" + std::to_string(ti) + "].name", "duplicate tensor '" + clip_for_message(m.tensors.back().name) + "'");
  }
  return m;
}

const CheckpointManifest::Tensor* CheckpointManifest::find(const std::string& name) const {
  for (const Tensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace mfsdp
