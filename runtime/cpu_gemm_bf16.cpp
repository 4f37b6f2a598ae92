// oneDNN matmul for the CPU backend's bf16 GEMM (see cpu_gemm_bf16.h). Without oneDNN the build
// keeps only the queries, which report the widening path.
#include "runtime/cpu_gemm_bf16.h"

#include <stdexcept>
#include <string>

#if defined(MFSDP_WITH_DNNL)
#include <oneapi/dnnl/dnnl.h>

#include <cstdlib>
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

/// The shape, strides, dtypes and coefficients of one matmul; the key of its cached primitive.
struct MatmulSpec {
  bool ta = false, tb = false, bf16_out = false, add = false;  // add: a binary-add operand D
  int64_t M = 0, N = 0, K = 0, lda = 0, ldb = 0, ldc = 0;
  uint32_t alpha = 0, beta = 0;  // bit patterns of the floats
  auto key() const { return std::tie(ta, tb, bf16_out, add, M, N, K, lda, ldb, ldc, alpha, beta); }
  bool operator<(const MatmulSpec& o) const { return key() < o.key(); }
};

void append_post_ops(dnnl_primitive_attr_t attr, const MatmulSpec& s, const dnnl_memory_desc_t& c) {
  float alpha, beta;
  std::memcpy(&alpha, &s.alpha, 4);
  std::memcpy(&beta, &s.beta, 4);
  dnnl_post_ops_t ops;
  dnnl_check(dnnl_post_ops_create(&ops), "post_ops_create");
  if (s.add) {  // C = beta * (acc * alpha / beta + D): a binary add of D between two scalings
    const float scale = alpha / beta;
    dnnl_check(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &scale), "output scales");
    dnnl_check(dnnl_post_ops_append_binary(ops, dnnl_binary_add, &c), "post_ops_append_binary");
    dnnl_check(dnnl_post_ops_append_eltwise(ops, 1.f, dnnl_eltwise_linear, beta, 0.f), "post_ops_append_eltwise");
  } else {
    if (alpha != 1.f) dnnl_check(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha), "output scales");
    if (beta != 0.f)  // C = alpha A B + beta C: oneDNN's sum post-op adds beta times the old C
      dnnl_check(dnnl_post_ops_append_sum(ops, beta), "post_ops_append_sum");
  }
  const dnnl_status_t st = dnnl_primitive_attr_set_post_ops(attr, ops);
  dnnl_post_ops_destroy(ops);
  dnnl_check(st, "set_post_ops");
}

/// The CPU engine and stream, and one primitive (with its memory descriptors) per MatmulSpec.
class MatmulCache {
 public:
  struct Entry {
    dnnl_primitive_t primitive = nullptr;
    dnnl_memory_desc_t a, b, c, scratch;  // scratch: the primitive's scratchpad (user-provided)
    size_t scratch_bytes = 0;
  };

  MatmulCache() {
    dnnl_check(dnnl_engine_create(&engine_, dnnl_cpu, 0), "engine_create");
    dnnl_check(dnnl_stream_create(&stream_, engine_, dnnl_stream_default_flags), "stream_create");
  }
  ~MatmulCache() {
    for (auto& [key, e] : entries_) dnnl_primitive_destroy(e.primitive);
    std::free(scratch_);
    dnnl_stream_destroy(stream_);
    dnnl_engine_destroy(engine_);
  }

  const Entry& get(const MatmulSpec& s) {
    auto it = entries_.find(s);
    if (it != entries_.end()) return it->second;
    Entry e;
    // op(A)[m,k] lives at A[m*lda + k] (not transposed) or A[k*lda + m] (stored transposed); same for B.
    const dnnl_dims_t a_dims{s.M, s.K}, a_strides{s.ta ? 1 : s.lda, s.ta ? s.lda : 1};
    const dnnl_dims_t b_dims{s.K, s.N}, b_strides{s.tb ? 1 : s.ldb, s.tb ? s.ldb : 1};
    const dnnl_dims_t c_dims{s.M, s.N}, c_strides{s.ldc, 1};
    dnnl_check(dnnl_memory_desc_init_by_strides(&e.a, 2, a_dims, dnnl_bf16, a_strides), "memory_desc (A)");
    dnnl_check(dnnl_memory_desc_init_by_strides(&e.b, 2, b_dims, dnnl_bf16, b_strides), "memory_desc (B)");
    dnnl_check(dnnl_memory_desc_init_by_strides(&e.c, 2, c_dims, s.bf16_out ? dnnl_bf16 : dnnl_f32, c_strides),
               "memory_desc (C)");
    dnnl_matmul_desc_t desc;
    dnnl_check(dnnl_matmul_desc_init(&desc, &e.a, &e.b, nullptr, &e.c), "matmul_desc_init");
    dnnl_primitive_attr_t attr;
    dnnl_check(dnnl_primitive_attr_create(&attr), "primitive_attr_create");
    dnnl_primitive_desc_t pd = nullptr;
    dnnl_status_t st = dnnl_success;
    try {
      // The scratchpad (packed operand blocks) comes from this cache, kept across calls: in the
      // library's default mode it is allocated and freed around every execution, which page-faults
      // megabytes per call once shapes alternate.
      dnnl_check(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad mode");
      append_post_ops(attr, s, e.c);
      st = dnnl_primitive_desc_create(&pd, &desc, attr, engine_, nullptr);
    } catch (...) {
      dnnl_primitive_attr_destroy(attr);
      throw;
    }
    dnnl_primitive_attr_destroy(attr);
    dnnl_check(st, ("matmul for M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K))
                       .c_str());
    e.scratch = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    e.scratch_bytes = dnnl_memory_desc_get_size(&e.scratch);
    const dnnl_status_t made = dnnl_primitive_create(&e.primitive, pd);
    dnnl_primitive_desc_destroy(pd);
    dnnl_check(made, "primitive_create");
    return entries_.emplace(s, e).first->second;
  }

  /// Runs e on A, B -> C (D: the binary-add operand, laid out as C, or null).
  void run(const Entry& e, const void* A, const void* B, void* C, const void* D) {
    if (e.scratch_bytes > scratch_bytes_) {
      std::free(scratch_);
      scratch_ = std::aligned_alloc(kScratchAlign, (e.scratch_bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign);
      scratch_bytes_ = scratch_ ? e.scratch_bytes : 0;
      if (!scratch_) throw std::runtime_error("[gemm_bf16] cannot allocate " + std::to_string(e.scratch_bytes) + " bytes");
    }
    dnnl_memory_t mem[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
    dnnl_check(dnnl_memory_create(&mem[0], &e.a, engine_, const_cast<void*>(A)), "memory_create (A)");
    dnnl_check(dnnl_memory_create(&mem[1], &e.b, engine_, const_cast<void*>(B)), "memory_create (B)");
    dnnl_check(dnnl_memory_create(&mem[2], &e.c, engine_, C), "memory_create (C)");
    dnnl_check(dnnl_memory_create(&mem[3], &e.scratch, engine_, scratch_), "memory_create (scratchpad)");
    if (D) dnnl_check(dnnl_memory_create(&mem[4], &e.c, engine_, const_cast<void*>(D)), "memory_create (D)");
    const dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, mem[0]},
                                     {DNNL_ARG_WEIGHTS, mem[1]},
                                     {DNNL_ARG_DST, mem[2]},
                                     {DNNL_ARG_SCRATCHPAD, mem[3]},
                                     {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, mem[4]}};
    const dnnl_status_t st = dnnl_primitive_execute(e.primitive, stream_, D ? 5 : 4, args);
    const dnnl_status_t waited = st == dnnl_success ? dnnl_stream_wait(stream_) : st;
    for (dnnl_memory_t m : mem)
      if (m) dnnl_memory_destroy(m);
    dnnl_check(waited, "matmul execute");
  }

 private:
  dnnl_engine_t engine_ = nullptr;
  dnnl_stream_t stream_ = nullptr;
  std::map<MatmulSpec, Entry> entries_;
  static constexpr size_t kScratchAlign = 64;
  void* scratch_ = nullptr;  // one scratchpad, the largest any cached primitive needs
  size_t scratch_bytes_ = 0;
};

MatmulCache& matmul_cache() {
  static MatmulCache cache;
  return cache;
}

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
  MatmulSpec s;
  s.ta = ta;
  s.tb = tb;
  s.M = M, s.N = N, s.K = K;
  s.lda = ta ? M : K, s.ldb = tb ? K : N, s.ldc = N;
  s.alpha = float_bits(alpha), s.beta = float_bits(beta);
  MatmulCache& cache = matmul_cache();
  cache.run(cache.get(s), A, B, C, nullptr);
}

void cpu_gemm_bf16_fused(bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
                         const void* B, int64_t ldb, float beta, const void* D, void* C, int64_t ldc, bool bf16_out) {
  if (beta != 0.f && D == nullptr) throw std::invalid_argument("[gemm_bf16] beta != 0 needs the operand D");
  MatmulSpec s;
  s.tb = tb;
  s.bf16_out = bf16_out;
  s.add = beta != 0.f;
  s.M = M, s.N = N, s.K = K;
  s.lda = lda, s.ldb = ldb, s.ldc = ldc;
  s.alpha = float_bits(alpha), s.beta = float_bits(beta);
  MatmulCache& cache = matmul_cache();
  cache.run(cache.get(s), A, B, C, s.add ? D : nullptr);
}

#else

bool cpu_gemm_bf16_native() { return false; }
const char* cpu_gemm_bf16_path() { return "bf16 matmuls widened to f32 (built without oneDNN)"; }
void cpu_gemm_bf16(bool, bool, int64_t, int64_t, int64_t, float, const void*, const void*, float, float*) {
  throw std::runtime_error("[gemm_bf16] built without oneDNN: no native bf16 GEMM");
}
void cpu_gemm_bf16_fused(bool, int64_t, int64_t, int64_t, float, const void*, int64_t, const void*, int64_t, float,
                         const void*, void*, int64_t, bool) {
  throw std::runtime_error("[gemm_bf16] built without oneDNN: no native bf16 GEMM");
}

#endif

}  // namespace mfsdp
