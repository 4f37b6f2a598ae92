// Internals shared by the comm backends (not part of the public API): argument checks, the
// direct-model byte formulas, the debug-mode signature exchange and the fatal-error path.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm_factory.h"
#include "comm/communicator.h"

namespace mfsdp::detail {

/// Operation ids used in debug signatures and messages.
enum class CommOpId : int64_t {
  all_gather = 1, all_gather_v, reduce_scatter, reduce_scatter_v, all_reduce, all_reduce_scalar,
  broadcast, barrier, send_recv, all_gather_host
};
const char* comm_op_name(CommOpId op);

/// Describes one call for error messages: "all_gather_v(f32, counts=[3,0,5] total 8, phase fwd_gather)".
struct CallInfo {
  CommOpId op;
  CommPhase phase;
  DType dtype = DType::f32;
  int64_t count = 0;                           // equal-part / all_reduce / broadcast count
  const std::vector<int64_t>* counts = nullptr;  // uneven counts, or nullptr
  int root = -1;
  ReduceOp reduce = ReduceOp::sum;
  std::string describe() const;
};

/// Bytes sent/received by this rank for one call (see the table in communicator.h).
struct Traffic {
  int64_t sent = 0, received = 0;
};
Traffic traffic_all_gather_v(const std::vector<int64_t>& counts, int rank, DType dt);
Traffic traffic_reduce_scatter_v(const std::vector<int64_t>& counts, int rank, DType dt);
Traffic traffic_all_reduce(int64_t count, int world, int rank, DType dt);
Traffic traffic_broadcast(int64_t count, int world, int rank, int root, DType dt);

/// Throws std::invalid_argument naming `op` unless counts has `world` entries, all >= 0.
/// Returns sum(counts).
int64_t check_counts(const char* op, const std::vector<int64_t>& counts, int world);
/// Throws std::invalid_argument naming `op` when count < 0 or `ptr` is null while count > 0.
void check_buffer(const char* op, const char* which, const void* ptr, int64_t count);
/// The argument checks of reduce_scatter_v and start_reduce_scatter_v (counts, both buffers,
/// the reduce op; throws std::invalid_argument naming "reduce_scatter_v"). Returns sum(counts).
int64_t check_reduce_scatter_v_args(const void* send, const void* recv, const std::vector<int64_t>& counts,
                                    int world, int rank, DType dt, ReduceOp op);
/// The argument checks of send_recv (each op's peer in [0, world), its buffer and count; throws
/// std::invalid_argument naming "send_recv" and the op's index) and the call's bytes: sends add
/// to `sent`, receives to `received`.
Traffic check_send_recv_args(const std::vector<Communicator::P2P>& ops, int world);
/// Throws std::invalid_argument naming `op` unless 0 <= root < world.
void check_root(const char* op, int root, int world);
/// Exclusive prefix sums of counts (offset of each rank's segment).
std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts);

/// The text set by set_comm_context ("" when none), for reports made outside comm_fatal.
std::string comm_context_text();

/// The CUDA backends' device check: the device select_device_for_process() chose, after making
/// sure it is still the current one. Throws std::runtime_error naming `who` when no device was
/// selected or another one is current. Communicators never select a device themselves.
ProcessDevice check_process_device(const char* who);

/// Prints "[comm] rank R: <what> in <call.describe()>" to stderr, flushes, then MPI_Abort(comm).
[[noreturn]] void comm_fatal(MPI_Comm comm, int rank, const CallInfo& call, const std::string& what);
/// comm_fatal with the MPI error string when rc != MPI_SUCCESS.
void mpi_check(int rc, MPI_Comm comm, int rank, const CallInfo& call, const char* mpi_fn);

/// "timed out after <seconds> s (<name>; another rank is missing or stuck)" (no name: without it),
/// the text of every timeout report, so it says which bound fired.
std::string timeout_text(double seconds, const std::string& name);

/// Waits for n requests; with timeout_seconds > 0 a wait longer than that is fatal (comm_fatal
/// naming the call and timeout_text(timeout_seconds, timeout_name)). Backend errors are fatal too.
void wait_requests(int n, MPI_Request* reqs, double timeout_seconds, MPI_Comm comm, int rank, const CallInfo& call,
                   const std::string& timeout_name = "");

/// Debug mode: all ranks all-gather (seq, op, dtype, reduce op, root, phase, #counts, total,
/// counts hash) and compare with rank 0. On the first mismatching rank every rank prints
/// "[comm debug] rank R: collective #seq mismatch: rank 0 called ... but rank K called ..." and
/// the job is aborted. Every rank must call it once per collective (`seq` counts them).
void check_signature(MPI_Comm comm, int rank, int world, int64_t seq, const CallInfo& call,
                     double timeout_seconds = 0, const std::string& timeout_name = "");

/// Throws std::invalid_argument naming `op` when the values are neither f32 nor bf16 (i32 is
/// only moved, never reduced), or when `reduce` is accumulate and the call is not a
/// reduce-scatter (`allow_accumulate` false).
void check_reduce_op(const char* op, ReduceOp reduce, DType dt, bool allow_accumulate);

/// Bytes per element of a reduce-scatter's `recv` buffer: f32 for accumulate, else the dtype's.
inline int64_t recv_elem_bytes(DType dt, ReduceOp op) { return op == ReduceOp::accumulate ? 4 : dtype_size(dt); }

/// Rank-ordered reduction of one chunk on the host, in f32: sum/mean start from +0 (accumulate
/// from `out`'s f32 values) and add srcs[0][i], srcs[1][i], ... in that order; max takes the
/// maximum. The result is written to `out` in dtype `dt` (mean divides by srcs.size()), except
/// for accumulate, whose `out` is always f32 (the srcs may be bf16).
/// `out` may alias the source of this rank except for accumulate; `acc` needs n floats.
void host_ordered_reduce(const std::vector<const void*>& srcs, void* out, int64_t n, DType dt,
                         ReduceOp op, float* acc);

}  // namespace mfsdp::detail
