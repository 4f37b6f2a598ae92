#include "checkpoint/checkpoint_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>

namespace mfsdp {
namespace fs = std::filesystem;

namespace {

std::mutex g_mutex;
std::map<std::string, int> g_held;  // canonical root -> descriptor holding its lock (until exit)

// The holder's record: what a refused job prints. At most 4 KiB is read back.
std::string holder_text(const std::string& run_dir) {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  char when[32] = {0};
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return "run directory " + (run_dir.empty() ? std::string("(none: logging.run_dir is not set)") : run_dir) +
         ", host " + (host[0] ? host : "?") + ", pid " + std::to_string(::getpid()) + ", since " + when;
}

std::string read_holder(int fd) {
  char buf[4096];
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::string text(buf, n > 0 ? static_cast<size_t>(n) : 0);
  for (char& c : text)
    if (c == '\n' || c == '\r' || static_cast<unsigned char>(c) < 0x20) c = ' ';
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text.empty() ? "holder not recorded yet" : text;
}

}  // namespace

std::string lock_checkpoint_root(const std::string& root, const std::string& run_dir) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (!fs::is_directory(root, ec)) return "";  // reported by the writability check
  const std::string key = fs::weakly_canonical(root, ec).string();
  const std::lock_guard<std::mutex> guard(g_mutex);
  if (g_held.count(key)) return "";
  const std::string path = (fs::path(root) / kCheckpointLockFile).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0 && errno == ELOOP)  // a link planted in place of the lock file must not disable the lock
    return root + ": " + path + " is a symbolic link; remove it (it is the checkpoint directory's lock)";
  if (fd < 0) return "";  // an unwritable directory is reported by the writability check
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return root + ": " + path + " is not a regular file; remove it (it is the checkpoint directory's lock)";
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const std::string holder = read_holder(fd);
    ::close(fd);
    return root + " is in use by another mfsdp-train job (" + holder + "; lock " + path +
           "); wait for that job to end, or use another checkpoint.dir";
  }
  const std::string text = holder_text(run_dir) + "\n";
  // A failed write leaves the lock held all the same; a refused job then says the holder is not recorded.
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, text.data(), text.size(), 0);
  g_held[key] = fd;  // stays open, and the lock held, until the process exits
  return "";
}

}  // namespace mfsdp
