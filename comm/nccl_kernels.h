// Device kernels of the CUDA comm backends (compiled only when MFSDP_WITH_CUDA).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "comm/communicator.h"

namespace mfsdp::detail {

/// Rank-ordered reduction on the device, the GPU twin of host_ordered_reduce:
/// out[i] = op over j = 0..nsrc-1 of src_j[i] accumulated in f32 in that order (sum/mean from +0,
/// accumulate from out[i], whose `out` is f32 whatever dt is), where
/// src_j = stage + j*stride elements, except src_{own_index} = own. bf16 rounds to nearest even
/// once at the end (bitwise equal to the host path). `out` may alias `own` (not for accumulate). Enqueued on `stream`.
void launch_ordered_reduce(const void* stage, int64_t stride, const void* own, int own_index,
                           int nsrc, void* out, int64_t n, DType dt, ReduceOp op,
                           cudaStream_t stream);

}  // namespace mfsdp::detail
