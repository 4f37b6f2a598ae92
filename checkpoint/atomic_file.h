// Small files written so that a crash or a full disk never leaves a partial file in place.
#pragma once
#include <filesystem>
#include <string>

namespace mfsdp {

/// fsync of a file or a directory (a directory: to persist renames in it). False on failure.
bool sync_path(const std::filesystem::path& path);

/// Writes `text` to path.tmp (checked at write, flush and close; fsync'ed), then renames it to
/// `path`: the previous file stays as it was until the new one is complete, and a failed write
/// removes its temporary. Throws std::runtime_error naming the file ("disk full?" on a failed write).
void write_file_atomic(const std::filesystem::path& path, const std::string& text);

}  // namespace mfsdp
