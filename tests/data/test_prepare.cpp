// Corpus preparation: the bundled shards reproduced byte for byte from the raw text, output independent
// of the thread count, documents from directories and JSONL, 32-bit shards, and bad inputs.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <map>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/data/prepare.h"
#include "runtime/data/token_shards.h"
#include "runtime/data/tokenizer.h"
#include "tests/data/test_util.h"

using namespace mfsdp;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

const std::string kData = MFSDP_DATA_DIR;

using test::put;
using test::slurp;

std::vector<int32_t> shard_ids(const std::string& path) {
  TokenShard s(path);
  std::vector<int32_t> t(static_cast<size_t>(s.num_tokens()));
  s.read(0, s.num_tokens(), t.data());
  return t;
}

PrepareOptions gpt2_options(const std::vector<std::string>& inputs, const std::string& prefix) {
  PrepareOptions o;
  o.inputs = inputs;
  o.gpt2_dir = kData + "/gpt2_tokenizer";
  o.output_prefix = prefix;
  return o;
}

// Files under dir, relative path -> contents.
std::map<std::string, std::string> tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = slurp(e.path().string());
  return out;
}

}  // namespace

TEST_CASE("mfsdp-prepare reproduces the bundled GPT-2 and char shards byte for byte", "[prepare]") {
  test::ScratchDir dir;
  const std::string exe = MFSDP_PREPARE_EXE;
  const std::string raw = kData + "/tinyshakespeare.txt";
  // llm.c: "\n\n"-separated sections, <|endoftext|> before each, the first 32768 tokens are val.
  const std::string gpt2 = exe + " '" + raw + "' --doc-separator '\\n\\n' --val-tokens 32768 --val-from start -q -o '" +
                           dir.file("tiny_shakespeare") + "' --threads 2 > /dev/null";
  REQUIRE(std::system(gpt2.c_str()) == 0);
  CHECK(slurp(dir.file("tiny_shakespeare_train.bin")) == slurp(kData + "/tiny_shakespeare_train.bin"));
  CHECK(slurp(dir.file("tiny_shakespeare_val.bin")) == slurp(kData + "/tiny_shakespeare_val.bin"));
  // nanoGPT's char script: sorted distinct characters, the first 90% train, the last 10% val.
  const std::string chr = exe + " '" + raw + "' --tokenizer char -q -o '" + dir.file("tiny_shakespeare_char") + "' > /dev/null";
  REQUIRE(std::system(chr.c_str()) == 0);
  for (const char* f : {"_train.bin", "_val.bin", "_meta.json"})
    CHECK(slurp(dir.file(std::string("tiny_shakespeare_char") + f)) == slurp(kData + "/tiny_shakespeare_char" + f));
  CHECK(shard_ids(dir.file("tiny_shakespeare_char_val.bin")).size() == 111540);
  // Existing outputs are refused (exit 2) unless --overwrite.
  const int again = std::system(chr.c_str());
  CHECK(WEXITSTATUS(again) == 2);
  CHECK(std::system((chr.substr(0, chr.size() - 12) + " --overwrite > /dev/null").c_str()) == 0);
}

TEST_CASE("prepare output does not depend on the thread count", "[prepare]") {
  test::ScratchDir dir;
  const std::string shakespeare = slurp(kData + "/tinyshakespeare.txt");
  // A 3.3 MB single document is cut into ~1 MB chunks; small documents come from a directory and JSONL.
  put(dir.file("in/big.txt"), shakespeare + shakespeare + shakespeare);
  put(dir.file("in/sub/b.txt"), "Bravo, béta — ünïcödé.\n");
  put(dir.file("in/a.txt"), "Alpha.\n");
  put(dir.file("in/docs.jsonl"), "{\"text\": \"Jay son one\"}\n\n{\"text\": \"two \\u00e9\", \"id\": 2}\n");
  std::map<std::string, std::string> first;
  for (int threads : {1, 2, 3, 8}) {
    auto o = gpt2_options({dir.file("in")}, dir.file("out" + std::to_string(threads) + "/c"));
    o.threads = threads;
    o.shard_tokens = 300000;
    const auto r = prepare_corpus(o);
    CHECK(r.documents == 5);
    CHECK(r.train_files.size() == 4);
    const auto got = tree(dir.file("out" + std::to_string(threads)));
    if (first.empty()) first = got;
    else CHECK(got == first);
  }
  REQUIRE(first.size() == 5);  // c_train_000000 .. c_train_000003 and c_val_000000
  // The documents in order (a.txt, big.txt, docs.jsonl lines, sub/b.txt), each after <|endoftext|>,
  // and the chunked 3.3 MB document encodes exactly as one piece.
  auto tok = Tokenizer::load("gpt2", kData + "/gpt2_tokenizer");
  std::vector<int32_t> all;
  for (const auto& [name, _] : first) {
    const auto ids = shard_ids(dir.file("out1/" + name));
    if (name.find("_val_") != std::string::npos) continue;
    all.insert(all.end(), ids.begin(), ids.end());
  }
  const auto val = shard_ids(dir.file("out1/c_val_000000.bin"));
  all.insert(all.end(), val.begin(), val.end());
  std::vector<int32_t> expected;
  for (const std::string& doc : {std::string("Alpha.\n"), shakespeare + shakespeare + shakespeare,
                                 std::string("Jay son one"), std::string("two \xc3\xa9"),
                                 std::string("Bravo, béta — ünïcödé.\n")}) {
    expected.push_back(50256);
    const auto ids = tok->encode(doc);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  CHECK(all.size() == expected.size());
  CHECK(all == expected);
  CHECK(static_cast<double>(val.size()) == Approx(0.1 * static_cast<double>(all.size())).margin(1.0));
}

TEST_CASE("prepare reads a chosen JSONL field and writes 32-bit shards for large vocabularies", "[prepare]") {
  test::ScratchDir dir;
  put(dir.file("d.jsonl"), "{\"body\": \"abc\"}\n{\"body\": \"cab\"}\n");
  // A char meta JSON with 70000 entries: "a", "b", "c" and filler symbols; <sep> is id 69999.
  nlohmann::json meta;
  std::vector<std::string> itos = {"a", "b", "c"};
  for (int i = 3; i < 69999; ++i) itos.push_back("#" + std::to_string(i));
  itos.push_back("<sep>");
  meta["itos"] = itos;
  put(dir.file("meta.json"), meta.dump());
  PrepareOptions o;
  o.inputs = {dir.file("d.jsonl")};
  o.tokenizer = dir.file("meta.json");
  o.jsonl_field = "body";
  o.eot_token = "<sep>";
  o.val_tokens = 4;
  o.output_prefix = dir.file("o/x");
  const auto r = prepare_corpus(o);
  CHECK(r.vocab_size == 70000);
  CHECK(r.width == TokenWidth::u32);
  CHECK(shard_ids(dir.file("o/x_train.bin")) == std::vector<int32_t>{69999, 0, 1, 2});
  CHECK(shard_ids(dir.file("o/x_val.bin")) == std::vector<int32_t>{69999, 2, 0, 1});
  const std::string raw = slurp(dir.file("o/x_val.bin"));
  int32_t magic = 0;
  std::memcpy(&magic, raw.data(), 4);
  CHECK(magic == kShardMagicU32);
  CHECK(raw.size() == 1024 + 4 * 4);
  // The loader refuses the shards for a model whose vocabulary is smaller than the ids.
  CHECK(validate_shards(dir.file("o/x_*.bin"), 70000).size() == 2);
  CHECK_THROWS_WITH(validate_shards(dir.file("o/x_train.bin"), 50257), Contains("x_train.bin") && Contains("token id 69999 at token 0"));
}

TEST_CASE("prepare names the file and line of bad inputs and leaves no outputs", "[prepare]") {
  test::ScratchDir dir;
  auto fails = [&](const std::vector<std::string>& inputs, const std::string& message, PrepareOptions o = {}) {
    const std::string out = dir.file("out");
    o.inputs = inputs;
    o.gpt2_dir = kData + "/gpt2_tokenizer";
    o.output_prefix = out + "/p";
    INFO(message);
    CHECK_THROWS_WITH(prepare_corpus(o), Contains(message));
    const bool empty = !fs::exists(out) || fs::is_empty(out);
    CHECK(empty);
  };
  fails({dir.file("missing.txt")}, "cannot read " + dir.file("missing.txt") + ": no such file");
  put(dir.file("empty.txt"), "");
  fails({dir.file("empty.txt")}, "empty corpus");
  PrepareOptions chr;
  chr.tokenizer = "char";
  fails({dir.file("empty.txt")}, "empty corpus", chr);
  put(dir.file("bad.jsonl"), "{\"text\": \"ok\"}\n{\"text\": \"fine\"}\n{\"text\": oops}\n");
  fails({dir.file("bad.jsonl")}, dir.file("bad.jsonl") + ":3: invalid JSON");
  put(dir.file("nofield.jsonl"), "{\"text\": \"ok\"}\n\n{\"txt\": \"x\"}\n");
  fails({dir.file("nofield.jsonl")}, dir.file("nofield.jsonl") + ":3: no field 'text'");
  put(dir.file("num.jsonl"), "{\"text\": 5}\n");
  fails({dir.file("num.jsonl")}, dir.file("num.jsonl") + ":1: field 'text' is not a string");
  put(dir.file("array.jsonl"), "[1, 2]\n");
  fails({dir.file("array.jsonl")}, dir.file("array.jsonl") + ":1: expected a JSON object");
  // Invalid UTF-8 is refused with the file and the byte offset (here the second section, at byte 9).
  put(dir.file("bin.txt"), std::string("ok one\n\nok\xff two"));
  PrepareOptions sections;
  sections.doc_separator = "\n\n";
  fails({dir.file("bin.txt")}, dir.file("bin.txt") + ": byte offset 10: invalid UTF-8", sections);
  fails({dir.file("bin.txt")}, dir.file("bin.txt") + ": byte offset 10: invalid UTF-8", chr);
  // A character outside a fixed char vocabulary.
  put(dir.file("meta.json"), "{\"itos\": [\"a\", \"b\"]}");
  PrepareOptions fixed;
  fixed.tokenizer = dir.file("meta.json");
  put(dir.file("abc.txt"), "abbacab");
  fails({dir.file("abc.txt")}, dir.file("abc.txt") + ": byte offset 4: character 'c' is not in the vocabulary", fixed);
  PrepareOptions eot;
  eot.eot_token = "<|nope|>";
  fails({dir.file("abc.txt")}, "no token '<|nope|>'", eot);
  put(dir.file("emptydir/.keep/x"), "");
  fs::remove(dir.file("emptydir/.keep/x"));
  fails({dir.file("emptydir")}, "holds no files");
  CHECK_THROWS_WITH(unescape_cli("a\\qb"), Contains("unsupported escape '\\q'"));
  CHECK(unescape_cli("\\n\\n\\t\\\\") == "\n\n\t\\");
}
