// The safetensors file format (https://github.com/huggingface/safetensors), reader and writer.
//
// Layout: 8-byte little-endian u64 N, then N bytes of UTF-8 JSON header
//   {"<name>": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<string value>", ...}}
// (padded with spaces so the data block starts 8-byte aligned), then the data block; offsets are
// byte offsets relative to the start of the data block, row-major little-endian tensors.
// The reader is strict: the tensors must tile the data block exactly (sorted by begin, no gaps,
// no overlap, the last end == data block size), and end - begin == numel * dtype size.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace mfsdp {

/// A malformed or unreadable safetensors file, or a bad request (unknown tensor, wrong dtype).
/// Messages name the file and, where relevant, the tensor.
class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bytes per element of a safetensors dtype string ("F32" -> 4, "BF16" -> 2, "I64" -> 8, "BOOL" -> 1,
/// also F64 F16 I32 I16 I8 U64 U32 U16 U8 F8_E4M3 F8_E5M2). Throws SafetensorsError when unknown.
int64_t safetensors_dtype_size(const std::string& dtype);

/// A tensor to write: `data` points to numel(shape) * dtype size bytes (row-major, little-endian).
struct TensorView {
  std::string name;
  std::string dtype;  // "F32", "BF16", "I32", ...
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

/// Writes a safetensors file: `path.tmp` first, flushed and fsync'ed, then renamed to `path`
/// (a crash never leaves a partial file under `path`). Tensors are stored in the given order.
/// Throws SafetensorsError on duplicate or empty names, the reserved name "__metadata__", unknown
/// dtypes, negative dims, a null pointer for a non-empty tensor, or any I/O failure.
void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// The same, streaming: `tensors` gives names, dtypes and shapes (their `data` is not read), and
/// data_of(i) returns tensor i's bytes when the file reaches it, in order; the pointer need stay
/// valid only until the next call. Only one tensor's data is held at a time.
void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<const void*(size_t)>& data_of);

/// Header entry of one tensor.
struct TensorInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0;  ///< byte offset in the data block
  int64_t end = 0;
  int64_t numel() const;
};

/// A safetensors file opened read-only (memory-mapped), header validated on open.
class SafetensorsFile {
 public:
  /// Throws SafetensorsError naming the file when it cannot be opened or its header is invalid
  /// (file shorter than 8 bytes, N larger than the file, bad JSON, missing/ill-typed fields,
  /// unknown dtype, offsets out of range / overlapping / with gaps, byte size != numel x dtype).
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  /// Tensor names in data-block order.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  /// Throws SafetensorsError naming the file and tensor when absent.
  const TensorInfo& info(const std::string& name) const;
  /// The tensor's bytes (a view into the mapping, valid while this object lives).
  std::span<const uint8_t> raw(const std::string& name) const;
  /// Elements as f32: F32 copied, BF16 and F16 widened exactly. Other dtypes throw.
  std::vector<float> read_f32(const std::string& name) const;
  /// Elements of an I32 tensor. Other dtypes throw.
  std::vector<int32_t> read_i32(const std::string& name) const;
  /// Elements of an I64 tensor. Other dtypes throw.
  std::vector<int64_t> read_i64(const std::string& name) const;
  /// The "__metadata__" map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  const uint8_t* map_ = nullptr;
  int64_t map_bytes_ = 0;
  int64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace mfsdp
