#include "checkpoint/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

namespace mfsdp {

bool sync_path(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // never waits on a FIFO
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

}  // namespace mfsdp
