// Element types and devices shared by every layer (the bottom of runtime/, below comm/ and planner/).
#pragma once
#include <cstdint>
#include <optional>
#include <cstring>
#include <stdexcept>
#include <string>

#include "runtime/core/name_table.h"

namespace mfsdp {

/// Element type of a tensor or communication buffer.
/// f32: IEEE binary32. bf16: bfloat16 storage (upper 16 bits of binary32), arithmetic is done in f32.
/// i32: token ids and other integer tensors (no arithmetic ops; collectives move it as raw bytes).
enum class DType : uint8_t { f32 = 0, bf16 = 1, i32 = 2 };

/// Where a buffer lives. CUDA buffers are on the process's device, chosen once from the world's
/// node-local rank (select_device_for_process, comm/comm_factory.h).
enum class Device : uint8_t { CPU = 0, CUDA = 1 };

/// Bytes per element of `dt`.
inline constexpr int64_t dtype_size(DType dt) { return dt == DType::bf16 ? 2 : 4; }
/// "f32", "bf16", "i32".
inline constexpr NameTable<DType, 3> kDTypeNames{{{{DType::f32, "f32"}, {DType::bf16, "bf16"}, {DType::i32, "i32"}}}};
/// "cpu", "cuda".
inline constexpr NameTable<Device, 2> kDeviceNames{{{{Device::CPU, "cpu"}, {Device::CUDA, "cuda"}}}};
/// A floating dtype that may be left to a rule: "auto" (unset), "bf16", "f32".
inline constexpr NameTable<std::optional<DType>, 3> kAutoDTypeNames{
    {{{std::nullopt, "auto"}, {DType::bf16, "bf16"}, {DType::f32, "f32"}}}};
inline const char* dtype_name(DType dt) { return kDTypeNames.name(dt); }
inline const char* device_name(Device d) { return kDeviceNames.name(d); }

/// Parses "f32"/"float32"/"bf16"/"bfloat16"; throws std::invalid_argument otherwise.
inline DType parse_dtype(const std::string& s) {
  if (s == "f32" || s == "float32") return DType::f32;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  throw std::invalid_argument("unknown dtype '" + s + "' (expected f32 or bf16)");
}

/// bfloat16 storage type: 16 raw bits. Conversion from f32 rounds to nearest even; NaN stays NaN.
struct bf16 {
  uint16_t bits = 0;
};

inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  bf16 out;
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {  // NaN: keep it quiet NaN
    out.bits = static_cast<uint16_t>((u >> 16) | 0x0040u);
    return out;
  }
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  out.bits = static_cast<uint16_t>((u + rounding_bias) >> 16);
  return out;
}

inline float bf16_to_float(bf16 h) {
  uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace mfsdp
