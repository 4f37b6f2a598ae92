// oneDNN's row-major SGEMM on one thread (see cpu_sgemm_serial.h).
#include "runtime/cpu_sgemm_serial.h"

#include <omp.h>

#include <stdexcept>
#include <string>

#if defined(MFSDP_WITH_DNNL)
#include <oneapi/dnnl/dnnl.h>
#endif

namespace mfsdp {

#if defined(MFSDP_WITH_DNNL)

bool cpu_sgemm_serial_available() { return true; }

void cpu_sgemm_serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  dnnl_status_t st;
  if (omp_in_parallel()) {
    st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } else {
    // Outside a parallel region oneDNN would use omp_get_max_threads() threads: ask for one, so
    // the blocking (and so the bits) stay those of the sequential kernel.
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    omp_set_num_threads(threads);
  }
  if (st != dnnl_success)
    throw std::runtime_error("[cpu_sgemm_serial] dnnl_sgemm failed (status " + std::to_string(static_cast<int>(st)) +
                             ") for M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
}

#else

bool cpu_sgemm_serial_available() { return false; }

void cpu_sgemm_serial(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                      float, float*, int64_t) {
  throw std::runtime_error("[cpu_sgemm_serial] built without oneDNN");
}

#endif

}  // namespace mfsdp
