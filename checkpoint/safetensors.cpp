#include "checkpoint/safetensors.h"

#include "runtime/core/file_checks.h"
#include "runtime/core/json_limits.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/core/dtype.h"

namespace mfsdp {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FFu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

int64_t safetensors_dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  throw SafetensorsError("[safetensors] unknown dtype '" + d + "'");
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_safetensors(path, tensors, metadata, [&](size_t i) { return tensors[i].data; });
}

void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<const void*(size_t)>& data_of) {
  const std::string who = "[write_safetensors] " + path + ": ";
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  std::set<std::string> seen;
  std::vector<int64_t> sizes;
  int64_t offset = 0;
  for (const TensorView& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      throw SafetensorsError(who + "invalid tensor name '" + t.name + "'");
    if (!seen.insert(t.name).second) throw SafetensorsError(who + "duplicate tensor name '" + t.name + "'");
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) throw SafetensorsError(who + t.name + ": negative dimension in shape " + shape_str(t.shape));
      numel *= d;
    }
    const int64_t bytes = numel * safetensors_dtype_size(t.dtype);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    sizes.push_back(bytes);
    offset += bytes;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h += ' ';
  const uint64_t n = h.size();

  try {
    SwapFile f(path);
    f.write(&n, 8);
    f.write(h.data(), h.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const void* data = data_of(i);
      if (sizes[i] == 0) continue;
      if (data == nullptr) throw SafetensorsError(who + tensors[i].name + ": null data pointer");
      f.write(data, static_cast<size_t>(sizes[i]));
    }
    f.commit();
  } catch (const std::runtime_error& e) {
    throw SafetensorsError("[write_safetensors] " + std::string(e.what()));
  }
}

namespace {

// Maps `path` read-only; returns the mapping and sets `bytes`. Throws SafetensorsError (`who`
// names the file) when it cannot be opened, is not a regular file or is shorter than 8 bytes.
const uint8_t* map_file(const std::string& path, const std::string& who, int64_t& bytes) {
  const int fd = open_input_file<SafetensorsError>(path, "[safetensors]");  // a FIFO is refused, never waited on
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    const std::string e = std::strerror(errno);
    ::close(fd);
    throw SafetensorsError(who + "cannot stat: " + e);
  }
  bytes = static_cast<int64_t>(st.st_size);
  if (bytes < 8) {
    ::close(fd);
    throw SafetensorsError(who + "file has " + std::to_string(bytes) + " bytes, too short for the 8-byte header length");
  }
  void* m = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw SafetensorsError(who + "mmap failed: " + std::strerror(errno));
  return static_cast<const uint8_t*>(m);
}

// The JSON header of a mapped file of `bytes` bytes (bounded length and nesting, an object); sets
// `data_start` to the first byte after it.
nlohmann::json parse_header(const uint8_t* map, int64_t bytes, const std::string& who, int64_t& data_start) {
  uint64_t n;
  std::memcpy(&n, map, 8);
  if (n > kMaxHeaderBytes || n > static_cast<uint64_t>(bytes - 8))
    throw SafetensorsError(who + "header length " + std::to_string(n) + " exceeds the file (" + std::to_string(bytes) +
                           " bytes) or the 100 MiB limit");
  data_start = 8 + static_cast<int64_t>(n);
  if (json_nesting_depth(std::string_view(reinterpret_cast<const char*>(map) + 8, n)) > kMaxJsonDepth)
    throw SafetensorsError(who + "header is nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(map + 8, map + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    throw SafetensorsError(who + "header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw SafetensorsError(who + "header is not a JSON object");
  return header;
}

// One tensor entry `v` of the header: dtype, shape (bounded by the file's `file_bytes`) and
// data_offsets inside the data block, whose span must be the shape's bytes.
TensorInfo parse_tensor_entry(const std::string& name, const nlohmann::json& v, const std::string& who,
                              int64_t file_bytes, int64_t data_bytes) {
  const std::string tw = who + "tensor '" + name + "': ";
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
    throw SafetensorsError(tw + "entry needs dtype, shape and data_offsets");
  if (!v["dtype"].is_string()) throw SafetensorsError(tw + "dtype is not a string");
  TensorInfo t;
  t.name = name;
  t.dtype = v["dtype"].get<std::string>();
  int64_t esize;
  try {
    esize = safetensors_dtype_size(t.dtype);
  } catch (const SafetensorsError&) {
    throw SafetensorsError(tw + "unknown dtype '" + t.dtype + "'");
  }
  if (!v["shape"].is_array()) throw SafetensorsError(tw + "shape is not a list");
  int64_t numel = 1;
  for (const auto& d : v["shape"]) {
    if (!d.is_number_unsigned()) throw SafetensorsError(tw + "shape " + v["shape"].dump() + " has a non-natural entry");
    const uint64_t dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(file_bytes) || (dim > 0 && numel > file_bytes / static_cast<int64_t>(dim)))
      throw SafetensorsError(tw + "shape " + v["shape"].dump() + " is larger than the file");
    numel *= static_cast<int64_t>(dim);
    t.shape.push_back(static_cast<int64_t>(dim));
  }
  const auto& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    throw SafetensorsError(tw + "data_offsets must be two non-negative integers, got " + off.dump());
  const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
  if (b > e || e > static_cast<uint64_t>(data_bytes))
    throw SafetensorsError(tw + "data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                           "] outside the data block of " + std::to_string(data_bytes) + " bytes");
  t.begin = static_cast<int64_t>(b);
  t.end = static_cast<int64_t>(e);
  if (t.end - t.begin != numel * esize)
    throw SafetensorsError(tw + "data_offsets span " + std::to_string(t.end - t.begin) + " bytes but " + t.dtype + " " +
                           shape_str(t.shape) + " needs " + std::to_string(numel * esize));
  return t;
}

// Sorts `tensors` by offset and checks that they tile the data block exactly (no gap, no overlap).
void check_tiling(std::vector<TensorInfo>& tensors, int64_t data_bytes, const std::string& who) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  int64_t expect = 0;
  for (const TensorInfo& t : tensors) {
    if (t.begin != expect)
      throw SafetensorsError(who + "tensor '" + t.name + "' starts at byte " + std::to_string(t.begin) + ", expected " +
                             std::to_string(expect) + " (" +
                             (t.begin < expect ? "overlaps the previous tensor" : "gap in the data block") + ")");
    expect = t.end;
  }
  if (expect != data_bytes)
    throw SafetensorsError(who + "tensors cover " + std::to_string(expect) + " bytes of a " + std::to_string(data_bytes) +
                           "-byte data block");
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const std::string who = "[safetensors] " + path + ": ";
  map_ = map_file(path, who, map_bytes_);
  try {
    const nlohmann::json header = parse_header(map_, map_bytes_, who, data_start_);
    const int64_t data_bytes = map_bytes_ - data_start_;
    for (auto it = header.begin(); it != header.end(); ++it) {
      const auto& v = it.value();
      if (it.key() != "__metadata__") {
        tensors_.push_back(parse_tensor_entry(it.key(), v, who, map_bytes_, data_bytes));
        continue;
      }
      if (!v.is_object()) throw SafetensorsError(who + "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw SafetensorsError(who + "__metadata__." + m.key() + " is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
    }
    check_tiling(tensors_, data_bytes, who);
    for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(map_), static_cast<size_t>(map_bytes_));
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), static_cast<size_t>(map_bytes_));
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const TensorInfo& t : tensors_) out.push_back(t.name);
  return out;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw SafetensorsError("[safetensors] " + path_ + ": no tensor named '" + name + "'");
  return tensors_[it->second];
}

std::span<const uint8_t> SafetensorsFile::raw(const std::string& name) const {
  const TensorInfo& t = info(name);
  return {map_ + data_start_ + t.begin, static_cast<size_t>(t.end - t.begin)};
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const TensorInfo& t = info(name);
  const auto bytes = raw(name);
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == "F32") {
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  } else if (t.dtype == "BF16" || t.dtype == "F16") {
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      out[i] = t.dtype == "BF16" ? bf16_to_float(bf16{h}) : f16_to_float(h);
    }
  } else {
    throw SafetensorsError("[safetensors read_f32] " + path_ + ": tensor '" + name + "' has dtype " + t.dtype +
                           " (expected F32, BF16 or F16)");
  }
  return out;
}

std::vector<int32_t> SafetensorsFile::read_i32(const std::string& name) const {
  const TensorInfo& t = info(name);
  if (t.dtype != "I32")
    throw SafetensorsError("[safetensors read_i32] " + path_ + ": tensor '" + name + "' has dtype " + t.dtype +
                           " (expected I32)");
  const auto bytes = raw(name);
  std::vector<int32_t> out(static_cast<size_t>(t.numel()));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::vector<int64_t> SafetensorsFile::read_i64(const std::string& name) const {
  const TensorInfo& t = info(name);
  if (t.dtype != "I64")
    throw SafetensorsError("[safetensors read_i64] " + path_ + ": tensor '" + name + "' has dtype " + t.dtype +
                           " (expected I64)");
  const auto bytes = raw(name);
  std::vector<int64_t> out(static_cast<size_t>(t.numel()));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

}  // namespace mfsdp
