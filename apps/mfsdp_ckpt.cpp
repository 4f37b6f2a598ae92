// mfsdp-ckpt: inspect owner-shard checkpoints on one process (no MPI launch needed).
//   mfsdp-ckpt list   <checkpoint root>          steps, world size, placement, size, complete or not
//   mfsdp-ckpt verify <checkpoint dir> [--config FILE [--set k=v ...]]
//                                              every check of resume: the manifest's
//                                              checksum and fields, the step against the directory name,
//                                              the loader position and global batch against the saved
//                                              config and data; the data files' content fingerprints
//                                              against the manifest's (those of --config's data.train and
//                                              data.val when given, else the saved config's);
//                                              every piece's file, key, length, checksum;
//                                              then the saved model loads it (one CPU process) with the
//                                              saved state fingerprint
//   mfsdp-ckpt export <checkpoint dir> <out>   consolidated Hugging Face GPT-2 / Llama export (<out>: a
//                                              .safetensors file, or a from_pretrained directory)
//   mfsdp-ckpt diff   <checkpoint dir A> <checkpoint dir B> which tensors differ, and by how much
// Exit codes: 0 fine (diff: identical), 1 problems found (verify) or differences (diff), 2 bad input.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <map>
#include <new>
#include <optional>
#include <set>
#include <string>

#include "apps/train/checkpointing.h"
#include "apps/train/output_files.h"
#include "apps/train/train_config.h"
#include "models/gpt_hf.h"
#include "models/llama_hf.h"
#include "models/moe_hf.h"
#include "checkpoint/owner_checkpoint.h"
#include "comm/comm_factory.h"

namespace {

using namespace mfsdp;
namespace fs = std::filesystem;

int64_t dir_bytes(const fs::path& dir) {
  int64_t total = 0;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec))
    if (f.is_regular_file(ec)) total += static_cast<int64_t>(f.file_size(ec));
  return total;
}

int list(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    std::fprintf(stderr, "mfsdp-ckpt: %s: not a directory\n", root.c_str());
    return 2;
  }
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory(ec) && e.path().filename().string().rfind("step_", 0) == 0) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  std::printf("%-22s %8s %6s %-11s %10s  %s\n", "checkpoint", "step", "world", "placement", "MiB", "state");
  for (const fs::path& d : dirs) {
    try {
      const CheckpointManifest m = CheckpointManifest::read(d.string());
      std::printf("%-22s %8lld %6d %-11s %10.1f  complete\n", d.filename().c_str(), static_cast<long long>(m.step),
                  m.world_size, m.placement.c_str(), dir_bytes(d) / 1048576.0);
    } catch (const std::exception& e) {
      std::printf("%-22s %8s %6s %-11s %10.1f  incomplete (%s)\n", d.filename().c_str(), "-", "-", "-",
                  dir_bytes(d) / 1048576.0, e.what());
    }
  }
  return 0;
}

// Every piece's checksum (verify_checkpoint), then, when they match, the state fingerprint of the
// checkpoint loaded on one process: what resume checks of the state itself.
std::vector<std::string> state_problems(const CheckpointManifest& m) {
  std::vector<std::string> problems = verify_checkpoint(m);
  if (problems.empty()) {  // MPI on this host only
    MpiSession mpi;
    const auto host = make_host_communicator();
    problems = verify_loaded_state(m, *host);
  }
  return problems;
}

int verify(const std::string& dir, const std::string& config, const std::vector<std::string>& overrides) {
  const CheckpointManifest m = CheckpointManifest::read(dir);
  std::optional<TrainConfig> run;  // the run that would resume: its data is checked
  if (!config.empty()) run = load_train_config(config, overrides);
  std::string note;
  auto problems = verify_run_state(m, run ? &*run : nullptr, &note);  // the run-state checks of resume
  if (!note.empty()) std::printf("notice: %s\n", note.c_str());
  for (auto& p : state_problems(m)) problems.push_back(std::move(p));
  for (const auto& p : problems) std::printf("%s\n", p.c_str());
  size_t pieces = 0;
  for (const auto& t : m.tensors)
    for (const auto& k : t.pieces) pieces += k.size();
  std::printf("%s: %zu tensors, %zu pieces, %s\n", dir.c_str(), m.tensors.size(), pieces,
              problems.empty() ? "all checks pass, all checksums match" : (std::to_string(problems.size()) + " problems").c_str());
  return problems.empty() ? 0 : 1;
}

// Refuses a manifest whose tensors claim more bytes than the files their pieces name hold, before
// any buffer is sized from the claim. Throws CheckpointError naming the manifest and the field.
void check_claimed_sizes(const CheckpointManifest& m) {
  const std::string manifest = (fs::path(m.dir) / "manifest.json").string();
  std::map<std::string, int64_t> file_bytes;
  for (size_t ti = 0; ti < m.tensors.size(); ++ti) {
    const auto& t = m.tensors[ti];
    for (int k = 0; k < 3; ++k) {
      int64_t claimed = 0, held = 0;
      std::set<std::string> files;
      for (const auto& p : t.pieces[k]) {
        claimed += p.numel * static_cast<int64_t>(sizeof(float));
        if (!files.insert(p.file).second) continue;
        if (!file_bytes.count(p.file)) {
          std::error_code ec;
          const auto n = fs::file_size(fs::path(m.dir) / p.file, ec);
          file_bytes[p.file] = ec ? 0 : static_cast<int64_t>(n);
        }
        held += file_bytes[p.file];
      }
      if (claimed > held)
        throw CheckpointError(manifest + ": tensors[" + std::to_string(ti) + "] ('" + t.name + "').pieces." +
                              state_kind_name(static_cast<StateKind>(k)) + ": claims " + std::to_string(claimed) +
                              " bytes, but its files hold " + std::to_string(held) + " bytes");
    }
  }
}

// read_full_tensor, with an allocation failure named by tensor and size.
std::vector<float> read_tensor(const CheckpointManifest& m, const std::string& name, StateKind kind) {
  try {
    return read_full_tensor(m, name, kind);
  } catch (const std::bad_alloc&) {
    throw CheckpointError((fs::path(m.dir) / "manifest.json").string() + ": tensor '" + name + "' (" +
                          state_kind_name(kind) + ") does not fit in memory");
  }
}

int export_hf(const std::string& dir, const std::string& out) {
  std::error_code ec;
  const auto rel = fs::weakly_canonical(out, ec).lexically_relative(fs::weakly_canonical(dir, ec));
  if (!rel.empty() && *rel.begin() != "..")
    throw CheckpointError(out + " is inside the checkpoint " + dir + "; choose a file outside it");
  if (const std::string e = foreign_export_files(out, "export path"); !e.empty()) throw CheckpointError(e);
  const CheckpointManifest m = CheckpointManifest::read(dir);
  const TrainConfig cfg = parse_train_config(m.config, (fs::path(dir) / "manifest.json").string() + " (config)", dir);
  check_claimed_sizes(m);
  if (const std::vector<std::string> problems = state_problems(m); !problems.empty())
    throw CheckpointError(dir + ": not exported: " + problems[0] +
                          (problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) + " more: mfsdp-ckpt verify lists them)" : ""));
  NamedTensors params;
  for (const auto& t : m.tensors) params[t.name] = read_tensor(m, t.name, StateKind::param);
  const std::map<std::string, std::string> meta{{"step", std::to_string(m.step)}};
  const char* layout = "GPT-2";
  if (cfg.model.arch == "qwen2_moe") {
    if (const std::string why = hf_moe_layout_refusal(cfg.model.moe()); !why.empty()) throw CheckpointError(dir + ": " + why);
    export_hf_moe(out, cfg.model.moe(), params, DType::f32, meta);
    layout = hf_moe_layout_name(cfg.model.moe());
  } else if (cfg.model.arch == "llama") {
    export_hf_llama(out, cfg.model.llama(), params, DType::f32, meta);
    layout = "Llama";
  } else {
    export_hf_gpt2(out, cfg.model.gpt(), params, DType::f32, meta);
  }
  std::printf("exported step %lld of %s to %s (Hugging Face %s layout, f32)\n", static_cast<long long>(m.step),
              dir.c_str(), out.c_str(), layout);
  return 0;
}

int diff(const std::string& a_dir, const std::string& b_dir) {
  const CheckpointManifest a = CheckpointManifest::read(a_dir), b = CheckpointManifest::read(b_dir);
  check_claimed_sizes(a);
  check_claimed_sizes(b);
  int differing = 0;
  if (a.step != b.step) std::printf("step: %lld vs %lld\n", static_cast<long long>(a.step), static_cast<long long>(b.step));
  for (const auto& ta : a.tensors) {
    const auto* tb = b.find(ta.name);
    if (!tb || tb->shape != ta.shape) {
      std::printf("%-40s only in %s, or another shape\n", ta.name.c_str(), a_dir.c_str());
      ++differing;
      continue;
    }
    for (int k = 0; k < 3; ++k) {
      if (ta.pieces[k].empty() || tb->pieces[k].empty()) continue;
      const auto kind = static_cast<StateKind>(k);
      const auto x = read_tensor(a, ta.name, kind), y = read_tensor(b, ta.name, kind);
      double max_abs = 0, num = 0, den = 0;
      int64_t count = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0) ++count;
        const double d = static_cast<double>(x[i]) - y[i];
        max_abs = std::max(max_abs, std::fabs(d));
        num += d * d;
        den += static_cast<double>(x[i]) * x[i];
      }
      if (count == 0) continue;
      ++differing;
      std::printf("%-40s %-5s %10lld of %10zu elements differ, max |a-b| %.3e, ||a-b||/||a|| %.3e\n", ta.name.c_str(),
                  state_kind_name(kind), static_cast<long long>(count), x.size(), max_abs,
                  den > 0 ? std::sqrt(num / den) : std::sqrt(num));
    }
  }
  for (const auto& tb : b.tensors)
    if (!a.find(tb.name)) {
      std::printf("%-40s only in %s\n", tb.name.c_str(), b_dir.c_str());
      ++differing;
    }
  std::printf("%s\n", differing ? (std::to_string(differing) + " tensors differ").c_str() : "identical (bitwise)");
  return differing ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mfsdp-ckpt: list, verify, export and compare MatrixFSDP checkpoints"};
  app.require_subcommand(1);
  std::string root, dir, out, other, config;
  std::vector<std::string> overrides;
  auto* l = app.add_subcommand("list", "checkpoints under a checkpoint root");
  l->add_option("root", root, "checkpoint root (checkpoint.dir)")->required();
  auto* v = app.add_subcommand(
      "verify", "every check of resume: manifest, step, loader, global batch, data files, every piece's checksum, the loaded state's fingerprint");
  v->add_option("dir", dir, "checkpoint directory (step_N)")->required();
  v->add_option("--config", config, "the config of the run that would resume: its data files are checked (default: "
                                    "the saved config's)");
  v->add_option("--set", overrides, "override a value of --config: key.path=value (repeatable)")->needs("--config");
  auto* e = app.add_subcommand("export", "write the consolidated Hugging Face export (a .safetensors file or a from_pretrained directory)");
  e->add_option("dir", dir, "checkpoint directory (step_N)")->required();
  e->add_option("out", out, "output .safetensors file")->required();
  auto* d = app.add_subcommand("diff", "compare two checkpoints tensor by tensor");
  d->add_option("a", dir, "first checkpoint directory")->required();
  d->add_option("b", other, "second checkpoint directory")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    const int rc = app.exit(err);
    return rc == 0 ? 0 : 2;
  }
  try {
    if (l->parsed()) return list(root);
    if (v->parsed()) return verify(dir, config, overrides);
    if (e->parsed()) return export_hf(dir, out);
    return diff(dir, other);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mfsdp-ckpt: out of memory reading %s\n", dir.c_str());
    return 2;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "mfsdp-ckpt: %s\n", ex.what());
    return 2;
  }
}
