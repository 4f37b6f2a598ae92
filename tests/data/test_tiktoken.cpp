// Token-for-token equality of our GPT-2 encoder with tiktoken's encode_ordinary ("gpt2" encoding built
// from data/gpt2_tokenizer), and of our tokenizer.json loader with Hugging Face tokenizers on a
// Llama-3-style tokenizer.json, on Tiny Shakespeare, a hand-written Unicode stress text and each of
// its lines. Reference ids are made at test time by tests/data/reference_encode.py in the test
// virtual environment (scripts/test_venv.sh). Without it the test exits 77 (ctest: skipped).
#define CATCH_CONFIG_RUNNER
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/data/tokenizer.h"
#include "tests/data/test_util.h"

using namespace mfsdp;

namespace {

const std::string kData = MFSDP_DATA_DIR;
const std::string kSource = MFSDP_SOURCE_DIR;
nlohmann::json g_reference;  // file -> tiktoken ids
std::vector<std::string> g_files;

using test::slurp;

// Llama-3's pre-tokenizer regex (Split, Isolated).
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A Llama-3-style tokenizer.json (Split + ByteLevel, ignore_merges) over GPT-2's vocabulary and merges.
nlohmann::json llama3_style() {
  const nlohmann::json pre = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  // merges as "a b" strings: every tokenizers release reads them (pairs need tokenizers >= 0.20,
  // newer than what transformers < 4.45 pins in the test environment)
  auto j = test::gpt2_as_tokenizer_json(kData, pre, false);
  j["model"]["ignore_merges"] = true;
  return j;
}

// Writes the inputs, runs tiktoken on them; returns 0, or 77 when tiktoken is unavailable.
int make_reference(const test::ScratchDir& dir) {
  const char* env = std::getenv("MFSDP_TEST_PYTHON");
  const std::string python = env ? env : kSource + "/.venv-test/bin/python";
  if (::access(python.c_str(), X_OK) != 0) {
    std::printf("SKIP: %s not found; run scripts/test_venv.sh (needs PyPI) to compare with tiktoken\n", python.c_str());
    return 77;
  }
  g_files = {kData + "/tinyshakespeare.txt", kSource + "/tests/data/unicode_stress.txt"};
  std::istringstream lines(slurp(g_files[1]));
  std::string line;
  for (int k = 0; std::getline(lines, line); ++k) {
    const std::string p = dir.file("line_" + std::to_string(k) + ".txt");
    std::ofstream(p, std::ios::binary) << line << (k % 2 ? "" : "\n");
    g_files.push_back(p);
  }
  test::put(dir.file("llama3_style.json"), llama3_style().dump());
  std::string cmd = "'" + python + "' '" + kSource + "/tests/data/reference_encode.py' '" + kData + "/gpt2_tokenizer' '" +
                    dir.file("ref.json") + "' --hf '" + dir.file("llama3_style.json") + "'";
  for (const auto& f : g_files) cmd += " '" + f + "'";
  const int status = std::system(cmd.c_str());
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (rc == 77) {
    std::printf("SKIP: tiktoken or tokenizers is not installed in %s; run scripts/test_venv.sh\n", python.c_str());
    return 77;
  }
  if (rc != 0) {
    std::printf("reference_encode.py failed (exit %d)\n", rc);
    return 1;
  }
  g_reference = nlohmann::json::parse(slurp(dir.file("ref.json")));
  return 0;
}

}  // namespace

test::ScratchDir* g_dir = nullptr;

int main(int argc, char** argv) {
  test::ScratchDir dir;
  g_dir = &dir;
  if (const int rc = make_reference(dir); rc != 0) return rc;
  return Catch::Session().run(argc, argv);
}

TEST_CASE("GPT-2 encode equals tiktoken token for token", "[tiktoken]") {
  auto tok = Tokenizer::load("gpt2", kData + "/gpt2_tokenizer");
  REQUIRE(g_files.size() > 20);
  for (const auto& f : g_files) {
    const auto expected = g_reference.at("tiktoken").at(f).get<std::vector<int32_t>>();
    const std::string text = slurp(f);
    const auto got = tok->encode(text);
    size_t first = 0;
    while (first < got.size() && first < expected.size() && got[first] == expected[first]) ++first;
    INFO(f << ": first difference at token " << first << " of " << expected.size() << ", text near it: '"
           << tok->decode(std::vector<int32_t>(expected.begin() + static_cast<std::ptrdiff_t>(first),
                                               expected.begin() + static_cast<std::ptrdiff_t>(
                                                                      std::min(expected.size(), first + 8))))
           << "'");
    CHECK(got == expected);
    CHECK(tok->decode(got) == text);
  }
  CHECK(g_reference.at("tiktoken").at(g_files[0]).size() == 338025);  // Tiny Shakespeare in GPT-2 tokens (no <|endoftext|>)
}

TEST_CASE("tokenizer.json (Llama-3 layout) encode equals Hugging Face tokenizers", "[tiktoken]") {
  auto tok = Tokenizer::load("tokenizer.json", g_dir->file("llama3_style.json"));
  size_t total = 0;
  for (const auto& f : g_files) {
    const auto expected = g_reference.at("hf").at(f).get<std::vector<int32_t>>();
    INFO(f);
    const std::string text = slurp(f);
    CHECK(tok->encode(text) == expected);
    total += expected.size();
  }
  // Llama-3's pattern splits digits in threes (GPT-2 keeps the run of digits as one pre-token).
  auto gpt2 = Tokenizer::load("gpt2", kData + "/gpt2_tokenizer");
  std::vector<int32_t> threes;
  for (const char* part : {"123", "456", "7"})
    for (int32_t id : gpt2->encode(part)) threes.push_back(id);
  CHECK(tok->encode("1234567") == threes);
  CHECK(gpt2->encode("1234567") != threes);
  CHECK(total > 300000);
}
