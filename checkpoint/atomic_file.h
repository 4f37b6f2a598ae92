// fsync of paths whose renames must persist. Files are written through SwapFile /
// write_file_swap (runtime/core/file_checks.h: a unique temporary beside the target, renamed onto it).
#pragma once
#include <filesystem>

namespace mfsdp {

/// fsync of a file or a directory (a directory: to persist renames in it). False on failure.
bool sync_path(const std::filesystem::path& path);

}  // namespace mfsdp
