// Write-then-swap outputs (SwapFile, write_file_swap, write_safetensors), the temporaries' names and
// their cleanup rule, partial checkpoint directories, and inputs opened without blocking
// (open_input_file / read_input_file; a FIFO or device refused by name).
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>

#include "checkpoint/owner_checkpoint.h"
#include "checkpoint/safetensors.h"
#include "runtime/core/file_checks.h"
#include "tests/scratch_dir.h"

using namespace mfsdp;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

struct Scratch : mfsdp::testing::ScratchDir {
  Scratch() : ScratchDir("mfsdp_file_io_test") {}
};

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void spit(const std::string& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// Files may grow to `bytes` at most while alive (RLIMIT_FSIZE; SIGXFSZ ignored so a write past it
// fails with EFBIG, as on a full disk). Works for root too, unlike a read-only directory.
struct FileSizeLimit {
  rlimit old{};
  void (*old_handler)(int);
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old);
    old_handler = std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old;
    lim.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
  }
};

}  // namespace

TEST_CASE("temporaries have their own names: a user's <path>.tmp survives every writer", "[files]") {
  Scratch s;
  const std::string p = s.file("model.safetensors"), j = s.file("out.json");
  spit(p + ".tmp", "the user's own file");
  spit(j + ".tmp", "another file of the user's");
  const std::vector<float> w = {1.f, 2.f, 3.f};
  write_safetensors(p, {{"w", "F32", {3}, w.data()}});
  write_file_swap(j, "{}\n");
  CHECK(slurp(p + ".tmp") == "the user's own file");
  CHECK(slurp(j + ".tmp") == "another file of the user's");
  CHECK(SafetensorsFile(p).read_f32("w") == w);
  CHECK(slurp(j) == "{}\n");
  CHECK(names_in(s.dir) == std::set<std::string>{"model.safetensors", "model.safetensors.tmp", "out.json", "out.json.tmp"});
  // The temporary's name: ".<name>.tmp-<pid>-<16 hex>", created with O_EXCL, unique per call.
  const std::string t1 = create_temp_beside(j), t2 = create_temp_beside(j);
  CHECK(t1 != t2);
  CHECK(is_temp_name_of(fs::path(t1).filename().string(), "out.json"));
  CHECK(fs::path(t1).parent_path() == s.dir);
}

TEST_CASE("is_temp_name_of matches only the SwapFile pattern of its target", "[files]") {
  CHECK(is_temp_name_of(".config.json.tmp-123-0123456789abcdef", "config.json"));
  CHECK(is_temp_name_of(".latest.tmp-9-ffffffffffffffff", "latest"));
  CHECK_FALSE(is_temp_name_of("config.json.tmp", "config.json"));                // a user's name
  CHECK_FALSE(is_temp_name_of(".config.json.tmp", "config.json"));
  CHECK_FALSE(is_temp_name_of(".config.json.tmp-123-0123456789abcde", "config.json"));   // 15 hex
  CHECK_FALSE(is_temp_name_of(".config.json.tmp-12a-0123456789abcdef", "config.json"));  // pid not digits
  CHECK_FALSE(is_temp_name_of(".config.json.tmp--0123456789abcdef", "config.json"));
  CHECK_FALSE(is_temp_name_of(".config.json.tmp-1-0123456789ABCDEF", "config.json"));
  CHECK_FALSE(is_temp_name_of(".summary.json.tmp-123-0123456789abcdef", "config.json"));
}

TEST_CASE("a failed write leaves the old target and no temporary", "[files]") {
  Scratch s;
  const std::string p = s.file("rank_00000.safetensors"), j = s.file("summary.json");
  spit(p, "old checkpoint bytes");
  spit(j, "old summary");
  SECTION("the write fails part way (file size limit, as a full disk)") {
    const std::vector<float> big(1 << 18, 1.5f);  // 1 MiB
    {
      FileSizeLimit limit(64 << 10);
      CHECK_THROWS_WITH(write_safetensors(p, {{"w", "F32", {1 << 18}, big.data()}}),
                        Contains(p) && Contains("write failed (disk full?)"));
      CHECK_THROWS_WITH(write_file_swap(j, std::string(1 << 20, 'x')), Contains(j) && Contains("disk full?"));
    }
  }
  SECTION("the directory does not exist (its parent is a file)") {
    const std::string q = s.file("summary.json/x.json");
    CHECK_THROWS_WITH(write_file_swap(q, "{}"), Contains(q) && Contains("cannot create a file beside it"));
    CHECK_THROWS_WITH(write_safetensors(s.file("summary.json/y.safetensors"), {}), Contains("y.safetensors"));
  }
  SECTION("the target is a directory with files: the rename fails") {
    fs::create_directory(s.file("d.json"));
    spit(s.file("d.json/inside"), "kept");
    CHECK_THROWS_WITH(write_file_swap(s.file("d.json"), "{}"), Contains("d.json") && Contains("cannot rename"));
    CHECK(slurp(s.file("d.json/inside")) == "kept");
    fs::remove_all(s.file("d.json"));
  }
  SECTION("a SwapFile dropped before commit") {
    SwapFile f(j);
    f.write("partial");
    CHECK(fs::exists(f.temp_path()));
  }
  CHECK(slurp(p) == "old checkpoint bytes");
  CHECK(slurp(j) == "old summary");
  CHECK(names_in(s.dir) == std::set<std::string>{"rank_00000.safetensors", "summary.json"});
}

TEST_CASE("a step_N.tmp directory is removed only when it holds what a save writes", "[files]") {
  Scratch s;
  const std::string d = s.file("step_00000004.tmp");
  CHECK(foreign_partial_checkpoint(d).empty());  // absent
  fs::create_directory(d);
  CHECK(foreign_partial_checkpoint(d).empty());  // empty
  for (const char* n : {"rank_00000.safetensors", "rank_00001.safetensors", "manifest.json",
                        ".rank_00002.safetensors.tmp-77-0123456789abcdef", ".manifest.json.tmp-5-fedcba9876543210"})
    spit(d + "/" + n, "x");
  CHECK(foreign_partial_checkpoint(d).empty());
  for (const char* n : {"notes.txt", "manifest.json.tmp", ".manifest.json.tmp-5-xyz", "rank_0000a.safetensors", "rank_.safetensors"}) {
    INFO(n);
    spit(d + "/" + n, "the user's");
    CHECK_THAT(foreign_partial_checkpoint(d), Contains(d) && Contains(std::string(n) + ", which no checkpoint save writes"));
    fs::remove(d + "/" + n);
  }
  fs::create_directory(d + "/sub");
  CHECK_THAT(foreign_partial_checkpoint(d), Contains("sub"));
  const std::string f = s.file("step_00000008.tmp");
  spit(f, "a file, not a directory");
  CHECK_THAT(foreign_partial_checkpoint(f), Contains("is not a directory"));
}

TEST_CASE("files claiming more than their reader takes are refused before any allocation", "[files]") {
  Scratch s;
  // Sparse files: the size is claimed, no bytes are stored. A manifest over 1 GiB is refused from
  // fstat(2), before its text is read (reading it first would allocate the 4 GiB).
  fs::create_directory(s.file("step_00000001"));
  const std::string manifest = s.file("step_00000001/manifest.json");
  spit(manifest, "{\n");
  fs::resize_file(manifest, (uint64_t{4} << 30));
  CHECK_THROWS_WITH(CheckpointManifest::read(s.file("step_00000001")),
                    Contains(manifest) && Contains("4294967296 bytes, larger than the 1073741824 bytes"));
  spit(s.file("big"), "x");
  fs::resize_file(s.file("big"), uint64_t{1} << 40);
  CHECK_THROWS_WITH(read_input_file(s.file("big"), "cfg", size_t{64} << 20), Contains("1099511627776 bytes, larger than"));
}

TEST_CASE("inputs open without blocking: a FIFO or a device is refused by name at once", "[files]") {
  Scratch s;
  const std::string fifo = s.file("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  // No writer ever opens the FIFO: a blocking open(2) would wait here forever (the ctest timeout).
  CHECK_THROWS_WITH(read_input_file(fifo, "data.train"),
                    Contains("data.train: " + fifo + " is a FIFO (named pipe), not a regular file"));
  CHECK_THROWS_WITH(open_input_file(fifo, ""), Contains(fifo + " is a FIFO"));
  CHECK_THROWS_WITH(SafetensorsFile{fifo}, Contains(fifo) && Contains("FIFO"));
  CHECK_THROWS_WITH(read_input_file("/dev/zero", "x"), Contains("/dev/zero is a character device"));
  CHECK_THROWS_WITH(read_input_file(s.dir.string(), "x"), Contains("is a directory"));
  CHECK_THROWS_WITH(read_input_file(s.file("absent"), "x"), Contains("cannot open " + s.file("absent")));
  // A regular file: read whole, bounded, or from an offset; the descriptor is blocking again.
  spit(s.file("f"), "0123456789");
  CHECK(read_input_file(s.file("f"), "") == "0123456789");
  CHECK(read_input_file(s.file("f"), "", 4, false) == "0123");
  CHECK(read_input_file(s.file("f"), "", 4, false, 8) == "89");
  CHECK_THROWS_WITH(read_input_file(s.file("f"), "cfg", 4), Contains("cfg: " + s.file("f") + ": 10 bytes, larger than"));
  const int fd = open_input_file(s.file("f"), "");
  CHECK((::fcntl(fd, F_GETFL) & O_NONBLOCK) == 0);
  ::close(fd);
}
