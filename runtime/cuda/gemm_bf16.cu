#include "runtime/cuda/gemm_bf16.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <utility>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "runtime/core/cuda_check.h"
#include "runtime/cuda/device_api.h"
#include "runtime/kernels.h"

namespace mfsdp::cuda_gemm {
namespace {

// The largest power of two up to 256 that divides the address.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

int as_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw std::invalid_argument(std::string("[gemm_bf16] ") + what + "=" + std::to_string(v) +
                                " outside the int range cuBLAS accepts");
  return static_cast<int>(v);
}

// Column-major sizes of one call after the row-major -> column-major operand swap.
struct ColMajor {
  int m, n, k, lda, ldb;  // first operand B (m x k as op'd), second A (k x n), C m x n
  cublasOperation_t op_first, op_second;
};

ColMajor col_major(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  return {as_int(N, "N"), as_int(M, "M"), as_int(K, "K"), as_int(ta ? M : K, "lda"), as_int(tb ? K : N, "ldb"),
          tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N};
}

// One shape's matmul: descriptors and the algorithm the heuristic chose (found = false: none).
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
};

// The vectors of a fused epilogue: the bias (read) or bias gradient (written), and the auxiliary
// [M,N] buffer (the pre-activation: written by GELU_AUX_BIAS, read by DGELU_BGRAD).
struct EpilogueVectors {
  float* bias = nullptr;
  float* aux = nullptr;
};

// Points the descriptor at this call's epilogue vectors (f32, the output's type: cuBLASLt's
// default bias and auxiliary data types); the auxiliary buffer is column-major m x n with ld m.
void set_epilogue_vectors(cublasLtMatmulDesc_t op, const ColMajor& s, const EpilogueVectors& ep) {
  if (ep.bias != nullptr)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ep.bias, sizeof(ep.bias)));
  if (ep.aux != nullptr) {
    const int64_t ld = s.m;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep.aux, sizeof(ep.aux)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
  }
}

// The process's cuBLASLt handle, workspace and per-shape plans (never freed: they live as long as
// the CUDA context, like the shared cuBLAS handle).
class LtContext {
 public:
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;

  static LtContext& get() {
    static LtContext ctx;
    return ctx;
  }

  // The plan of (ta, tb, M, N, K) for operands of these alignments (bytes: the largest power of
  // two up to 256 dividing the address; the heuristic otherwise assumes 256 and may pick an
  // algorithm that refuses a gradient view at a 4-byte offset), made on first use. Called with mu_ held.
  // `epilogue` other than DEFAULT: `ep` holds its vectors, set on the descriptor before the
  // heuristic (the auxiliary buffer's leading dimension is part of what it checks).
  const LtPlan& plan(bool ta, bool tb, const ColMajor& s, uint32_t align_first, uint32_t align_second,
                     uint32_t align_c, cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT,
                     const EpilogueVectors& ep = {}) {
    // the heuristic reads the epilogue vectors' alignment from their pointers: part of the key
    const auto key = std::make_tuple(ta, tb, s.m, s.n, s.k, align_first, align_second, align_c, epilogue,
                                     ep.bias ? alignment_of(ep.bias) : 0u, ep.aux ? alignment_of(ep.aux) : 0u);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    LtPlan p;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &s.op_first, sizeof(s.op_first)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &s.op_second, sizeof(s.op_second)));
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
      set_epilogue_vectors(p.op, s, ep);
    }
    // stored shapes: the first operand is m x k (k x m when transposed), the second k x n (n x k)
    const bool t1 = s.op_first == CUBLAS_OP_T, t2 = s.op_second == CUBLAS_OP_T;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, t1 ? s.k : s.m, t1 ? s.m : s.k, s.ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, t2 ? s.n : s.k, t2 ? s.k : s.n, s.lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, s.m, s.n, s.m));
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kWorkspaceBytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    for (auto [attr, align] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_first},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_second},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}})
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
      p.algo = result.algo;
      p.found = true;
    }
    return plans_.emplace(key, p).first->second;
  }

  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }
  std::mutex& mutex() { return mu_; }

 private:
  LtContext() {
    CUBLAS_CHECK(cublasLtCreate(&handle_));
    CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  }
  std::mutex mu_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<std::tuple<bool, bool, int, int, int, uint32_t, uint32_t, uint32_t, cublasLtEpilogue_t, uint32_t, uint32_t>,
           LtPlan>
      plans_;
};

}  // namespace

void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, const void* B,
               float beta, float* C) {
  if (M == 0 || N == 0 || K == 0) return gemm_bf16_gemmex(ta, tb, M, N, K, alpha, A, B, beta, C);  // empty shapes
  const ColMajor s = col_major(ta, tb, M, N, K);
  LtContext& lt = LtContext::get();
  std::lock_guard<std::mutex> lock(lt.mutex());  // one workspace: one matmul enqueued at a time
  const LtPlan& p = lt.plan(ta, tb, s, alignment_of(B), alignment_of(A), alignment_of(C));
  if (!p.found) {
    gemm_bf16_gemmex(ta, tb, M, N, K, alpha, A, B, beta, C);
    return;
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B is the first operand.
  CUBLAS_CHECK(cublasLtMatmul(lt.handle(), p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.algo, lt.workspace(),
                          LtContext::kWorkspaceBytes, static_cast<cudaStream_t>(cuda::compute_stream())));
}

bool gemm_bf16_epilogue(Kernels::Epilogue e, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A,
                        const void* B, float* C, float* bias, float* aux) {
  const bool needs_aux = e != Kernels::Epilogue::bias;
  if (M == 0 || N == 0 || K == 0 || (needs_aux && N % 8 != 0)) return false;  // the auxiliary ld (N): a multiple of 8
  if (bias == nullptr || (needs_aux && aux == nullptr))
    throw std::invalid_argument("[gemm_bf16_epilogue] the epilogue's bias and auxiliary buffers are required");
  // 16-byte vectors and output (a parameter view of a flat buffer may sit at any 4-byte offset)
  const void* vectors[] = {C, bias, needs_aux ? aux : nullptr};
  for (const void* v : vectors)
    if (v != nullptr && alignment_of(v) < 16) return false;
  const cublasLtEpilogue_t epilogue = e == Kernels::Epilogue::bias        ? CUBLASLT_EPILOGUE_BIAS
                                      : e == Kernels::Epilogue::bias_gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                          : CUBLASLT_EPILOGUE_DGELU_BGRAD;
  const EpilogueVectors ep{bias, needs_aux ? aux : nullptr};
  const ColMajor s = col_major(ta, tb, M, N, K);
  LtContext& lt = LtContext::get();
  std::lock_guard<std::mutex> lock(lt.mutex());
  const LtPlan& p = lt.plan(ta, tb, s, alignment_of(B), alignment_of(A), alignment_of(C), epilogue, ep);
  if (!p.found) return false;
  set_epilogue_vectors(p.op, s, ep);  // the plan is shared by calls of this shape: this call's vectors
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st = cublasLtMatmul(lt.handle(), p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.algo,
                                           lt.workspace(), LtContext::kWorkspaceBytes,
                                           static_cast<cudaStream_t>(cuda::compute_stream()));
  // a heuristic's algorithm may still refuse the call (cuBLASLt: e.g. buffers it finds misaligned)
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) return false;
  CUBLAS_CHECK(st);
  return true;
}

void gemm_bf16_gemmex(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, const void* B,
                      float beta, float* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // no products: C = beta * C, as the f32 gemm does
    kernels(Device::CUDA).gemm(ta, tb, M, N, 0, alpha, nullptr, nullptr, beta, C);
    return;
  }
  const ColMajor s = col_major(ta, tb, M, N, K);
  auto h = static_cast<cublasHandle_t>(cuda::cublas_handle());
  CUBLAS_CHECK(cublasGemmEx(h, s.op_first, s.op_second, s.m, s.n, s.k, &alpha, B, CUDA_R_16BF, s.ldb, A, CUDA_R_16BF,
                            s.lda, &beta, C, CUDA_R_32F, s.m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace mfsdp::cuda_gemm
