// Tokenizers on the real data: char round trip over Tiny Shakespeare, GPT-2 reference cases.
#include <catch2/catch.hpp>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/data/bpe.h"
#include "runtime/data/token_shards.h"
#include "runtime/data/tokenizer.h"
#include "tests/data/test_util.h"

using namespace mfsdp;
using Catch::Matchers::Contains;

namespace {

const std::string kData = MFSDP_DATA_DIR;

std::vector<int32_t> all_tokens(const std::string& path) {
  TokenShard s(path);
  std::vector<int32_t> t(static_cast<size_t>(s.num_tokens()));
  s.read(0, s.num_tokens(), t.data());
  return t;
}

}  // namespace

TEST_CASE("char tokenizer round-trips the whole Tiny Shakespeare text", "[tokenizer]") {
  auto tok = Tokenizer::load("char", kData + "/tiny_shakespeare_char_meta.json");
  CHECK(tok->kind() == "char");
  CHECK(tok->vocab_size() == 65);
  auto ids = all_tokens(kData + "/tiny_shakespeare_char_train.bin");
  const auto val = all_tokens(kData + "/tiny_shakespeare_char_val.bin");
  ids.insert(ids.end(), val.begin(), val.end());
  const std::string text = tok->decode(ids);
  CHECK(text.size() == 1115394);  // the length of tinyshakespeare.txt
  CHECK(text.rfind("First Citizen:\nBefore we proceed any further, hear me speak.", 0) == 0);
  CHECK(tok->encode(text) == ids);
  // The decoded shards are exactly the raw text: its FNV-1a 64 is recorded in data/README.md.
  uint64_t fnv = 0xcbf29ce484222325ull;
  for (unsigned char c : text) fnv = (fnv ^ c) * 0x100000001b3ull;
  CHECK(fnv == 0x4016c93c3be74c18ull);
  CHECK_THROWS_WITH(tok->encode("ab#c"), Contains("'#' at byte offset 2"));
  CHECK_THROWS_WITH(tok->decode({1, 65}), Contains("id 65 at position 1"));
}

TEST_CASE("char tokenizer rejects bad meta files", "[tokenizer]") {
  CHECK_THROWS_AS(Tokenizer::load("char", kData + "/does_not_exist.json"), std::runtime_error);
  CHECK_THROWS_AS(Tokenizer::load("sentencepiece", kData), std::invalid_argument);
  CHECK_THROWS_WITH(make_char_tokenizer({"a", "b", "a"}), Contains("duplicate"));
  auto t = make_char_tokenizer({"é", "x"});
  CHECK(t->encode("xéx") == std::vector<int32_t>{1, 0, 1});
}

TEST_CASE("GPT-2 decode and encode match the reference cases", "[tokenizer]") {
  auto tok = Tokenizer::load("gpt2", kData + "/gpt2_tokenizer");
  CHECK(tok->kind() == "gpt2");
  CHECK(tok->vocab_size() == 50257);
  std::ifstream f(kData + "/gpt2_tokenizer/reference_cases.json");
  const auto cases = nlohmann::json::parse(f);
  REQUIRE(cases.size() >= 10);
  for (const auto& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    INFO("text: " << text);
    CHECK(tok->decode(ids) == text);
    CHECK(tok->encode(text) == ids);
  }
  CHECK(tok->decode({50256}) == "<|endoftext|>");
  CHECK_THROWS_WITH(tok->decode({50257}), Contains("id 50257 at position 0"));
  // The encoder.json path itself also loads.
  CHECK(Tokenizer::load("gpt2", kData + "/gpt2_tokenizer/encoder.json")->vocab_size() == 50257);
}

TEST_CASE("GPT-2 encode reproduces the shipped validation shard section by section", "[tokenizer]") {
  // llm.c's shards: each "\n\n"-separated section is encoded separately, preceded by <|endoftext|>.
  auto tok = Tokenizer::load("gpt2", kData + "/gpt2_tokenizer");
  const auto ids = all_tokens(kData + "/tiny_shakespeare_val.bin");
  CHECK(tok->decode(std::vector<int32_t>(ids.begin(), ids.begin() + 5)).find("First Citizen") != std::string::npos);
  size_t i = 0, sections = 0, mismatches = 0;
  while (i < ids.size()) {
    REQUIRE(ids[i] == 50256);
    size_t j = i + 1;
    while (j < ids.size() && ids[j] != 50256) ++j;
    const std::vector<int32_t> sec(ids.begin() + i + 1, ids.begin() + j);
    if (j < ids.size()) {  // the split cut the last section: compare complete ones only
      if (tok->encode(tok->decode(sec)) != sec) ++mismatches;
      ++sections;
    }
    i = j;
  }
  CHECK(sections > 500);
  CHECK(mismatches == 0);
}

namespace {

std::string write_json(const test::ScratchDir& dir, const std::string& name, const nlohmann::json& j) {
  test::put(dir.file(name), j.dump());
  return dir.file(name);
}

}  // namespace

TEST_CASE("GPT-2 encode refuses invalid UTF-8 with the byte offset", "[tokenizer]") {
  auto tok = Tokenizer::load("gpt2", kData + "/gpt2_tokenizer");
  const std::pair<std::string, size_t> cases[] = {
      {"ab\xff" "cd", 2}, {"abc\xe2\x82", 3}, {"x\xc0\xaf", 1}, {"ok \xed\xa0\x80", 3}, {"\x80", 0}, {"é\xf5\x80\x80\x80", 2}};
  for (const auto& [text, offset] : cases) {
    INFO("offset " << offset);
    try {
      (void)tok->encode(text);
      FAIL("no error");
    } catch (const EncodeError& e) {
      CHECK(e.byte_offset == offset);
      CHECK_THAT(e.what(), Contains("invalid UTF-8 at byte offset " + std::to_string(offset)));
      CHECK_THAT(e.reason, Contains("invalid UTF-8"));
    }
  }
  CHECK(tok->encode("\xc3\xa9") == std::vector<int32_t>{2634});  // é
}

TEST_CASE("tokenizer.json byte-level BPE equals the GPT-2 tokenizer", "[tokenizer]") {
  test::ScratchDir dir;
  auto gpt2 = Tokenizer::load("gpt2", kData + "/gpt2_tokenizer");
  const std::string text = test::slurp(kData + "/tinyshakespeare.txt").substr(0, 200000) +
                           test::slurp(std::string(MFSDP_SOURCE_DIR) + "/tests/data/unicode_stress.txt");
  const auto expected = gpt2->encode(text);
  REQUIRE(expected.size() > 40000);
  // GPT-2's own layout: ByteLevel with its built-in regex, merges as "a b" strings.
  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  auto a = Tokenizer::load("tokenizer.json", write_json(dir, "a.json", test::gpt2_as_tokenizer_json(kData, byte_level, false)));
  CHECK(a->kind() == "tokenizer.json");
  CHECK(a->vocab_size() == 50257);
  CHECK(a->token_id("<|endoftext|>") == 50256);
  CHECK(a->encode(text) == expected);
  // Llama-3's layout: Split(Regex, Isolated) then ByteLevel without regex, merges as pairs; an added
  // token beyond the model vocabulary.
  const nlohmann::json split = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", kGpt2Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  auto bj = test::gpt2_as_tokenizer_json(kData, split, true);
  bj["added_tokens"].push_back({{"id", 50257}, {"content", "<|extra|>"}, {"special", true}});
  auto b = Tokenizer::load("tokenizer.json", write_json(dir, "b.json", bj));
  CHECK(b->vocab_size() == 50258);
  CHECK(b->encode(text) == expected);
  CHECK(b->token_id("<|extra|>") == 50257);
  CHECK(b->decode({50257, 15496}) == "<|extra|>Hello");
  CHECK(b->encode("<|extra|>") == gpt2->encode("<|extra|>"));  // added tokens are not matched in text
}

TEST_CASE("tokenizer.json ignore_merges emits whole-word tokens; unsupported features are refused", "[tokenizer]") {
  test::ScratchDir dir;
  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  // " Hello" is id 18435 in GPT-2; with ignore_merges a pre-token found in the vocabulary is used as is,
  // which only differs from merging for words whose merges do not lead to their own entry. Here the
  // merges are cut to the first 1000, so merging alone cannot reach " Hello".
  auto j = test::gpt2_as_tokenizer_json(kData, byte_level, false);
  j["model"]["merges"].erase(j["model"]["merges"].begin() + 1000, j["model"]["merges"].end());
  auto plain = Tokenizer::load("tokenizer.json", write_json(dir, "p.json", j));
  CHECK(plain->encode(" Hello").size() > 1);
  j["model"]["ignore_merges"] = true;
  auto whole = Tokenizer::load("tokenizer.json", write_json(dir, "w.json", j));
  CHECK(whole->encode(" Hello") == std::vector<int32_t>{18435});
  CHECK(whole->encode(" Hello!") == std::vector<int32_t>{18435, 0});

  auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& message) {
    auto k = test::gpt2_as_tokenizer_json(kData, byte_level, false);
    edit(k);
    INFO(message);
    CHECK_THROWS_WITH(Tokenizer::load("tokenizer.json", write_json(dir, "r.json", k)),
                      Contains(message) && Contains("r.json"));
  };
  refused([](auto& k) { k["normalizer"] = {{"type", "NFC"}}; }, "a normalizer is not supported");
  refused([](auto& k) { k["model"]["type"] = "Unigram"; }, "model type 'Unigram' is not supported");
  refused([](auto& k) { k["model"]["byte_fallback"] = true; }, "byte_fallback is not supported");
  refused([](auto& k) { k["model"]["continuing_subword_prefix"] = "##"; }, "continuing_subword_prefix is not supported");
  refused([](auto& k) { k["pre_tokenizer"] = {{"type", "Metaspace"}}; }, "pre_tokenizer");
  refused([](auto& k) { k["pre_tokenizer"]["add_prefix_space"] = true; }, "add_prefix_space=true is not supported");
  refused([](auto& k) { k["decoder"] = {{"type", "WordPiece"}}; }, "decoder 'WordPiece' is not supported");
  refused([](auto& k) { k["model"]["merges"][0] = "a b c"; }, "malformed merge 'a b c'");
  refused([](auto& k) { k["model"]["vocab"]["Ā"] = 50257; }, "id of 'Ā' is not an integer in [0, number of entries)");
  // An added token's id sizes the added-token table: refused (before any allocation) beyond the
  // vocabulary plus the added tokens; 2^31 - 1 would ask for 2^31 strings.
  refused([](auto& k) { k["added_tokens"] = {{{"id", 2147483647}, {"content", "<|far|>"}}}; },
          "added token '<|far|>' has id 2147483647, beyond the 50258 ids");
  refused([](auto& k) { k["added_tokens"] = {{{"id", 50258}, {"content", "<|gap|>"}}}; }, "has id 50258, beyond the 50258 ids");
  refused(
      [](auto& k) {
        k["pre_tokenizer"] = {{"type", "Sequence"},
                              {"pretokenizers",
                               {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
                                {{"type", "ByteLevel"}, {"use_regex", false}}}}};
      },
      "does not compile");
}
