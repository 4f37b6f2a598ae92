#include "runtime/data/prepare.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>

#include "runtime/core/cpu_affinity.h"
#include "runtime/core/file_checks.h"
#include "runtime/core/json_limits.h"
#include "runtime/core/utf8.h"
#include "runtime/data/tokenizer.h"

namespace mfsdp {

namespace fs = std::filesystem;

namespace {

constexpr size_t kBatchBytes = size_t{64} << 20;  // text read per batch
constexpr size_t kChunkBytes = size_t{1} << 20;   // long GPT-2 documents are encoded in chunks of ~1 MB

[[noreturn]] void fail(const std::string& what) { throw DataError("[mfsdp-prepare] " + what); }

// One document: its text and where it came from (file, JSONL line or byte offset of a text piece).
struct Doc {
  size_t file = 0;
  int64_t line = 0;     // 1-based JSONL line, 0 for text files
  size_t offset = 0;    // byte offset of the text in its file (text files)
  std::string text;
};

std::vector<std::string> list_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(in, ec); !ec && it != fs::recursive_directory_iterator();
           it.increment(ec))
        if (it->is_regular_file(ec)) found.push_back(it->path().string());
      if (ec) fail("cannot list " + in + ": " + ec.message());
      std::sort(found.begin(), found.end());
      if (found.empty()) fail("directory " + in + " holds no files");
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::exists(in, ec)) {
      require_input_file<DataError>(in, "[mfsdp-prepare]");
      files.push_back(in);
    } else {
      fail("cannot read " + in + ": no such file or directory");
    }
  }
  if (files.empty()) fail("no input files");
  return files;
}

// A whole input file (open_input_file: a FIFO or device swapped in after the listing is refused by
// name, never read). DataError "[mfsdp-prepare] ..." naming the path.
std::string read_all(const std::string& path) {
  return read_input_file<DataError>(path, "[mfsdp-prepare]");
}

// Reads the inputs in order and hands out documents in batches of about kBatchBytes.
class DocReader {
 public:
  DocReader(const std::vector<std::string>& files, const PrepareOptions& opt) : files_(files), opt_(opt) {}

  // The next batch; empty at the end.
  std::vector<Doc> next() {
    std::vector<Doc> batch;
    size_t bytes = 0;
    while (bytes < kBatchBytes && file_ < files_.size()) {
      const std::string text = read_all(files_[file_]);
      bytes_read_ += static_cast<int64_t>(text.size());
      const size_t before = batch.size();
      if (is_jsonl(files_[file_])) jsonl_docs(text, batch);
      else text_docs(text, batch);
      for (size_t k = before; k < batch.size(); ++k) bytes += batch[k].text.size();
      ++file_;
    }
    return batch;
  }
  int64_t bytes_read() const { return bytes_read_; }

 private:
  bool is_jsonl(const std::string& path) const {
    return opt_.format == "jsonl" || (opt_.format == "auto" && fs::path(path).extension() == ".jsonl");
  }
  void text_docs(const std::string& text, std::vector<Doc>& out) const {
    const std::string& sep = opt_.doc_separator;
    size_t pos = 0;
    while (!sep.empty()) {
      const size_t at = text.find(sep, pos);
      if (at == std::string::npos) break;
      out.push_back(Doc{file_, 0, pos, text.substr(pos, at + sep.size() - pos)});
      pos = at + sep.size();
    }
    if (pos < text.size()) out.push_back(Doc{file_, 0, pos, text.substr(pos)});
  }
  void jsonl_docs(const std::string& text, std::vector<Doc>& out) const {
    const std::string& where = files_[file_];
    int64_t line_no = 0;
    for (size_t pos = 0; pos < text.size();) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      ++line_no;
      const std::string_view line(text.data() + pos, end - pos);
      pos = end + 1;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      const std::string at = where + ":" + std::to_string(line_no);
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        fail(at + ": invalid JSON: " + json_error_text(e.what()));
      }
      if (!j.is_object()) fail(at + ": expected a JSON object");
      auto field = j.find(opt_.jsonl_field);
      if (field == j.end()) fail(at + ": no field '" + opt_.jsonl_field + "'");
      if (!field->is_string()) fail(at + ": field '" + opt_.jsonl_field + "' is not a string");
      out.push_back(Doc{file_, line_no, 0, field->get<std::string>()});
    }
  }

  const std::vector<std::string>& files_;
  const PrepareOptions& opt_;
  size_t file_ = 0;
  int64_t bytes_read_ = 0;
};

// Where a byte of a document is, for error messages.
std::string doc_place(const std::vector<std::string>& files, const Doc& d, size_t byte) {
  if (d.line > 0) return files[d.file] + ":" + std::to_string(d.line) + ": field byte offset " + std::to_string(byte);
  return files[d.file] + ": byte offset " + std::to_string(d.offset + byte);
}

// Cut points of a long GPT-2 document: after a "\n" that follows a printable ASCII character and
// precedes an ASCII letter. GPT-2's pattern never matches across such a point and matches the same
// pieces before it whether or not the text ends there, so chunks encode to the same ids as the whole.
std::vector<size_t> gpt2_cuts(const std::string& s) {
  std::vector<size_t> cuts{0};
  size_t p = kChunkBytes;
  while (p + 1 < s.size()) {
    const auto ok = [&](size_t q) {
      return s[q - 1] == '\n' && s[q - 2] > ' ' && s[q - 2] < 0x7F && std::isalpha(static_cast<unsigned char>(s[q]));
    };
    while (p + 1 < s.size() && !ok(p)) ++p;
    if (p + 1 >= s.size()) break;
    cuts.push_back(p);
    p += kChunkBytes;
  }
  cuts.push_back(s.size());
  return cuts;
}

// Character vocabulary of the corpus: every distinct code point, sorted (as nanoGPT's char script).
std::vector<std::string> corpus_chars(const std::vector<std::string>& files, const PrepareOptions& opt) {
  std::set<std::string> chars;
  DocReader reader(files, opt);
  for (auto batch = reader.next(); !batch.empty(); batch = reader.next())
    for (const Doc& d : batch) {
      if (const size_t bad = invalid_utf8_at(d.text); bad != std::string::npos)
        fail(doc_place(files, d, bad) + ": invalid UTF-8");
      for (size_t i = 0; i < d.text.size();) {
        const auto c = static_cast<unsigned char>(d.text[i]);
        const size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        chars.insert(d.text.substr(i, len));
        i += len;
      }
    }
  return {chars.begin(), chars.end()};
}

std::string percent(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g%%", f * 100.0);
  return buf;
}

}  // namespace

std::string unescape_cli(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    const char e = i + 1 < s.size() ? s[++i] : '\0';
    if (e == 'n') out += '\n';
    else if (e == 'r') out += '\r';
    else if (e == 't') out += '\t';
    else if (e == '\\') out += '\\';
    else throw DataError("[mfsdp-prepare] unsupported escape '\\" + std::string(1, e) + "' in '" + s + "'");
  }
  return out;
}

namespace {

void check_options(const PrepareOptions& opt) {
  if (opt.output_prefix.empty()) fail("no output prefix");
  // The outputs are <prefix>_train.bin ...: a prefix that ends in a directory ("data/", ".") would
  // write "data/_train.bin", so it is refused with the name it needs.
  const fs::path prefix(opt.output_prefix);
  if (const std::string stem = prefix.filename().string(); stem.empty() || stem == "." || stem == "..")
    fail("output prefix " + opt.output_prefix + " names a directory; the outputs are <prefix>_train.bin and " +
         "<prefix>_val.bin, so add a name: -o " + (prefix / "corpus").lexically_normal().string() + " writes " +
         (prefix / "corpus_train.bin").lexically_normal().string());
  if (opt.threads < 1 || opt.threads > kMaxCpuThreads)
    fail("threads must be in 1.." + std::to_string(kMaxCpuThreads) + ", got " + std::to_string(opt.threads));
  if (opt.shard_tokens < 0 || opt.shard_tokens > INT32_MAX)
    fail("shard_tokens must be in 0..2147483647, got " + std::to_string(opt.shard_tokens));
  if (opt.val_tokens < -1) fail("val_tokens must be >= 0, got " + std::to_string(opt.val_tokens));
  if (opt.val_tokens < 0 && !(opt.val_fraction >= 0.0 && opt.val_fraction < 1.0))
    fail("val_fraction must be in [0, 1), got " + std::to_string(opt.val_fraction));
  if (opt.format != "auto" && opt.format != "text" && opt.format != "jsonl")
    fail("format must be auto, text or jsonl, got '" + opt.format + "'");
}

// The tokenizer of `opt`; for "char", the vocabulary built from the corpus goes to built_itos.
std::unique_ptr<Tokenizer> load_tokenizer(const PrepareOptions& opt, const std::vector<std::string>& files,
                                          std::vector<std::string>& built_itos) {
  try {
    if (opt.tokenizer == "gpt2") return Tokenizer::load("gpt2", opt.gpt2_dir);
    if (opt.tokenizer == "char") {
      built_itos = corpus_chars(files, opt);
      if (built_itos.empty()) fail("empty corpus: no text in " + std::to_string(files.size()) + " file(s)");
      return make_char_tokenizer(built_itos);
    }
    if (!fs::exists(opt.tokenizer)) fail("cannot read tokenizer " + opt.tokenizer + " (expected gpt2, char or a JSON file)");
    const std::string head = read_input_file<DataError>(opt.tokenizer, "[mfsdp-prepare] tokenizer", 4096, false);
    const bool char_meta = head.find("\"itos\"") != std::string::npos && head.find("\"model\"") == std::string::npos;
    return Tokenizer::load(char_meta ? "char" : "tokenizer.json", opt.tokenizer);
  } catch (const DataError&) {
    throw;
  } catch (const std::exception& e) {
    fail(std::string("tokenizer: ") + e.what());
  }
}

// The files a run with prefix P may write, by name in P's directory: P_train.bin, P_val.bin,
// P_train_NNNNNN.bin, P_val_NNNNNN.bin, and P_meta.json when a char vocabulary is built.
struct OutputNames {
  fs::path dir;
  std::string stem;
  bool meta = false;

  bool matches(const std::string& name) const {
    for (const char* split : {"_train", "_val"}) {
      const std::string base = stem + split;
      if (name == base + ".bin") return true;
      if (name.size() == base.size() + 11 && name.rfind(base + "_", 0) == 0 && name.substr(name.size() - 4) == ".bin" &&
          std::all_of(name.begin() + static_cast<std::ptrdiff_t>(base.size()) + 1, name.end() - 4,
                      [](char c) { return c >= '0' && c <= '9'; }))
        return true;
    }
    return meta && name == stem + "_meta.json";
  }
  // Whether `file` names one of these outputs (its directory compared after resolving links).
  bool names(const std::string& file) const {
    std::error_code ec;
    const fs::path p = fs::weakly_canonical(file, ec);
    return matches(fs::path(file).filename().string()) && p.parent_path() == fs::weakly_canonical(dir, ec);
  }
};

// Why an existing output must not be replaced: "" when mfsdp-prepare wrote it (a token shard of
// the exact size its header states, or a char meta JSON with "itos"), else the reason.
std::string foreign_output(const fs::path& path) {
  const std::string p = path.string();
  std::string text;
  try {  // open_input_file: a FIFO or a device is refused by name, never read
    text = read_input_file(p, "", path.extension() == ".json" ? size_t{64} << 20 : 12, false);
  } catch (const std::exception& e) {
    return e.what();
  }
  if (path.extension() == ".json") {
    std::error_code ec;
    if (fs::file_size(path, ec) > (size_t{64} << 20)) return p + " is larger than any char meta JSON";
    const auto j = json_nesting_depth(text) <= kMaxJsonDepth ? nlohmann::json::parse(text, nullptr, false)
                                                              : nlohmann::json();
    const bool ours = j.is_object() && j.value("kind", nlohmann::json()) == "char" && j.contains("itos");
    return ours ? "" : p + " is not a char meta JSON";
  }
  int32_t header[3] = {0, 0, 0};
  std::memcpy(header, text.data(), std::min(text.size(), sizeof header));
  std::error_code ec;
  const auto size = static_cast<int64_t>(fs::file_size(path, ec));
  const int64_t width = header[0] == kShardMagicU16 ? 2 : header[0] == kShardMagicU32 ? 4 : 0;
  const bool ours = text.size() == sizeof header && width > 0 && header[1] == kShardVersion && header[2] >= 0 &&
                    size == kShardHeaderBytes + width * header[2];
  return ours ? "" : p + " is not a token shard";
}

// Existing outputs of the prefix, each checked to be one mfsdp-prepare wrote. Throws DataError
// when one is not ours (never replaced, even with --overwrite).
std::vector<fs::path> existing_outputs(const OutputNames& names) {
  std::vector<fs::path> existing;
  std::error_code ec;
  for (auto it = fs::directory_iterator(names.dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    if (names.matches(it->path().filename().string())) existing.push_back(it->path());
  std::sort(existing.begin(), existing.end());
  for (const auto& p : existing)
    if (const std::string why = foreign_output(p); !why.empty())
      fail(why + ": it was not written by mfsdp-prepare; refusing to replace it (move it or choose another -o)");
  return existing;
}

// Refuses, before anything is written, an input or tokenizer file that is an output of the prefix
// (by name, or the same file as an existing output): replacing it would destroy the input.
void refuse_inputs_as_outputs(const std::vector<std::string>& files, const PrepareOptions& opt,
                              const OutputNames& names, const std::vector<fs::path>& existing) {
  std::vector<std::string> read = files;
  if (opt.tokenizer != "gpt2" && opt.tokenizer != "char") read.push_back(opt.tokenizer);
  for (const auto& f : read) {
    std::error_code ec;
    bool same = names.names(f);
    for (const auto& e : existing) same = same || fs::equivalent(f, e, ec);
    if (same)
      fail("input " + f + " is also an output of -o " + opt.output_prefix +
           "; it would be replaced (move the old outputs away, or write to another prefix)");
  }
}

// Encodes every document, batch by batch; units (documents or ~1 MB chunks of long GPT-2
// documents) in parallel, concatenated in order. Counts documents and input bytes into res.
std::vector<uint32_t> encode_corpus(const std::vector<std::string>& files, const PrepareOptions& opt,
                                    const Tokenizer& tok, int32_t eot, std::ostream* progress, PrepareResult& res) {
  struct Unit {
    size_t doc, begin, end;
  };
  const bool chunked = tok.kind() == "gpt2";
  std::vector<uint32_t> tokens;
  DocReader reader(files, opt);
  const auto t0 = std::chrono::steady_clock::now();
  const bool tty = progress && ::isatty(STDERR_FILENO);
  for (auto batch = reader.next(); !batch.empty(); batch = reader.next()) {
    std::vector<Unit> units;
    for (size_t d = 0; d < batch.size(); ++d) {
      if (!chunked || batch[d].text.size() <= 2 * kChunkBytes) {
        units.push_back({d, 0, batch[d].text.size()});
        continue;
      }
      const auto cuts = gpt2_cuts(batch[d].text);
      for (size_t k = 0; k + 1 < cuts.size(); ++k) units.push_back({d, cuts[k], cuts[k + 1]});
    }
    std::vector<std::vector<int32_t>> ids(units.size());
    std::vector<std::string> errors(units.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(opt.threads)
    for (size_t u = 0; u < units.size(); ++u) {
      const Unit& un = units[u];
      const Doc& d = batch[un.doc];
      try {
        ids[u] = tok.encode(un.begin == 0 && un.end == d.text.size() ? d.text : d.text.substr(un.begin, un.end - un.begin));
      } catch (const EncodeError& e) {
        errors[u] = doc_place(files, d, un.begin + e.byte_offset) + ": " + e.reason;
      } catch (const std::exception& e) {
        errors[u] = files[d.file] + ": " + e.what();
      }
    }
    for (size_t u = 0; u < units.size(); ++u) {
      if (!errors[u].empty()) fail(errors[u]);
      if (units[u].begin == 0 && eot >= 0) tokens.push_back(static_cast<uint32_t>(eot));
      tokens.insert(tokens.end(), ids[u].begin(), ids[u].end());
    }
    res.documents += static_cast<int64_t>(batch.size());
    if (progress) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      char line[200];
      std::snprintf(line, sizeof line, "mfsdp-prepare: %lld documents, %lld tokens, %.1f MB, %.1f MB/s",
                    static_cast<long long>(res.documents), static_cast<long long>(tokens.size()),
                    reader.bytes_read() / 1e6, reader.bytes_read() / 1e6 / std::max(s, 1e-9));
      *progress << (tty ? "\r" : "") << line << (tty ? "" : "\n") << std::flush;
    }
  }
  if (tty) *progress << "\n";
  res.input_bytes = reader.bytes_read();
  return tokens;
}

// Outputs written under temporary names beside their final ones (SwapFile), renamed onto them
// only once every one is complete; the temporaries of an unfinished run are removed.
class StagedOutputs {
 public:
  // A fresh temporary for `final_path`.
  SwapFile& stage(const std::string& final_path) {
    try {
      staged_.push_back(std::make_unique<SwapFile>(final_path));
    } catch (const std::exception& e) {
      fail(e.what());
    }
    return *staged_.back();
  }
  // Renames every (finished) temporary onto its final name, then removes the earlier outputs
  // (`stale`) that no new file replaced.
  void commit(const std::vector<fs::path>& stale) {
    std::set<std::string> written;
    for (auto& f : staged_) {
      try {
        f->commit();
      } catch (const std::exception& e) {
        fail(e.what());
      }
      written.insert(fs::path(f->path()).filename().string());
    }
    staged_.clear();
    std::error_code ec;
    for (const auto& p : stale)
      if (!written.count(p.filename().string())) fs::remove(p, ec);
  }

 private:
  std::vector<std::unique_ptr<SwapFile>> staged_;  // each removes its temporary unless committed
};

// Writes one split as one file or shards of opt.shard_tokens tokens; records the final names.
void write_split(const std::vector<uint32_t>& t, const char* split, const PrepareOptions& opt, TokenWidth width,
                 StagedOutputs& staged, std::vector<std::string>& out) {
  if (t.empty()) return;
  const int64_t per = opt.shard_tokens > 0 ? opt.shard_tokens : static_cast<int64_t>(t.size());
  for (int64_t k = 0, at = 0; at < static_cast<int64_t>(t.size()); ++k, at += per) {
    char suffix[32];
    if (opt.shard_tokens > 0) std::snprintf(suffix, sizeof suffix, "_%s_%06lld.bin", split, static_cast<long long>(k));
    else std::snprintf(suffix, sizeof suffix, "_%s.bin", split);
    const std::string path = opt.output_prefix + suffix;
    const auto e = t.begin() + std::min<int64_t>(at + per, static_cast<int64_t>(t.size()));
    write_token_shard_to(staged.stage(path), std::vector<uint32_t>(t.begin() + at, e), width);
    out.push_back(path);
  }
}

// The char meta JSON (data/tiny_shakespeare_char_meta.json's format).
std::string char_meta(const std::vector<std::string>& itos, const PrepareOptions& opt, int64_t nval) {
  nlohmann::ordered_json meta;
  meta["kind"] = "char";
  meta["vocab_size"] = itos.size();
  meta["itos"] = itos;
  std::string sources;
  for (const auto& in : opt.inputs) sources += (sources.empty() ? "" : ", ") + fs::path(in).filename().string();
  meta["source"] = escape_invalid_utf8(sources);  // JSON holds UTF-8 only; a file name may hold any bytes
  meta["split"] = opt.val_tokens >= 0 ? (opt.val_from_start ? "first " : "last ") + std::to_string(nval) + " tokens val"
                  : opt.val_from_start
                      ? "first " + percent(opt.val_fraction) + " val, last " + percent(1.0 - opt.val_fraction) + " train"
                      : "first " + percent(1.0 - opt.val_fraction) + " train, last " + percent(opt.val_fraction) + " val";
  return meta.dump(1);
}

// Splits the token stream into train and val and writes both (and the char meta) as staged files.
void write_outputs(std::vector<uint32_t>& tokens, const PrepareOptions& opt, const std::vector<std::string>& itos,
                   StagedOutputs& staged, PrepareResult& res) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t nval = opt.val_tokens >= 0 ? opt.val_tokens
                                           : n - static_cast<int64_t>(static_cast<double>(n) * (1.0 - opt.val_fraction));
  if (nval >= n)
    fail("val split of " + std::to_string(nval) + " tokens leaves no training tokens (corpus: " + std::to_string(n) + ")");
  const auto val_begin = opt.val_from_start ? tokens.begin() : tokens.end() - nval;
  const std::vector<uint32_t> val(val_begin, val_begin + nval);
  if (opt.val_from_start) tokens.erase(tokens.begin(), tokens.begin() + nval);
  else tokens.resize(static_cast<size_t>(n - nval));
  res.val_tokens = nval;
  res.train_tokens = n - nval;
  write_split(val, "val", opt, res.width, staged, res.val_files);
  write_split(tokens, "train", opt, res.width, staged, res.train_files);
  if (itos.empty()) return;
  res.meta_file = opt.output_prefix + "_meta.json";
  SwapFile& meta = staged.stage(res.meta_file);
  try {
    meta.write(char_meta(itos, opt, nval));
    meta.finish();
  } catch (const DataError&) {
    throw;
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

}  // namespace

PrepareResult prepare_corpus(const PrepareOptions& opt, std::ostream* progress) {
  check_options(opt);
  const std::vector<std::string> files = list_files(opt.inputs);
  // Every check on the outputs comes before any input is read and anything is written or removed.
  const fs::path prefix(opt.output_prefix);
  const OutputNames names{prefix.has_parent_path() ? prefix.parent_path() : fs::path("."), prefix.filename().string(),
                          opt.tokenizer == "char"};
  const std::vector<fs::path> existing = existing_outputs(names);
  refuse_inputs_as_outputs(files, opt, names, existing);
  if (!existing.empty() && !opt.overwrite)
    fail("output " + existing.front().string() + " exists (use --overwrite to replace the outputs of this prefix)");
  PrepareResult res;
  std::vector<std::string> built_itos;
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(opt, files, built_itos);
  res.vocab_size = tok->vocab_size();
  res.width = shard_width_for_vocab(res.vocab_size);
  int32_t eot = -1;
  const std::string eot_name = opt.eot_token == "auto" ? (tok->kind() == "gpt2" ? "<|endoftext|>" : "") : opt.eot_token;
  if (!eot_name.empty()) {
    eot = tok->token_id(eot_name);
    if (eot < 0) fail("the tokenizer has no token '" + eot_name + "' for eot_token");
  }
  std::vector<uint32_t> tokens = encode_corpus(files, opt, *tok, eot, progress, res);
  if (tokens.empty()) fail("empty corpus: no text in " + std::to_string(files.size()) + " file(s)");
  std::error_code ec;
  if (prefix.has_parent_path() && !fs::create_directories(prefix.parent_path(), ec) && ec)
    fail("cannot create the output directory " + prefix.parent_path().string() + ": " + ec.message());
  StagedOutputs staged;
  write_outputs(tokens, opt, built_itos, staged, res);
  staged.commit(existing);
  return res;
}

}  // namespace mfsdp
