// Tokenizers on the real data: char round trip over Tiny Shakespeare, GPT-2 reference cases.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/data/token_shards.h"
#include "runtime/data/tokenizer.h"

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
