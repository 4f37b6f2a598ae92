// The one place for two rules on the paths every tool reads and writes. Header-only: any layer
// may use it.
//   Inputs are regular files (or directories where a tool reads directories): a FIFO blocks its
//   reader until some writer appears, possibly forever, and a device file (/dev/zero) never ends.
//   Start-up checks refuse them by name from stat(2) alone (special_input_file); every read then
//   opens through open_input_file (O_NONBLOCK, fstat of the opened descriptor), so a path swapped
//   for a FIFO after the check is refused too instead of blocking in open(2).
//   Outputs are written under a unique temporary name in their own directory (SwapFile: created
//   with O_EXCL, each write, the fsync and the close checked), then renamed onto the final name:
//   an interrupted or failed write leaves the previous file as it was and never a partial one,
//   and no file of the user's is ever taken for a temporary.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <ctime>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mfsdp {

/// Why a file of mode `mode` (st_mode) at `path` must not be read: "" for a regular file (or a
/// directory when `allow_directory`), else "<path> is a FIFO (named pipe), not a regular file; ...".
inline std::string special_mode_problem(const std::string& path, mode_t mode, bool allow_directory) {
  if (S_ISREG(mode) || (allow_directory && S_ISDIR(mode))) return "";
  const char* kind = S_ISFIFO(mode)  ? "a FIFO (named pipe)"
                     : S_ISCHR(mode) ? "a character device"
                     : S_ISBLK(mode) ? "a block device"
                     : S_ISSOCK(mode) ? "a socket"
                     : S_ISDIR(mode)  ? "a directory"
                                      : "not a plain file";
  return path + " is " + kind + ", not a regular file; only regular files are read";
}

/// Why `path` must not be read as an input: "" when it is a regular file (symlinks followed), a
/// directory and `allow_directory`, or absent (the caller's own open reports a missing file).
/// Otherwise "<path> is a FIFO (named pipe), not a regular file" (or a character device, block
/// device, socket, directory). Uses stat(2) only; never opens the file.
inline std::string special_input_file(const std::string& path, bool allow_directory = false) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return "";
  return special_mode_problem(path, st.st_mode, allow_directory);
}

/// Throws Error("<what>: <special_input_file(path)>") when `path` is not a readable regular file
/// (or directory, when allowed). `Error` is the caller's error type (constructible from a string).
template <class Error = std::runtime_error>
void require_input_file(const std::string& path, const std::string& what, bool allow_directory = false) {
  const std::string problem = special_input_file(path, allow_directory);
  if (!problem.empty()) throw Error(what.empty() ? problem : what + ": " + problem);
}

/// Opens `path` for reading without ever blocking: open(2) with O_RDONLY | O_NONBLOCK (a FIFO
/// opens at once instead of waiting for a writer), then fstat(2) of the opened descriptor refuses
/// anything but a regular file (a directory too when `allow_directory`), then O_NONBLOCK is
/// cleared. Returns the descriptor; the caller closes it. Throws Error("<what>: <path> is a FIFO
/// ...") or Error("<what>: cannot open <path>: <reason>") (no "<what>: " when `what` is empty).
template <class Error = std::runtime_error>
int open_input_file(const std::string& path, const std::string& what, bool allow_directory = false) {
  const std::string pre = what.empty() ? "" : what + ": ";
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error(pre + "cannot open " + path + ": " + std::strerror(errno));
  struct stat st{};
  std::string problem = ::fstat(fd, &st) != 0 ? path + ": cannot stat: " + std::strerror(errno)
                                              : special_mode_problem(path, st.st_mode, allow_directory);
  const int flags = problem.empty() ? ::fcntl(fd, F_GETFL) : 0;
  if (problem.empty() && (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0))
    problem = path + ": cannot clear O_NONBLOCK: " + std::strerror(errno);
  if (!problem.empty()) {
    ::close(fd);
    throw Error(pre + problem);
  }
  return fd;
}

/// The bytes of regular file `path` from `offset` on, at most `max_bytes` of them (read through
/// open_input_file, so a FIFO or device is refused by name and nothing blocks). With
/// `whole` the file must not be longer than offset + max_bytes (Error "<path>: <size> bytes, larger
/// than the <max> read"). Throws Error naming the path on any failure (`what` as in open_input_file).
template <class Error = std::runtime_error>
std::string read_input_file(const std::string& path, const std::string& what, size_t max_bytes = SIZE_MAX,
                            bool whole = true, uint64_t offset = 0) {
  const std::string pre = what.empty() ? "" : what + ": ";
  const int fd = open_input_file<Error>(path, what);
  struct stat st{};
  ::fstat(fd, &st);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const uint64_t avail = size > offset ? size - offset : 0;
  if (whole && avail > max_bytes) {
    ::close(fd);
    throw Error(pre + path + ": " + std::to_string(size) + " bytes, larger than the " + std::to_string(max_bytes) +
                " bytes read from it");
  }
  std::string out;
  try {
    out.resize(static_cast<size_t>(avail < max_bytes ? avail : max_bytes));
  } catch (const std::exception&) {
    ::close(fd);
    throw Error(pre + path + ": " + std::to_string(size) + " bytes do not fit in memory");
  }
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the file shrank (or a read error, reported below)
    got += static_cast<size_t>(n);
  }
  const int err = errno;
  ::close(fd);
  if (got != out.size()) throw Error(pre + "cannot read " + path + ": " + (err ? std::strerror(err) : "file shrank"));
  return out;
}

namespace detail {
// A fresh, process-unique random tag for temporary names (hex).
inline std::string temp_tag() {
  static thread_local std::mt19937_64 gen{std::random_device{}() ^ (static_cast<uint64_t>(::getpid()) << 32)};
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(gen()));
  return buf;
}
}  // namespace detail

/// Whether `name` (a file name, no directory) has the form of a temporary that SwapFile made for a
/// file named `target`: ".<target>.tmp-<pid digits>-<16 hex digits>". Stale-temporary cleanup
/// removes only such names, so a user's own "<target>.tmp" is never touched.
inline bool is_temp_name_of(const std::string& name, const std::string& target) {
  const std::string head = "." + target + ".tmp-";
  if (name.size() < head.size() + 18 || name.compare(0, head.size(), head) != 0) return false;
  const std::string rest = name.substr(head.size());
  const size_t dash = rest.find('-');
  if (dash == 0 || dash == std::string::npos || rest.size() - dash - 1 != 16) return false;
  for (size_t i = 0; i < rest.size(); ++i)
    if (i < dash ? !(rest[i] >= '0' && rest[i] <= '9')
                 : i > dash && !((rest[i] >= '0' && rest[i] <= '9') || (rest[i] >= 'a' && rest[i] <= 'f')))
      return false;
  return true;
}

/// Removes the temporaries that earlier writers of `path` left beside it (is_temp_name_of: a
/// process killed inside a write-then-swap), but only those that are surely abandoned: their
/// writer's pid runs no process on this host (kill(pid, 0) fails with ESRCH) and nobody has
/// written to them for `min_idle_seconds` (a writer on another host sharing the directory keeps
/// its temporary fresh, and its pid means nothing here). Anything else, and every other name, is
/// kept. Returns the paths removed. Never throws.
inline std::vector<std::string> remove_abandoned_temporaries(const std::string& path, double min_idle_seconds = 600) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  std::error_code ec;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string target = p.filename().string();
  const auto head = "." + target + ".tmp-";
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!is_temp_name_of(name, target) || !it->is_regular_file(ec)) continue;
    const long long pid = std::atoll(name.c_str() + head.size());
    const bool running = pid <= 0 || pid > INT32_MAX || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH;
    struct stat st{};
    if (running || ::lstat(it->path().c_str(), &st) != 0) continue;
    if (static_cast<double>(::time(nullptr) - st.st_mtime) < min_idle_seconds) continue;
    if (fs::remove(it->path(), ec)) removed.push_back(it->path().string());
  }
  return removed;
}

/// Creates a temporary file beside `path`, "<dir>/.<name>.tmp-<pid>-<random>", with O_EXCL (no
/// other writer, and no existing file, can be taken) and mode 0644; returns its descriptor and
/// sets `tmp`. Throws std::runtime_error naming `path` when the directory takes no new file.
inline int create_temp_fd(const std::string& path, std::string& tmp) {
  const std::filesystem::path p(path);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() + "/" : "";
  for (int tries = 0; tries < 100; ++tries) {
    tmp = dir + "." + p.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" + detail::temp_tag();
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    if (errno != EEXIST) throw std::runtime_error(path + ": cannot create a file beside it: " + std::strerror(errno));
  }
  throw std::runtime_error(path + ": no free temporary name beside it");
}

/// An empty temporary beside `path` (create_temp_fd), closed; the caller renames or removes it.
inline std::string create_temp_beside(const std::string& path) {
  std::string tmp;
  ::close(create_temp_fd(path, tmp));
  return tmp;
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

/// fsync of a file or a directory (a directory: to persist renames in it, as SwapFile::commit
/// does). Opens with O_NONBLOCK, so it never waits on a FIFO. False on failure.
inline bool sync_path(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

/// One output file written by write-then-swap, the only way the project writes a file in place of
/// another. The constructor creates the temporary (create_temp_fd); write() appends (every byte
/// checked, EINTR retried); commit() fsyncs and closes it (finish()), renames it onto the target
/// and fsyncs the directory. Any failure, and destruction without commit(), removes the temporary and leaves
/// the target as it was. Errors are std::runtime_error naming the target and the reason ("disk
/// full?" on a failed write).
class SwapFile {
 public:
  explicit SwapFile(std::string path) : path_(std::move(path)) { fd_ = create_temp_fd(path_, tmp_); }
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;
  ~SwapFile() { discard(); }

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

  void write(const void* data, size_t n) {
    if (fd_ < 0) fail("written after finish()", EBADF);
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("write failed (disk full?)", w < 0 ? errno : ENOSPC);
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  void write(const std::string& text) { write(text.data(), text.size()); }

  /// Makes the temporary complete and durable (fsync, close) without renaming it; commit() renames.
  /// For outputs that must all be complete before any of them replaces its target.
  void finish() {
    if (fd_ < 0) return;
    if (::fsync(fd_) != 0) fail("fsync failed (disk full?)", errno);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("close failed (disk full?)", errno);
  }

  void commit() {
    finish();
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename " + tmp_ + " onto it", errno);
    tmp_.clear();
    const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
    sync_path(parent.empty() ? "." : parent);  // persists the rename; the file itself is already complete
  }

  /// Removes the temporary (nothing when committed or already discarded).
  void discard() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!tmp_.empty()) std::remove(tmp_.c_str());
    tmp_.clear();
  }

 private:
  [[noreturn]] void fail(const std::string& what, int err) {
    discard();
    throw std::runtime_error(path_ + ": " + what + ": " + std::strerror(err));
  }

  std::string path_, tmp_;
  int fd_ = -1;
};

/// Writes `text` to `path` through a SwapFile: complete or not at all; std::runtime_error naming
/// the path on failure, with no temporary left and `path` unchanged.
inline void write_file_swap(const std::string& path, const std::string& text) {
  SwapFile f(path);
  f.write(text);
  f.commit();
}

}  // namespace mfsdp
