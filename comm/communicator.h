// The communication layer's abstract interface: one Communicator whose backends (MPI for CPU
// buffers, host-staged CUDA and MPI-bootstrapped NCCL for CUDA buffers) are made by
// comm/comm_factory.h. No MPI type appears here. See comm/README.md.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"

namespace mfsdp {

/// Tag that says which part of a training step a collective belongs to; counters are kept per tag.
/// `experts`: token rows travelling to and from expert owners under expert parallelism.
enum class CommPhase : int { fwd_gather = 0, bwd_gather, grad_reduce, opt_step, other, experts, count };

/// "fwd_gather", "bwd_gather", "grad_reduce", "opt_step", "other", "experts" ("?" for out-of-range values).
const char* comm_phase_name(CommPhase p);

/// Reduction operator. `mean` is the sum divided by the world size (after summation).
/// max is supported by every reduction; all_reduce_scalar supports sum and max (mean too).
/// `accumulate` (reduce_scatter and reduce_scatter_v only) adds every rank's contribution, in
/// rank order, onto the values already in `recv`: recv = ((recv + c_0) + c_1) + ... + c_{N-1}.
/// `recv` is always f32; `send` is f32, or bf16 (mixed precision: half the bytes on the wire,
/// each contribution widened to f32 exactly, the additions in f32 on the owner).
/// It is how gradient accumulation over micro-batches stays bitwise independent of the world
/// size: each owned element receives the same sequence of f32 additions as at world size 1.
/// Every reduction takes f32 or bf16 values; i32 (token ids) is only moved (gathers, broadcasts,
/// send_recv) and a reduction of it throws std::invalid_argument.
enum class ReduceOp { sum, mean, max, accumulate };
const char* reduce_op_name(ReduceOp op);

/// Traffic of one phase. Bytes follow the *direct model* documented on each collective below:
/// what this rank puts on / takes off the network if every message goes straight to its
/// destination. Seconds are wall-clock seconds spent inside the communicator calls.
struct PhaseCounters {
  int64_t bytes_sent = 0, bytes_received = 0, calls = 0;
  double seconds = 0;
  PhaseCounters& operator+=(const PhaseCounters& o);
};

/// Counters per CommPhase (index with `(int)phase` or `at(phase)`).
struct CommCounters {
  PhaseCounters phase[(int)CommPhase::count];
  PhaseCounters& at(CommPhase p) { return phase[(int)p]; }
  const PhaseCounters& at(CommPhase p) const { return phase[(int)p]; }
  /// Sum over all phases.
  PhaseCounters total() const;
};

/// Behaviour switches shared by the backends.
struct CommOptions {
  /// Before every collective, all ranks exchange (op, dtype, reduce op, root, counts hash, phase)
  /// and the first mismatch is reported on every rank, then MPI_Abort. Also switched on by the
  /// environment variable MFSDP_COMM_DEBUG=1. Costs one small all-gather per collective.
  bool debug_checks = false;
  /// reduce_scatter(_v) stages at most this many bytes per contributing rank per round
  /// (owner staging memory = world_size * reduce_chunk_bytes). Must be >= 1 element.
  int64_t reduce_chunk_bytes = 4 << 20;
  /// > 0: a collective that has not completed after this many seconds aborts the job with a
  /// message naming rank, operation, phase and sizes (MPI: polled MPI_Testall; NCCL: polled
  /// stream + ncclCommGetAsyncError, then ncclCommAbort). 0: wait forever.
  double timeout_seconds = 0;
  /// What timeout messages call this bound, e.g. the config key that set it ("" = unnamed), so a
  /// report says which of several bounds fired.
  std::string timeout_name;
  /// Largest element count of one MPI message; larger transfers are split (MPI counts are int).
  /// Lower it only in tests, to exercise the split path with small buffers.
  int64_t max_message_elements = int64_t(1) << 30;
};

/// A collective started by a start_* call and finished by wait(): the overlap of FSDP prefetching.
/// After wait() returns its buffers may be used (CPU: the data is there; CUDA: work queued on the
/// compute stream afterwards runs after the collective). Destroying an unwaited handle waits.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

/// Abstract communicator. Every rank of the group must call the same collectives in the same order
/// with the same counts vectors, including ranks whose segment is empty (zero counts are legal and
/// are never skipped). Counts are elements (int64). Pointers are host memory for the MPI backend
/// and device memory for the NCCL and host-staged CUDA backends (`device()` says which); a pointer
/// may be null only where its element count is 0. Buffers of one call must not overlap.
/// Argument errors (wrong counts length, negative counts, bad root/peer) throw std::invalid_argument
/// *before* any communication (so every rank with the same arguments throws). A failing backend call
/// prints one line naming rank, operation, phase and sizes, then aborts the job (MPI_Abort).
///
/// Byte counters (direct model; N = world size, r = rank(), e = dtype_size, T = sum(counts)):
///   all_gather(count)        sent count*(N-1)*e          received count*(N-1)*e
///   all_gather_v(counts)     sent counts[r]*(N-1)*e      received (T-counts[r])*e
///   reduce_scatter(count)    sent count*(N-1)*e          received count*(N-1)*e
///   reduce_scatter_v(counts) sent (T-counts[r])*e        received counts[r]*(N-1)*e
///   all_reduce(count)        = reduce_scatter_v + all_gather_v over split_even(count, N):
///                            sent (count-c_r)*e + c_r*(N-1)*e, received the same
///   all_reduce_scalar        sent 8*(N-1)                received 8*(N-1)
///   broadcast(count, root)   root: sent count*(N-1)*e    others: received count*e
///   send_recv                sum of send counts*e        sum of recv counts*e
///   all_to_all_v             sum of send_counts[d]*e     sum of recv_counts[s]*e  (d, s != r)
///   exchange_counts          = all_gather_host of 8*N bytes
///   barrier                  0 bytes (one call in phase `other`)
/// The debug-mode signature exchange is not counted.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// Rank among the processes of this group on this node (MPI_COMM_TYPE_SHARED split).
  virtual int local_rank() const = 0;
  /// Number of processes of this group on this node (e.g. to split the node's cores).
  virtual int local_size() const = 0;
  virtual Device device() const = 0;
  /// Short backend name: "mpi", "cuda_staged" or "nccl".
  virtual const char* backend_name() const = 0;

  /// Equal parts: `send` has `count` elements, `recv` has count*world elements, rank r's part at
  /// r*count.
  virtual void all_gather(const void* send, void* recv, int64_t count, DType dt, CommPhase ph) = 0;
  /// Uneven parts: counts[r] elements from rank r (any may be 0); `send` has counts[rank()]
  /// elements; `recv` gets the concatenation of all parts in rank order (sum(counts) elements).
  virtual void all_gather_v(const void* send, void* recv, const std::vector<int64_t>& counts,
                            DType dt, CommPhase ph) = 0;
  /// all_gather_v started now and finished by the handle's wait(). Until wait() returns, the
  /// buffers must stay valid and untouched; other collectives may run in between (every rank in
  /// the same order). Counted when started. MPI: MPI_Iallgatherv (progress is the MPI library's);
  /// NCCL: enqueued on the comm stream after the work queued on the compute stream so far. The
  /// default (host-staged CUDA, messages above max_message_elements) completes before returning.
  virtual std::unique_ptr<PendingCollective> start_all_gather_v(const void* send, void* recv,
                                                                const std::vector<int64_t>& counts, DType dt,
                                                                CommPhase ph);
  /// `send` has count*world elements; `recv` gets this rank's reduced part (count elements,
  /// the op over every rank's elements [rank*count, (rank+1)*count)). Same order/accumulation
  /// rules as reduce_scatter_v.
  virtual void reduce_scatter(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                              CommPhase ph) = 0;
  /// `send` is the full buffer (sum(counts) elements, segment of rank r at offset
  /// sum(counts[0..r))); `recv` gets counts[rank()] elements: the op over all ranks' contributions
  /// to this rank's segment. Deterministic order: for every element the owner computes
  /// ((c_0 + c_1) + c_2) + ... + c_{N-1} (rank order 0..N-1, independent of message arrival);
  /// bf16 inputs are accumulated in f32 and rounded to bf16 once at the end; mean divides the
  /// sum by N. Data moves in rounds of at most reduce_chunk_bytes per contributing rank.
  virtual void reduce_scatter_v(const void* send, void* recv, const std::vector<int64_t>& counts,
                                DType dt, ReduceOp op, CommPhase ph) = 0;
  /// reduce_scatter_v started now and finished by the handle's wait(): the overlap of a unit's
  /// gradient reduction with the next unit's backward. Until wait() returns, `send` must stay
  /// valid and unchanged and `recv` untouched; other collectives may run in between (every rank
  /// in the same order). Bitwise equal to reduce_scatter_v; counted when started. MPI: the first
  /// round's messages are posted; NCCL: enqueued on the comm stream after the work queued on the
  /// compute stream so far, and wait() makes the compute stream wait for it. The default
  /// (host-staged CUDA) completes before returning.
  virtual std::unique_ptr<PendingCollective> start_reduce_scatter_v(const void* send, void* recv,
                                                                    const std::vector<int64_t>& counts, DType dt,
                                                                    ReduceOp op, CommPhase ph);
  /// In place. Same rank-order accumulation as reduce_scatter_v (bitwise identical on all ranks).
  /// `accumulate` is refused (std::invalid_argument).
  virtual void all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, CommPhase ph) = 0;
  /// One f64 value; sum/mean add in rank order 0..N-1, so every rank gets the identical result.
  virtual double all_reduce_scalar(double value, ReduceOp op, CommPhase ph) = 0;
  /// Host bytes on every backend (small control data: exact-sum states, fingerprints): `send`
  /// has `bytes` bytes, `recv` gets world*bytes, rank r's at r*bytes. Counted like all_gather.
  virtual void all_gather_host(const void* send, void* recv, int64_t bytes, CommPhase ph) = 0;
  /// `buf` (count elements) of rank `root` is copied to every rank.
  virtual void broadcast(void* buf, int64_t count, DType dt, int root, CommPhase ph) = 0;
  virtual void barrier() = 0;
  /// Replaces CommOptions::timeout_seconds and timeout_name for every later call of this rank
  /// (seconds >= 0; 0 = wait forever). Lets one communicator serve waits with different bounds,
  /// e.g. a barrier behind one rank's file I/O. Throws std::invalid_argument for a negative value.
  virtual void set_timeout(double seconds, const std::string& name) = 0;

  /// One point-to-point operation of a grouped send_recv.
  struct P2P {
    bool is_send;
    int peer;
    void* buf;
    int64_t count;
    DType dtype;
  };
  /// All ops of one call progress together (no deadlock for symmetric exchanges); returns when all
  /// have completed. Between one pair of ranks, sends and receives are matched in call order.
  /// Not a collective: only the ranks that take part call it (no debug signature check).
  virtual void send_recv(const std::vector<P2P>& ops, CommPhase ph) = 0;

  /// The counts of an all_to_all_v: this rank will send send_counts[d] elements to rank d (world
  /// entries, each >= 0); returns recv_counts, recv_counts[s] = what rank s will send here. One
  /// all_gather_host of world int64s per rank (counted in `ph`). Collective. Throws
  /// std::invalid_argument for a wrong length or a negative count, before communicating.
  std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send_counts, CommPhase ph);
  /// Variable all-to-all (the dispatch and combine of tokens to expert owners): `send` holds the
  /// segments for ranks 0..world-1 back to back (send_counts[d] elements for rank d), `recv`
  /// receives the segments from ranks 0..world-1 back to back (recv_counts[s] elements from s, as
  /// exchange_counts returned them). Pure data movement, in rank order, so the bytes are the same
  /// however messages arrive. Built on one grouped send_recv (MPI point-to-point, NCCL grouped
  /// send/recv, host-staged CUDA); the own segment takes the same path and is not counted, so the
  /// counters show sum_{d != rank} send_counts[d] * e sent and the like received. Collective over
  /// the ranks with nonzero counts; every rank should call it. Throws std::invalid_argument for
  /// counts of the wrong length or sign, or a null buffer with a nonzero total, before communicating.
  void all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                    const std::vector<int64_t>& recv_counts, DType dt, CommPhase ph);

  const CommCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = CommCounters{}; }

 protected:
  CommCounters counters_;
};

/// Splits `total` elements into `parts` contiguous parts as evenly as possible: the first
/// total % parts parts get one extra element. Used by all_reduce. Throws if parts < 1 or total < 0.
std::vector<int64_t> split_even(int64_t total, int parts);

/// Text added to fatal communication messages (timeouts, backend errors) of this process, e.g.
/// "step 17": the application says where it is. Not thread-safe; set between collectives.
void set_comm_context(const std::string& context);

/// True when the environment variable MFSDP_COMM_DEBUG is set to a value other than "0"/"".
bool comm_debug_from_env();

}  // namespace mfsdp
