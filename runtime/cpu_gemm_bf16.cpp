// oneDNN matmul for the CPU backend's bf16 GEMM (see cpu_gemm_bf16.h). Without oneDNN the build
// keeps only the queries, which report the widening path.
#include "runtime/cpu_gemm_bf16.h"

#include <stdexcept>
#include <string>

#if defined(MFSDP_WITH_DNNL)
#include <oneapi/dnnl/dnnl.h>

#include <cstring>
#include <map>
#include <tuple>
#endif

namespace mfsdp {

#if defined(MFSDP_WITH_DNNL)
namespace {

void dnnl_check(dnnl_status_t st, const char* what) {
  if (st != dnnl_success)
    throw std::runtime_error(std::string("[gemm_bf16] oneDNN ") + what + " failed (status " +
                             std::to_string(static_cast<int>(st)) + ")");
}

uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

/// The CPU engine and stream, and one primitive (with its memory descriptors) per GEMM shape.
class MatmulCache {
 public:
  struct Entry {
    dnnl_primitive_t primitive = nullptr;
    dnnl_memory_desc_t a, b, c;
  };
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, uint32_t, uint32_t>;

  MatmulCache() {
    dnnl_check(dnnl_engine_create(&engine_, dnnl_cpu, 0), "engine_create");
    dnnl_check(dnnl_stream_create(&stream_, engine_, dnnl_stream_default_flags), "stream_create");
  }
  ~MatmulCache() {
    for (auto& [key, e] : entries_) dnnl_primitive_destroy(e.primitive);
    dnnl_stream_destroy(stream_);
    dnnl_engine_destroy(engine_);
  }

  const Entry& get(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
    const Key key{ta, tb, M, N, K, float_bits(alpha), float_bits(beta)};
    auto it = entries_.find(key);
    if (it != entries_.end()) return it->second;
    Entry e;
    // op(A)[m,k] lives at A[m*K + k] (not transposed) or A[k*M + m] (stored transposed); same for B.
    const dnnl_dims_t a_dims{M, K}, a_strides{ta ? 1 : K, ta ? M : 1};
    const dnnl_dims_t b_dims{K, N}, b_strides{tb ? 1 : N, tb ? K : 1};
    const dnnl_dims_t c_dims{M, N}, c_strides{N, 1};
    dnnl_check(dnnl_memory_desc_init_by_strides(&e.a, 2, a_dims, dnnl_bf16, a_strides), "memory_desc (A)");
    dnnl_check(dnnl_memory_desc_init_by_strides(&e.b, 2, b_dims, dnnl_bf16, b_strides), "memory_desc (B)");
    dnnl_check(dnnl_memory_desc_init_by_strides(&e.c, 2, c_dims, dnnl_f32, c_strides), "memory_desc (C)");
    dnnl_matmul_desc_t desc;
    dnnl_check(dnnl_matmul_desc_init(&desc, &e.a, &e.b, nullptr, &e.c), "matmul_desc_init");
    dnnl_primitive_attr_t attr;
    dnnl_check(dnnl_primitive_attr_create(&attr), "primitive_attr_create");
    if (alpha != 1.f) dnnl_check(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha), "output scales");
    if (beta != 0.f) {  // C = alpha A B + beta C: oneDNN's sum post-op adds beta times the old C
      dnnl_post_ops_t ops;
      dnnl_check(dnnl_post_ops_create(&ops), "post_ops_create");
      dnnl_check(dnnl_post_ops_append_sum(ops, beta), "post_ops_append_sum");
      dnnl_check(dnnl_primitive_attr_set_post_ops(attr, ops), "set_post_ops");
      dnnl_post_ops_destroy(ops);
    }
    dnnl_primitive_desc_t pd;
    const dnnl_status_t st = dnnl_primitive_desc_create(&pd, &desc, attr, engine_, nullptr);
    dnnl_primitive_attr_destroy(attr);
    dnnl_check(st, ("matmul for M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K)).c_str());
    const dnnl_status_t made = dnnl_primitive_create(&e.primitive, pd);
    dnnl_primitive_desc_destroy(pd);
    dnnl_check(made, "primitive_create");
    return entries_.emplace(key, e).first->second;
  }

  void run(const Entry& e, const void* A, const void* B, float* C) {
    dnnl_memory_t a, b, c;
    dnnl_check(dnnl_memory_create(&a, &e.a, engine_, const_cast<void*>(A)), "memory_create (A)");
    dnnl_check(dnnl_memory_create(&b, &e.b, engine_, const_cast<void*>(B)), "memory_create (B)");
    dnnl_check(dnnl_memory_create(&c, &e.c, engine_, C), "memory_create (C)");
    const dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
    const dnnl_status_t st = dnnl_primitive_execute(e.primitive, stream_, 3, args);
    const dnnl_status_t waited = st == dnnl_success ? dnnl_stream_wait(stream_) : st;
    dnnl_memory_destroy(a);
    dnnl_memory_destroy(b);
    dnnl_memory_destroy(c);
    dnnl_check(waited, "matmul execute");
  }

 private:
  dnnl_engine_t engine_ = nullptr;
  dnnl_stream_t stream_ = nullptr;
  std::map<Key, Entry> entries_;
};

bool has_isa(dnnl_cpu_isa_t isa, dnnl_cpu_isa_t want) {
  return (static_cast<unsigned>(isa) & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
}

}  // namespace

bool cpu_gemm_bf16_native() {
  static const bool native = has_isa(dnnl_get_effective_cpu_isa(), dnnl_cpu_isa_avx512_core_bf16);
  return native;
}

const char* cpu_gemm_bf16_path() {
  if (!cpu_gemm_bf16_native()) return "bf16 matmuls widened to f32 (no AVX512-BF16 or AMX here)";
  return has_isa(dnnl_get_effective_cpu_isa(), dnnl_cpu_isa_avx512_core_amx) ? "bf16 matmuls on AMX (oneDNN)"
                                                                               : "bf16 matmuls on AVX512-BF16 (oneDNN)";
}

void cpu_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, const void* B,
                   float beta, float* C) {
  static MatmulCache cache;
  cache.run(cache.get(ta, tb, M, N, K, alpha, beta), A, B, C);
}

#else

bool cpu_gemm_bf16_native() { return false; }
const char* cpu_gemm_bf16_path() { return "bf16 matmuls widened to f32 (built without oneDNN)"; }
void cpu_gemm_bf16(bool, bool, int64_t, int64_t, int64_t, float, const void*, const void*, float, float*) {
  throw std::runtime_error("[gemm_bf16] built without oneDNN: no native bf16 GEMM");
}

#endif

}  // namespace mfsdp
