// The CPU backend's mixture-of-experts row kernels (the Kernels methods gather_rows, combine_rows,
// combine_rows_backward, gated_add_rows and gated_add_rows_backward; formulas in runtime/kernels.h):
// a base class of the CPU backend (kernels_cpu.cpp). Internal to runtime. OpenMP over rows: every
// output row is written by one thread in a fixed order, so results do not depend on the thread count.
#pragma once
#include <cstdint>

#include "runtime/kernels.h"

namespace mfsdp {

class CpuMoeKernels : public Kernels {
 public:
  void gather_rows(const float* src, const int32_t* index, float* out, int64_t rows, int64_t cols) override;
  void combine_rows(const float* rows, const int32_t* row_of, const float* weight, float* y, int64_t N, int64_t K,
                    int64_t cols, bool accumulate) override;
  void combine_rows_backward(const float* dy, const int32_t* index, const float* weight, const float* rows,
                             float* drows, float* dweight, int64_t R, int64_t cols) override;
  void gated_add_rows(const float* x, float* gate, float* y, int64_t N, int64_t cols) override;
  void gated_add_rows_backward(const float* dy, const float* x, const float* gate, float* dx, float* dlogit, int64_t N,
                               int64_t cols) override;
};

}  // namespace mfsdp
