// The one place for two rules on the paths every tool reads and writes. Header-only: any layer
// may use it.
//   Inputs are regular files (or directories where a tool reads directories): a FIFO blocks its
//   reader until some writer appears, possibly forever, and a device file (/dev/zero) never ends;
//   both are refused by name from stat(2) alone, without opening them.
//   Outputs are written under a unique temporary name in their own directory (each write, the
//   flush and the close checked), then renamed onto the final name: an interrupted or failed
//   write leaves the previous file as it was and never a partial one.
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace mfsdp {

/// Why `path` must not be read as an input: "" when it is a regular file (symlinks followed), a
/// directory and `allow_directory`, or absent (the caller's own open reports a missing file).
/// Otherwise "<path> is a FIFO (named pipe), not a regular file" (or a character device, block
/// device, socket, directory). Uses stat(2) only; never opens the file.
inline std::string special_input_file(const std::string& path, bool allow_directory = false) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return "";
  const auto mode = st.st_mode;
  if (S_ISREG(mode) || (allow_directory && S_ISDIR(mode))) return "";
  const char* kind = S_ISFIFO(mode)  ? "a FIFO (named pipe)"
                     : S_ISCHR(mode) ? "a character device"
                     : S_ISBLK(mode) ? "a block device"
                     : S_ISSOCK(mode) ? "a socket"
                     : S_ISDIR(mode)  ? "a directory"
                                      : "not a plain file";
  return path + " is " + kind + ", not a regular file; only regular files are read";
}

/// Throws Error("<what>: <special_input_file(path)>") when `path` is not a readable regular file
/// (or directory, when allowed). `Error` is the caller's error type (constructible from a string).
template <class Error = std::runtime_error>
void require_input_file(const std::string& path, const std::string& what, bool allow_directory = false) {
  const std::string problem = special_input_file(path, allow_directory);
  if (!problem.empty()) throw Error(what.empty() ? problem : what + ": " + problem);
}

/// A temporary name beside `path` ("<path>.tmp.<pid>.<n>") that no file has yet; created empty
/// (O_EXCL) so no other writer can take it. Throws std::runtime_error naming the directory when
/// it cannot be created there.
inline std::string create_temp_beside(const std::string& path) {
  static int counter = 0;
  for (int tries = 0; tries < 1000; ++tries) {
    const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::close(fd);
      return tmp;
    }
    if (errno != EEXIST) throw std::runtime_error(path + ": cannot create a file beside it: " + std::strerror(errno));
  }
  throw std::runtime_error(path + ": no free temporary name beside it");
}

/// "" when `path` can be written by write_file_swap (its directory exists and takes a new file,
/// and the path is not a directory), else why not, naming the path. Probes with a temporary that
/// it removes; the path itself is not touched.
inline std::string output_file_problem(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return path + ": is a directory, not a file name";
  try {
    const std::string tmp = create_temp_beside(path);
    std::remove(tmp.c_str());
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

/// Writes `text` to a temporary beside `path` (every write, flush, fsync and close checked),
/// then renames it onto `path`. On failure the temporary is removed, `path` is unchanged, and
/// std::runtime_error names the path and the reason ("disk full?" on a short write).
inline void write_file_swap(const std::string& path, const std::string& text) {
  const std::string tmp = create_temp_beside(path);
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) {
    const std::string e = std::strerror(errno);
    std::remove(tmp.c_str());
    throw std::runtime_error(path + ": cannot open " + tmp + " for writing: " + e);
  }
  bool ok = text.empty() || std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int write_errno = errno;
  ok = std::fflush(f) == 0 && ok;
  ok = ::fsync(::fileno(f)) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    throw std::runtime_error(path + ": write failed (disk full?): " + std::strerror(write_errno ? write_errno : errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string e = std::strerror(errno);
    std::remove(tmp.c_str());
    throw std::runtime_error(path + ": cannot rename " + tmp + " onto it: " + e);
  }
}

}  // namespace mfsdp
