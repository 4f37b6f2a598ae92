#include "runtime/data/prepare.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
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
      files.push_back(in);
    } else {
      fail("cannot read " + in + ": no such file or directory");
    }
  }
  if (files.empty()) fail("no input files");
  return files;
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("cannot read " + path + ": read error");
  return ss.str();
}

// Offset of the first invalid UTF-8 sequence, or npos.
size_t invalid_utf8_at(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0, n = s.size(); i < n;) {
    const unsigned c = p[i];
    size_t len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    if (len == 0 || i + len > n) return i;
    for (size_t k = 1; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return i;
    if ((c == 0xE0 && p[i + 1] < 0xA0) || (c == 0xED && p[i + 1] >= 0xA0) || (c == 0xF0 && p[i + 1] < 0x90) ||
        (c == 0xF4 && p[i + 1] >= 0x90))
      return i;  // overlong, surrogate or above U+10FFFF
    i += len;
  }
  return std::string::npos;
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
        fail(at + ": invalid JSON: " + e.what());
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

void write_text_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      fail("cannot write " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  }
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

PrepareResult prepare_corpus(const PrepareOptions& opt, std::ostream* progress) {
  if (opt.output_prefix.empty()) fail("no output prefix");
  if (opt.threads < 1) fail("threads must be >= 1, got " + std::to_string(opt.threads));
  if (opt.shard_tokens < 0) fail("shard_tokens must be >= 0");
  if (opt.val_tokens < 0 && !(opt.val_fraction >= 0.0 && opt.val_fraction < 1.0))
    fail("val_fraction must be in [0, 1), got " + std::to_string(opt.val_fraction));
  if (opt.format != "auto" && opt.format != "text" && opt.format != "jsonl")
    fail("format must be auto, text or jsonl, got '" + opt.format + "'");
  const std::vector<std::string> files = list_files(opt.inputs);

  // The tokenizer.
  PrepareResult res;
  std::unique_ptr<Tokenizer> tok;
  std::vector<std::string> built_itos;
  try {
    if (opt.tokenizer == "gpt2") {
      tok = Tokenizer::load("gpt2", opt.gpt2_dir);
    } else if (opt.tokenizer == "char") {
      built_itos = corpus_chars(files, opt);
      if (built_itos.empty()) fail("empty corpus: no text in " + std::to_string(files.size()) + " file(s)");
      tok = make_char_tokenizer(built_itos);
    } else {
      std::ifstream probe(opt.tokenizer);
      if (!probe) fail("cannot read tokenizer " + opt.tokenizer + " (expected gpt2, char or a JSON file)");
      std::string head(4096, '\0');
      probe.read(head.data(), static_cast<std::streamsize>(head.size()));
      head.resize(static_cast<size_t>(probe.gcount()));
      tok = Tokenizer::load(head.find("\"itos\"") != std::string::npos && head.find("\"model\"") == std::string::npos
                                ? "char"
                                : "tokenizer.json",
                            opt.tokenizer);
    }
  } catch (const DataError&) {
    throw;
  } catch (const std::exception& e) {
    fail(std::string("tokenizer: ") + e.what());
  }
  res.vocab_size = tok->vocab_size();
  res.width = shard_width_for_vocab(res.vocab_size);
  int32_t eot = -1;
  const std::string eot_name = opt.eot_token == "auto" ? (tok->kind() == "gpt2" ? "<|endoftext|>" : "") : opt.eot_token;
  if (!eot_name.empty()) {
    eot = tok->token_id(eot_name);
    if (eot < 0) fail("the tokenizer has no token '" + eot_name + "' for eot_token");
  }
  const bool chunked = tok->kind() == "gpt2";

  // Outputs: refuse to clobber unless asked; with overwrite, stale numbered shards of this prefix go.
  const fs::path prefix(opt.output_prefix);
  if (prefix.has_parent_path()) fs::create_directories(prefix.parent_path());
  {
    const fs::path dir = prefix.has_parent_path() ? prefix.parent_path() : fs::path(".");
    const std::string stem = prefix.filename().string();
    std::vector<fs::path> existing;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      for (const char* split : {"_train", "_val"})
        if (name == stem + split + ".bin" ||
            (name.rfind(stem + split + "_", 0) == 0 && name.size() == stem.size() + std::strlen(split) + 11 &&
             name.substr(name.size() - 4) == ".bin"))
          existing.push_back(e.path());
      if (!built_itos.empty() && name == stem + "_meta.json") existing.push_back(e.path());
    }
    if (!existing.empty() && !opt.overwrite)
      fail("output " + existing.front().string() + " exists (use --overwrite to replace the outputs of this prefix)");
    for (const auto& p : existing) fs::remove(p);
  }

  // Encode, batch by batch; units (documents or chunks of them) in parallel, concatenated in order.
  std::vector<uint32_t> tokens;
  DocReader reader(files, opt);
  const auto t0 = std::chrono::steady_clock::now();
  const bool tty = progress && ::isatty(STDERR_FILENO);
  for (auto batch = reader.next(); !batch.empty(); batch = reader.next()) {
    struct Unit {
      size_t doc, begin, end;
    };
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
        ids[u] = tok->encode(un.begin == 0 && un.end == d.text.size() ? d.text
                                                                       : d.text.substr(un.begin, un.end - un.begin));
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
  if (tokens.empty()) fail("empty corpus: no text in " + std::to_string(files.size()) + " file(s)");

  // Split and write.
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t nval = opt.val_tokens >= 0 ? opt.val_tokens
                                           : n - static_cast<int64_t>(static_cast<double>(n) * (1.0 - opt.val_fraction));
  if (nval >= n) fail("val split of " + std::to_string(nval) + " tokens leaves no training tokens (corpus: " +
                      std::to_string(n) + ")");
  const auto val_begin = opt.val_from_start ? tokens.begin() : tokens.end() - nval;
  const std::vector<uint32_t> val(val_begin, val_begin + nval);
  if (opt.val_from_start) tokens.erase(tokens.begin(), tokens.begin() + nval);
  else tokens.resize(static_cast<size_t>(n - nval));
  res.val_tokens = nval;
  res.train_tokens = n - nval;
  auto write_split = [&](const std::vector<uint32_t>& t, const char* split, std::vector<std::string>& out) {
    if (t.empty()) return;
    const int64_t per = opt.shard_tokens > 0 ? opt.shard_tokens : static_cast<int64_t>(t.size());
    for (int64_t k = 0, at = 0; at < static_cast<int64_t>(t.size()); ++k, at += per) {
      char suffix[32];
      if (opt.shard_tokens > 0) std::snprintf(suffix, sizeof suffix, "_%s_%06lld.bin", split, static_cast<long long>(k));
      else std::snprintf(suffix, sizeof suffix, "_%s.bin", split);
      const std::string path = opt.output_prefix + suffix;
      const auto e = t.begin() + std::min<int64_t>(at + per, static_cast<int64_t>(t.size()));
      write_token_shard(path, std::vector<uint32_t>(t.begin() + at, e), res.width);
      out.push_back(path);
    }
  };
  write_split(val, "val", res.val_files);
  write_split(tokens, "train", res.train_files);
  if (!built_itos.empty()) {
    nlohmann::ordered_json meta;
    meta["kind"] = "char";
    meta["vocab_size"] = built_itos.size();
    meta["itos"] = built_itos;
    std::string sources;
    for (const auto& in : opt.inputs) sources += (sources.empty() ? "" : ", ") + fs::path(in).filename().string();
    meta["source"] = sources;
    meta["split"] = opt.val_tokens >= 0 ? (opt.val_from_start ? "first " : "last ") + std::to_string(nval) + " tokens val"
                    : opt.val_from_start ? "first " + percent(opt.val_fraction) + " val, last " +
                                               percent(1.0 - opt.val_fraction) + " train"
                                         : "first " + percent(1.0 - opt.val_fraction) + " train, last " +
                                               percent(opt.val_fraction) + " val";
    res.meta_file = opt.output_prefix + "_meta.json";
    write_text_atomic(res.meta_file, meta.dump(1));
  }
  return res;
}

}  // namespace mfsdp
