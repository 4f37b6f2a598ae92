// A fresh temporary directory per object (named by process id and a counter), removed with its
// contents when the object goes away: file tests never see each other's files.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace mfsdp::testing {

struct ScratchDir {
  std::filesystem::path dir;
  explicit ScratchDir(const std::string& prefix) {
    static int n = 0;
    dir = std::filesystem::temp_directory_path() /
          (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  /// The path of file `name` inside the directory.
  std::string file(const std::string& name) const { return (dir / name).string(); }
};

}  // namespace mfsdp::testing
