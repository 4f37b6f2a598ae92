// safetensors: round trips and corrupted files.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "tests/scratch_dir.h"
#include "runtime/core/dtype.h"

using namespace mfsdp;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

struct Scratch : mfsdp::testing::ScratchDir {
  Scratch() : ScratchDir("mfsdp_st_test") {}
};

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void spit(const std::string& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file with the given JSON header text and `data_bytes` zero bytes of data.
std::string make_file(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data_bytes, '\0');
}

}  // namespace

TEST_CASE("safetensors round trip: f32, bf16, i32, i64, empty tensor, metadata", "[safetensors]") {
  Scratch s;
  const std::string p = s.file("a.safetensors");
  std::vector<float> w = {1.5f, -2.25f, 3.0f, 1e-30f, -0.0f, 7.0f};
  std::vector<uint16_t> h = {float_to_bf16(1.0f).bits, float_to_bf16(-3.5f).bits, float_to_bf16(0.15625f).bits};
  std::vector<int32_t> ids = {7, -1, 2147483647};
  std::vector<int64_t> big = {int64_t{1} << 40, -5};
  write_safetensors(p,
                    {{"w", "F32", {2, 3}, w.data()},
                     {"h", "BF16", {3}, h.data()},
                     {"ids", "I32", {3}, ids.data()},
                     {"big", "I64", {2}, big.data()},
                     {"empty", "F32", {0, 4}, nullptr}},
                    {{"format", "test"}, {"step", "12"}});
  CHECK(!fs::exists(p + ".tmp"));
  SafetensorsFile f(p);
  CHECK(f.names() == std::vector<std::string>{"w", "h", "ids", "big", "empty"});
  CHECK(f.info("w").shape == std::vector<int64_t>{2, 3});
  CHECK(f.info("w").dtype == "F32");
  CHECK(f.info("h").begin == 24);
  CHECK(f.read_f32("w") == w);
  CHECK(std::signbit(f.read_f32("w")[4]));
  CHECK(f.read_f32("h") == std::vector<float>{1.0f, -3.5f, 0.15625f});
  CHECK(f.read_i32("ids") == ids);
  CHECK(f.read_i64("big") == big);
  CHECK(f.read_f32("empty").empty());
  CHECK(f.raw("ids").size() == 12);
  CHECK(f.metadata().at("format") == "test");
  CHECK(f.metadata().at("step") == "12");
  CHECK_THROWS_WITH(f.read_i32("w"), Contains("tensor 'w' has dtype F32 (expected I32)"));
  CHECK_THROWS_WITH(f.info("nope"), Contains(p) && Contains("no tensor named 'nope'"));
  // Header length is a multiple of 8 so the data block is aligned; the JSON parses standalone.
  const std::string bytes = slurp(p);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  CHECK((8 + n) % 8 == 0);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  CHECK(header["w"]["data_offsets"] == nlohmann::json::array({0, 24}));
  CHECK(header["__metadata__"]["format"] == "test");
}

TEST_CASE("safetensors writer refuses bad requests", "[safetensors]") {
  Scratch s;
  float x = 1;
  CHECK_THROWS_WITH(write_safetensors(s.file("b"), {{"a", "F32", {1}, &x}, {"a", "F32", {1}, &x}}),
                    Contains("duplicate tensor name 'a'"));
  CHECK_THROWS_WITH(write_safetensors(s.file("b"), {{"a", "Q4", {1}, &x}}), Contains("unknown dtype 'Q4'"));
  CHECK_THROWS_WITH(write_safetensors(s.file("b"), {{"__metadata__", "F32", {1}, &x}}), Contains("invalid tensor name"));
  CHECK_THROWS_WITH(write_safetensors(s.file("b"), {{"a", "F32", {2}, nullptr}}), Contains("null data pointer"));
  CHECK_THROWS_WITH(write_safetensors(s.dir.string() + "/no/such/dir/f", {}), Contains("cannot create"));
}

TEST_CASE("safetensors reader refuses corrupted files, naming file and tensor", "[safetensors]") {
  Scratch s;
  const std::string good = s.file("good.safetensors");
  std::vector<float> a(4, 1.0f), b(2, 2.0f);
  write_safetensors(good, {{"a", "F32", {4}, a.data()}, {"b", "F32", {2}, b.data()}});
  const std::string bytes = slurp(good);
  const std::string p = s.file("bad.safetensors");

  SECTION("truncated data block") {
    spit(p, bytes.substr(0, bytes.size() - 4));
    CHECK_THROWS_WITH(SafetensorsFile(p), Contains(p) && Contains("tensor 'b'") && Contains("outside the data block"));
  }
  SECTION("shorter than the length field") {
    spit(p, bytes.substr(0, 5));
    CHECK_THROWS_WITH(SafetensorsFile(p), Contains("too short"));
  }
  SECTION("header length larger than the file") {
    std::string c = bytes;
    const uint64_t n = 1u << 20;
    std::memcpy(c.data(), &n, 8);
    spit(p, c);
    CHECK_THROWS_WITH(SafetensorsFile(p), Contains("header length 1048576 exceeds the file"));
  }
  SECTION("header is not JSON") {
    spit(p, make_file("{\"a\": [", 0));
    CHECK_THROWS_WITH(SafetensorsFile(p), Contains("header is not valid JSON"));
  }
  SECTION("offsets out of range") {
    spit(p, make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,80]}})", 8));
    CHECK_THROWS_WITH(SafetensorsFile(p), Contains("tensor 'a'") && Contains("data_offsets [0, 80] outside the data block of 8 bytes"));
  }
  SECTION("overlapping tensors") {
    spit(p, make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8));
    CHECK_THROWS_WITH(SafetensorsFile(p), Contains("overlaps"));
  }
  SECTION("gap in the data block") {
    spit(p, make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8));
    CHECK_THROWS_WITH(SafetensorsFile(p), Contains("tensor 'a' starts at byte 4, expected 0 (gap"));
  }
  SECTION("trailing bytes not covered by any tensor") {
    spit(p, make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8));
    CHECK_THROWS_WITH(SafetensorsFile(p), Contains("tensors cover 4 bytes of a 8-byte data block"));
  }
  SECTION("dtype x shape does not match the byte span") {
    spit(p, make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
    CHECK_THROWS_WITH(SafetensorsFile(p), Contains("tensor 'a': data_offsets span 8 bytes but F32 [3] needs 12"));
    spit(p, make_file(R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})", 8));
    CHECK_THROWS_WITH(SafetensorsFile(p), Contains("BF16 [2] needs 4"));
  }
  SECTION("unknown dtype, bad shape, missing fields") {
    spit(p, make_file(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8));
    CHECK_THROWS_WITH(SafetensorsFile(p), Contains("tensor 'a': unknown dtype 'Q4'"));
    spit(p, make_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8));
    CHECK_THROWS_WITH(SafetensorsFile(p), Contains("non-natural entry"));
    spit(p, make_file(R"({"a":{"dtype":"F32","shape":[2]}})", 8));
    CHECK_THROWS_WITH(SafetensorsFile(p), Contains("needs dtype, shape and data_offsets"));
    spit(p, make_file(R"({"__metadata__":{"k":1}})", 0));
    CHECK_THROWS_WITH(SafetensorsFile(p), Contains("__metadata__.k is not a string"));
  }
  SECTION("missing file") {
    CHECK_THROWS_WITH(SafetensorsFile(s.file("absent")), Contains("cannot open"));
  }
}
