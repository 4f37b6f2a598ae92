#include "apps/train/agreement.h"

#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/core/file_checks.h"
#include "runtime/core/json_limits.h"
#include "runtime/cuda/device_api.h"
#include "runtime/data/token_shards.h"

namespace mfsdp {
namespace {

using nlohmann::json;

void flatten(const json& j, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) flatten(it.value(), prefix + "." + it.key(), out);
  } else {
    out[prefix] = j.dump();
  }
}

// Size plus a hash of sampled blocks: cheap for multi-GB shards, and content-based. The file is
// opened by open_input_file (never blocks; anything but a regular file is refused): a refusal is
// recorded as "refused" and its message kept in `problem` (the first one).
std::string file_fact(const std::string& path, std::string& problem) {
  int fd = -1;
  try {
    fd = open_input_file(path, "input file");
  } catch (const std::exception& e) {
    if (problem.empty()) problem = e.what();
    return "refused";
  }
  struct stat sb{};
  ::fstat(fd, &sb);
  const auto size = static_cast<uint64_t>(sb.st_size);
  // Files up to 64 MiB are hashed whole (XXH3 reads them in a few ms); larger ones by their
  // first and last 64 KiB and 16 evenly spaced 4 KiB blocks.
  constexpr uint64_t kWhole = 64 << 20, kEdge = 64 << 10, kBlock = 4 << 10;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  if (size <= kWhole) {
    ranges.push_back({0, size});
  } else {
    ranges.push_back({0, kEdge});
    ranges.push_back({size - kEdge, kEdge});
    for (int i = 1; i <= 16; ++i) ranges.push_back({size / 17 * i, kBlock});
  }
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf;
  for (const auto& [off, len] : ranges) {
    buf.resize(len);
    const ssize_t n = ::pread(fd, buf.data(), len, static_cast<off_t>(off));
    XXH3_64bits_update(st, buf.data(), n > 0 ? static_cast<size_t>(n) : 0);
  }
  ::close(fd);
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  char out[64];
  std::snprintf(out, sizeof(out), "%llu bytes, %s xxh3 %016llx", static_cast<unsigned long long>(size),
                size <= kWhole ? "whole-file" : "sampled", static_cast<unsigned long long>(h));
  return out;
}

void add_files(const std::string& glob, std::map<std::string, std::string>& out, std::string& problem) {
  if (glob.empty()) return;
  std::vector<std::string> files;
  try {
    files = expand_glob(glob);
  } catch (const std::exception&) {
    out["file:" + glob] = "no match";
  }
  for (const std::string& f : files) out["file:" + f] = file_fact(f, problem);
}

}  // namespace

std::string file_fingerprint(const std::string& path) {
  std::string problem;
  return file_fact(path, problem);
}

std::map<std::string, std::string> run_facts(const TrainConfig& cfg, std::string& problem) {
  std::map<std::string, std::string> facts;
  flatten(cfg.to_json(), "config", facts);
#if defined(__VERSION__)
  facts["build.compiler"] = __VERSION__;
#endif
#if defined(NDEBUG)
  facts["build.assertions"] = "off";
#else
  facts["build.assertions"] = "on";
#endif
  facts["build.cuda"] = cuda::built() ? "on" : "off";
  facts["build.pointer_bytes"] = std::to_string(sizeof(void*));
  add_files(cfg.data.train.resolved, facts, problem);
  add_files(cfg.data.val.resolved, facts, problem);
  const std::string& tok = cfg.data.tokenizer_path.resolved;
  if (!tok.empty()) {
    if (std::filesystem::is_directory(tok)) {
      for (const char* name : {"encoder.json", "vocab.bpe"}) add_files((std::filesystem::path(tok) / name).string(), facts, problem);
    } else {
      add_files(tok, facts, problem);
    }
  }
  const std::string& init = cfg.model.init_from.resolved;
  if (!init.empty() && std::filesystem::is_directory(init)) {  // a Hugging Face checkpoint directory
    for (const char* name : {"config.json", "*.safetensors", "model.safetensors.index.json"})
      add_files((std::filesystem::path(init) / name).string(), facts, problem);
  } else if (!init.empty()) {
    add_files(init, facts, problem);
  }
  if (!cfg.training.resume.empty() && cfg.training.resume != "auto")
    add_files((std::filesystem::path(cfg.training.resume) / "manifest.json").string(), facts, problem);
  return facts;
}

std::string check_agreement(const std::map<std::string, std::string>& facts, Communicator& comm) {
  const int world = comm.world_size();
  // A file name that is not UTF-8 (one a glob matched) must not stop the comparison: such bytes
  // are replaced, and the names that matter are refused by preflight_check.
  const std::string text = json(facts).dump(-1, ' ', false, json::error_handler_t::replace);
  const uint64_t mine = XXH3_64bits(text.data(), text.size());
  std::vector<uint64_t> digests(static_cast<size_t>(world));
  comm.all_gather_host(&mine, digests.data(), sizeof(mine), CommPhase::other);
  if (std::all_of(digests.begin(), digests.end(), [&](uint64_t d) { return d == digests[0]; })) return "";

  // Someone differs: exchange the facts themselves and name what differs, on every rank.
  // (Lengths are far below 2^53, exact in the f64 maximum.)
  const auto longest = static_cast<int64_t>(
      comm.all_reduce_scalar(static_cast<double>(text.size()), ReduceOp::max, CommPhase::other));
  std::vector<char> padded(static_cast<size_t>(longest), ' '), all(static_cast<size_t>(longest) * world);
  std::copy(text.begin(), text.end(), padded.begin());
  comm.all_gather_host(padded.data(), all.data(), longest, CommPhase::other);
  std::vector<std::map<std::string, std::string>> per_rank(static_cast<size_t>(world));
  std::map<std::string, bool> keys;
  for (int r = 0; r < world; ++r) {
    per_rank[r] = json::parse(std::string(all.data() + static_cast<size_t>(r) * longest, static_cast<size_t>(longest)))
                      .get<std::map<std::string, std::string>>();
    for (const auto& kv : per_rank[r]) keys[kv.first] = true;
  }
  std::string msg = "the ranks do not agree on what to run (nothing was started):";
  int shown = 0, differing = 0;
  for (const auto& [key, unused] : keys) {
    std::map<std::string, std::vector<int>> groups;  // value -> ranks holding it
    for (int r = 0; r < world; ++r) {
      auto it = per_rank[r].find(key);
      groups[it == per_rank[r].end() ? "(absent)" : it->second].push_back(r);
    }
    if (groups.size() < 2) continue;
    ++differing;
    if (++shown > 12) continue;
    msg += "\n  " + clip_for_message(key, 160) + ":";
    for (const auto& [value, ranks] : groups) {
      std::string list;
      for (size_t i = 0; i < ranks.size() && i < 8; ++i) list += (i ? "," : "") + std::to_string(ranks[i]);
      if (ranks.size() > 8) list += ",...";
      msg += " rank" + std::string(ranks.size() > 1 ? "s " : " ") + list + " " + clip_for_message(value) + ";";
    }
  }
  if (differing > 12) msg += "\n  ... and " + std::to_string(differing - 12) + " more";
  return msg;
}

}  // namespace mfsdp
