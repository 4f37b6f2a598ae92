// Token shard format: header, size, vocabulary, glob, 32-bit variant.
#include <catch2/catch.hpp>
#include <filesystem>

#include "runtime/data/token_shards.h"
#include "tests/data/test_util.h"

using namespace mfsdp;
using mfsdp::test::ramp;
using mfsdp::test::ScratchDir;
using Catch::Matchers::Contains;

TEST_CASE("a valid 16-bit shard reads back its tokens", "[shards]") {
  ScratchDir dir;
  const std::string p = dir.file("a.bin");
  write_token_shard(p, ramp(1000, 65));
  REQUIRE(std::filesystem::file_size(p) == 1024 + 2 * 1000);
  TokenShard s(p);
  CHECK(s.width() == TokenWidth::u16);
  CHECK(s.num_tokens() == 1000);
  std::vector<int32_t> out(10);
  s.read(990, 10, out.data());
  for (int i = 0; i < 10; ++i) CHECK(out[i] == (990 + i) % 65);
  CHECK(s.max_token() == std::pair<int64_t, int64_t>{64, 64});
  CHECK_THROWS_WITH(s.read(995, 10, out.data()), Contains("tokens [995, 1005) out of range, shard has 1000"));
  const auto info = validate_shards(p, 65, 1000);
  REQUIRE(info.size() == 1);
  CHECK(info[0].num_tokens == 1000);
}

TEST_CASE("wrong magic is refused naming the file", "[shards]") {
  ScratchDir dir;
  const std::string p = dir.file("bad.bin");
  test::write_raw_shard(p, 12345, 1, 4, std::vector<uint8_t>(8, 0));
  CHECK_THROWS_AS(TokenShard(p), DataError);
  CHECK_THROWS_WITH(validate_shards(p, 65), Contains(p) && Contains("bad magic 12345") && Contains("20240520"));
}

TEST_CASE("wrong version is refused", "[shards]") {
  ScratchDir dir;
  const std::string p = dir.file("v2.bin");
  test::write_raw_shard(p, kShardMagicU16, 2, 4, std::vector<uint8_t>(8, 0));
  CHECK_THROWS_WITH(validate_shards(p, 65), Contains(p) && Contains("unsupported version 2"));
}

TEST_CASE("a truncated body or trailing bytes are refused", "[shards]") {
  ScratchDir dir;
  const std::string p = dir.file("t.bin");
  write_token_shard(p, ramp(100, 65));
  std::filesystem::resize_file(p, 1024 + 2 * 100 - 10);
  CHECK_THROWS_WITH(validate_shards(p, 65),
                    Contains(p) && Contains("header says 100 tokens (1224 bytes) but the file has 1214 bytes (truncated)"));
  std::filesystem::resize_file(p, 1024 + 2 * 100 + 2);
  CHECK_THROWS_WITH(validate_shards(p, 65), Contains("trailing bytes"));
  // Shorter than the header.
  std::filesystem::resize_file(p, 100);
  CHECK_THROWS_WITH(validate_shards(p, 65), Contains("shorter than the 1024-byte header"));
}

TEST_CASE("a shard shorter than one global batch says what it needs", "[shards]") {
  ScratchDir dir;
  const std::string p = dir.file("short.bin");
  write_token_shard(p, ramp(1000, 65));
  // B=4, T=64, A=3, W=2: 1536 + 1 tokens per global batch.
  CHECK_THROWS_WITH(validate_shards(p, 65, 4 * 64 * 3 * 2 + 1),
                    Contains(p) && Contains("has 1000 tokens") && Contains("needs 1537"));
}

TEST_CASE("token ids >= vocab_size are refused with their offset", "[shards]") {
  ScratchDir dir;
  const std::string p = dir.file("oov.bin");
  auto t = ramp(100, 65);
  t[37] = 70;
  write_token_shard(p, t);
  CHECK_THROWS_WITH(validate_shards(p, 65),
                    Contains(p) && Contains("token id 70 at token 37 (byte offset 1098) is >= vocab_size 65"));
  CHECK_NOTHROW(validate_shards(p, 71));
}

TEST_CASE("the 32-bit variant serves large vocabularies; 16-bit shards refuse them", "[shards]") {
  ScratchDir dir;
  CHECK(shard_width_for_vocab(65) == TokenWidth::u16);
  CHECK(shard_width_for_vocab(65535) == TokenWidth::u16);
  CHECK(shard_width_for_vocab(65536) == TokenWidth::u32);
  CHECK(shard_width_for_vocab(200000) == TokenWidth::u32);
  CHECK_THROWS_AS(shard_width_for_vocab(kMaxVocabU32 + 1), DataError);

  const std::string p32 = dir.file("big.bin");
  auto t = ramp(50, 1u << 20, 99990);  // ids 99990..100039
  write_token_shard(p32, t, TokenWidth::u32);
  REQUIRE(std::filesystem::file_size(p32) == 1024 + 4 * 50);
  TokenShard s(p32);
  CHECK(s.width() == TokenWidth::u32);
  std::vector<int32_t> out(50);
  s.read(0, 50, out.data());
  CHECK(out[0] == 99990);
  CHECK(out[49] == 100039);
  CHECK_NOTHROW(validate_shards(p32, 100040));
  CHECK_THROWS_WITH(validate_shards(p32, 100000), Contains("token id 100000 at token 10 (byte offset 1064)"));

  // A token that does not fit uint16 cannot be written to a 16-bit shard.
  CHECK_THROWS_WITH(write_token_shard(dir.file("x.bin"), {70000}, TokenWidth::u16), Contains("does not fit uint16"));
  // A vocabulary >= 65536 cannot be served by a 16-bit shard, whatever its tokens.
  const std::string p16 = dir.file("small.bin");
  write_token_shard(p16, ramp(10, 65));
  CHECK_THROWS_WITH(validate_shards(p16, 70000), Contains("does not fit the 16-bit shard format"));
}

TEST_CASE("globs expand sorted; no match is an error", "[shards]") {
  ScratchDir dir;
  write_token_shard(dir.file("s_002.bin"), ramp(30, 65));
  write_token_shard(dir.file("s_000.bin"), ramp(10, 65));
  write_token_shard(dir.file("s_001.bin"), ramp(20, 65));
  const auto info = validate_shards(dir.file("s_*.bin"), 65);
  REQUIRE(info.size() == 3);
  CHECK(info[0].num_tokens == 10);
  CHECK(info[1].num_tokens == 20);
  CHECK(info[2].num_tokens == 30);
  CHECK_THROWS_WITH(validate_shards(dir.file("none_*.bin"), 65), Contains("no file matches"));
  // One bad shard among good ones is named.
  test::write_raw_shard(dir.file("s_003.bin"), 7, 1, 0, {});
  CHECK_THROWS_WITH(validate_shards(dir.file("s_*.bin"), 65), Contains("s_003.bin") && Contains("bad magic 7"));
}

TEST_CASE("the shipped Tiny Shakespeare shards validate", "[shards]") {
  const std::string d = MFSDP_DATA_DIR;
  auto c = validate_shards(d + "/tiny_shakespeare_char_train.bin", 65);
  CHECK(c[0].num_tokens == 1003854);
  c = validate_shards(d + "/tiny_shakespeare_char_val.bin", 65);
  CHECK(c[0].num_tokens == 111540);
  auto g = validate_shards(d + "/tiny_shakespeare_*.bin", 50257);  // glob: GPT-2 train + val
  REQUIRE(g.size() == 4);  // the char shards match too (ids < 65 < 50257)
  CHECK(g[2].num_tokens == 305260);
  CHECK(g[3].num_tokens == 32768);
  CHECK_THROWS_WITH(validate_shards(d + "/tiny_shakespeare_train.bin", 65), Contains("is >= vocab_size 65"));
}
