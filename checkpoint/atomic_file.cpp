#include "checkpoint/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <stdexcept>

namespace mfsdp {

bool sync_path(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

void write_file_atomic(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  std::error_code ec;
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error(tmp.string() + ": cannot open for writing");
    f << text;
    f.flush();
    f.close();
    if (!f) {
      std::filesystem::remove(tmp, ec);
      throw std::runtime_error(path.string() + ": write failed (disk full?)");
    }
  }
  if (!sync_path(tmp)) {
    std::filesystem::remove(tmp, ec);
    throw std::runtime_error(tmp.string() + ": fsync failed");
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw std::runtime_error(path.string() + ": rename failed: " + ec.message());
}

}  // namespace mfsdp
