// The cost terms the cluster projection is built from: a per-device GEMM roofline with an
// efficiency curve over the GEMM's size, Newton-Schulz as the GEMMs and kernel launches it runs
// (batched over same-shape matrices or one matrix at a time), and the engine's unit schedule with
// prefetched gathers and overlapped reduce-scatters on a communication stream.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/dtype.h"

namespace mfsdp {

struct ClusterSpec;

/// Fraction of a device's large-GEMM rate reached by a GEMM of "size" s = cbrt(M * N * K * batch)
/// (the side of the cube with the same FLOPs): piecewise linear in log2(s) between the points
/// (size, efficiency), clamped to the first and last point; 1 when `points` is empty (a flat
/// rate, e.g. a CPU's calibrated one). Throws std::invalid_argument when sizes are not increasing
/// or an efficiency is not in (0, 1.5].
double curve_efficiency(const std::vector<std::pair<double, double>>& points, double size);

/// Seconds of one GEMM (batch x [M, K] x [K, N], 2 M N K batch FLOPs) in `dtype` (bf16 or f32)
/// on one device of `c`, whose rate is scaled by `share` (a CPU rank's part of its node): the
/// roofline max(FLOPs / (rate * curve_efficiency), bytes moved / mem_GBps) plus one kernel launch
/// (c.launch_us). Throws std::invalid_argument on another dtype.
double gemm_seconds(const ClusterSpec& c, DType dtype, double batch, double M, double N, double K,
                    double share);

/// Kernel launches of one Newton-Schulz iteration besides its three GEMMs (the fused axpy
/// combinations of the quintic), and of the normalisation before the first one (norm, scale,
/// cast).
inline constexpr int kNsExtraLaunchesPerIteration = 2, kNsNormalizeLaunches = 3;

/// Seconds of `steps` Newton-Schulz iterations of `count` matrices of one shape (rows x cols) in
/// `dtype`: per iteration the products X X^T [m, m, n], A A [m, m, m] and B X [m, n, m] with
/// m = min(rows, cols), n = max(rows, cols), each GEMM time divided by c.ns_efficiency, plus
/// kNsExtraLaunchesPerIteration launches, after kNsNormalizeLaunches. `batched`: the `count`
/// matrices run as one strided-batched chain (one launch per kernel, the batch's size on the
/// efficiency curve); otherwise `count` chains one after another.
double newton_schulz_seconds(const ClusterSpec& c, DType dtype, int64_t rows, int64_t cols,
                             int steps, int count, bool batched, double share);

/// One FSDP unit's times in seconds: its forward and backward compute, the all-gather of its
/// parameters (0 when resident) and the reduction of its gradients.
struct UnitTimes {
  double forward = 0, backward = 0, gather = 0, reduce = 0;
};

/// A step's forward and backward as the engine schedules them, in seconds. `forward` and
/// `backward` include the gather time compute waits for; `reduce_wait` is the time compute waits
/// for gradient reductions (all of them when they block, the last unit's bubble when they overlap).
struct UnitSchedule {
  double forward = 0, backward = 0, reduce_wait = 0;
};

/// Simulates one compute stream and one communication stream that runs its collectives in issue
/// order (NCCL's comm stream; MPI with no overlap is the same with prefetch_depth 0 and
/// overlap_reduce false). Forward: unit u waits for its gather; at its start the gathers of the
/// next `prefetch_depth` units are issued. Backward (units in reverse, regathered): the same
/// prefetching of the units below; unit u's reduction is issued when its backward ends and, with
/// `overlap_reduce`, waited for only after the next unit's backward (unit 0's at the end: the
/// bubble no compute hides); without it, waited for at once. prefetch_depth < 0 is treated as 0.
UnitSchedule schedule_units(const std::vector<UnitTimes>& units, int prefetch_depth, bool overlap_reduce);

}  // namespace mfsdp
