// Backend-independent parts of the comm layer: names, counters, argument checks,
// byte formulas, debug signatures, the fatal-error path and the host rank-ordered reduction.
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "comm/comm_detail.h"
#include "comm/communicator.h"
#include "comm/peer_probe.h"

namespace mfsdp {

const char* comm_phase_name(CommPhase p) {
  switch (p) {
    case CommPhase::fwd_gather: return "fwd_gather";
    case CommPhase::bwd_gather: return "bwd_gather";
    case CommPhase::grad_reduce: return "grad_reduce";
    case CommPhase::opt_step: return "opt_step";
    case CommPhase::other: return "other";
    case CommPhase::experts: return "experts";
    default: return "?";
  }
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::mean: return "mean";
    case ReduceOp::max: return "max";
    case ReduceOp::accumulate: return "accumulate";
  }
  return "?";
}

PhaseCounters& PhaseCounters::operator+=(const PhaseCounters& o) {
  bytes_sent += o.bytes_sent;
  bytes_received += o.bytes_received;
  calls += o.calls;
  seconds += o.seconds;
  return *this;
}

PhaseCounters CommCounters::total() const {
  PhaseCounters t;
  for (const auto& p : phase) t += p;
  return t;
}

std::vector<int64_t> split_even(int64_t total, int parts) {
  if (parts < 1 || total < 0)
    throw std::invalid_argument("[split_even] total " + std::to_string(total) + ", parts " +
                                std::to_string(parts) + " (need total >= 0, parts >= 1)");
  std::vector<int64_t> out(parts, total / parts);
  for (int64_t i = 0; i < total % parts; ++i) out[i] += 1;
  return out;
}

bool comm_debug_from_env() {
  const char* v = std::getenv("MFSDP_COMM_DEBUG");
  return v && *v && std::string(v) != "0";
}


namespace {
struct CompletedCollective final : PendingCollective {
  void wait() override {}
};
}  // namespace

std::unique_ptr<PendingCollective> Communicator::start_all_gather_v(const void* send, void* recv,
                                                                    const std::vector<int64_t>& counts, DType dt,
                                                                    CommPhase ph) {
  all_gather_v(send, recv, counts, dt, ph);
  return std::make_unique<CompletedCollective>();
}

std::unique_ptr<PendingCollective> Communicator::start_reduce_scatter_v(const void* send, void* recv,
                                                                        const std::vector<int64_t>& counts, DType dt,
                                                                        ReduceOp op, CommPhase ph) {
  reduce_scatter_v(send, recv, counts, dt, op, ph);
  return std::make_unique<CompletedCollective>();
}

std::vector<int64_t> Communicator::exchange_counts(const std::vector<int64_t>& send_counts, CommPhase ph) {
  const int n = world_size();
  detail::check_counts("exchange_counts", send_counts, n);
  std::vector<int64_t> all(static_cast<size_t>(n) * n);
  all_gather_host(send_counts.data(), all.data(), static_cast<int64_t>(sizeof(int64_t)) * n, ph);
  std::vector<int64_t> recv(static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) recv[static_cast<size_t>(s)] = all[static_cast<size_t>(s) * n + rank()];
  return recv;
}

void Communicator::all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                                const std::vector<int64_t>& recv_counts, DType dt, CommPhase ph) {
  const int n = world_size(), me = rank();
  const int64_t sent = detail::check_counts("all_to_all_v", send_counts, n);
  const int64_t received = detail::check_counts("all_to_all_v", recv_counts, n);
  detail::check_buffer("all_to_all_v", "send", send, sent);
  detail::check_buffer("all_to_all_v", "recv", recv, received);
  if (send_counts[me] != recv_counts[me])
    throw std::invalid_argument("[all_to_all_v] rank " + std::to_string(me) + " sends itself " +
                                std::to_string(send_counts[me]) + " elements but expects " +
                                std::to_string(recv_counts[me]));
  const int64_t e = dtype_size(dt);
  const std::vector<int64_t> send_at = detail::offsets_of(send_counts), recv_at = detail::offsets_of(recv_counts);
  std::vector<P2P> ops;
  for (int r = 0; r < n; ++r) {
    if (recv_counts[r] > 0)
      ops.push_back({false, r, static_cast<unsigned char*>(recv) + recv_at[r] * e, recv_counts[r], dt});
    if (send_counts[r] > 0)
      ops.push_back({true, r, const_cast<unsigned char*>(static_cast<const unsigned char*>(send)) + send_at[r] * e,
                     send_counts[r], dt});
  }
  send_recv(ops, ph);
  PhaseCounters& c = counters_.at(ph);  // the own segment is a local copy, not traffic
  c.bytes_sent -= send_counts[me] * e;
  c.bytes_received -= recv_counts[me] * e;
}

namespace detail {

const char* comm_op_name(CommOpId op) {
  switch (op) {
    case CommOpId::all_gather: return "all_gather";
    case CommOpId::all_gather_v: return "all_gather_v";
    case CommOpId::reduce_scatter: return "reduce_scatter";
    case CommOpId::reduce_scatter_v: return "reduce_scatter_v";
    case CommOpId::all_reduce: return "all_reduce";
    case CommOpId::all_reduce_scalar: return "all_reduce_scalar";
    case CommOpId::all_gather_host: return "all_gather_host";
    case CommOpId::broadcast: return "broadcast";
    case CommOpId::barrier: return "barrier";
    case CommOpId::send_recv: return "send_recv";
  }
  return "?";
}

std::string CallInfo::describe() const {
  std::ostringstream os;
  os << comm_op_name(op) << "(" << dtype_name(dtype);
  if (counts) {
    int64_t total = 0;
    os << ", counts=[";
    for (size_t i = 0; i < counts->size(); ++i) {
      if (i < 16) os << (i ? "," : "") << (*counts)[i];
      total += (*counts)[i];
    }
    if (counts->size() > 16) os << ",...";
    os << "] total " << total;
  } else {
    os << ", count " << count;
  }
  if (op == CommOpId::reduce_scatter || op == CommOpId::reduce_scatter_v ||
      op == CommOpId::all_reduce || op == CommOpId::all_reduce_scalar)
    os << ", op " << reduce_op_name(reduce);
  if (root >= 0) os << ", root " << root;
  os << ", phase " << comm_phase_name(phase) << ")";
  return os.str();
}

Traffic traffic_all_gather_v(const std::vector<int64_t>& counts, int rank, DType dt) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  const int64_t n = static_cast<int64_t>(counts.size()), e = dtype_size(dt);
  return {counts[rank] * (n - 1) * e, (total - counts[rank]) * e};
}

Traffic traffic_reduce_scatter_v(const std::vector<int64_t>& counts, int rank, DType dt) {
  Traffic t = traffic_all_gather_v(counts, rank, dt);
  return {t.received, t.sent};
}

Traffic traffic_all_reduce(int64_t count, int world, int rank, DType dt) {
  auto parts = split_even(count, world);
  Traffic a = traffic_reduce_scatter_v(parts, rank, dt), b = traffic_all_gather_v(parts, rank, dt);
  return {a.sent + b.sent, a.received + b.received};
}

Traffic traffic_broadcast(int64_t count, int world, int rank, int root, DType dt) {
  const int64_t e = dtype_size(dt);
  if (rank == root) return {count * (world - 1) * e, 0};
  return {0, count * e};
}

int64_t check_counts(const char* op, const std::vector<int64_t>& counts, int world) {
  if (static_cast<int>(counts.size()) != world)
    throw std::invalid_argument(std::string("[") + op + "] counts has " +
                                std::to_string(counts.size()) + " entries, world size is " +
                                std::to_string(world));
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] < 0)
      throw std::invalid_argument(std::string("[") + op + "] counts[" + std::to_string(r) +
                                  "] is " + std::to_string(counts[r]) + " (must be >= 0)");
    total += counts[r];
  }
  return total;
}

void check_buffer(const char* op, const char* which, const void* ptr, int64_t count) {
  if (count < 0)
    throw std::invalid_argument(std::string("[") + op + "] " + which + " count is " +
                                std::to_string(count) + " (must be >= 0)");
  if (count > 0 && ptr == nullptr)
    throw std::invalid_argument(std::string("[") + op + "] " + which + " is null but has " +
                                std::to_string(count) + " elements");
}

Traffic check_send_recv_args(const std::vector<Communicator::P2P>& ops, int world) {
  Traffic t;
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& op = ops[i];
    if (op.peer < 0 || op.peer >= world)
      throw std::invalid_argument("[send_recv] op " + std::to_string(i) + " peer " + std::to_string(op.peer) +
                                  " is outside [0, " + std::to_string(world) + ")");
    check_buffer("send_recv", op.is_send ? "send buf" : "recv buf", op.buf, op.count);
    (op.is_send ? t.sent : t.received) += op.count * dtype_size(op.dtype);
  }
  return t;
}

void check_root(const char* op, int root, int world) {
  if (root < 0 || root >= world)
    throw std::invalid_argument(std::string("[") + op + "] root " + std::to_string(root) + " is outside [0, " +
                                std::to_string(world) + ")");
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) off[i] = off[i - 1] + counts[i - 1];
  return off;
}

namespace {
std::string& comm_context() {
  static std::string context;
  return context;
}
}  // namespace

std::string comm_context_text() { return comm_context(); }

void comm_fatal(MPI_Comm comm, int rank, const CallInfo& call, const std::string& what) {
  const std::string& ctx = comm_context();
  PeerProbe* probe = PeerProbe::find(comm);  // which peers still answer, named by node
  const std::string node = probe ? " on " + probe->my_node() : "";
  const std::string peers = probe ? "; " + probe->probe(kPeerProbeSeconds) : "";
  std::fprintf(stderr, "[comm] rank %d%s: %s in %s%s%s%s; aborting the job\n", rank, node.c_str(), what.c_str(),
               call.describe().c_str(), ctx.empty() ? "" : " at ", ctx.c_str(), peers.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  end_process_after_grace(3);
  MPI_Abort(comm == MPI_COMM_NULL ? MPI_COMM_WORLD : comm, 3);
  std::abort();  // not reached
}

void mpi_check(int rc, MPI_Comm comm, int rank, const CallInfo& call, const char* mpi_fn) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  comm_fatal(comm, rank, call, std::string(mpi_fn) + " failed: " + std::string(msg, len));
}

namespace {
constexpr int kSigFields = 9;
void fill_signature(int64_t* s, int64_t seq, const CallInfo& c) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the counts
  int64_t n = 0, total = c.count;
  if (c.counts) {
    n = static_cast<int64_t>(c.counts->size());
    total = 0;
    for (int64_t v : *c.counts) {
      total += v;
      for (int b = 0; b < 8; ++b) {
        h ^= (static_cast<uint64_t>(v) >> (8 * b)) & 0xffu;
        h *= 1099511628211ull;
      }
    }
  }
  s[0] = seq;
  s[1] = static_cast<int64_t>(c.op);
  s[2] = static_cast<int64_t>(c.dtype);
  s[3] = static_cast<int64_t>(c.reduce);
  s[4] = c.root;
  s[5] = static_cast<int64_t>(c.phase);
  s[6] = n;
  s[7] = total;
  s[8] = static_cast<int64_t>(h);
}
std::string describe_signature(const int64_t* s) {
  std::ostringstream os;
  os << comm_op_name(static_cast<CommOpId>(s[1])) << "(" << dtype_name(static_cast<DType>(s[2]));
  if (s[6] > 0)
    os << ", " << s[6] << " counts total " << s[7] << " hash 0x" << std::hex << s[8] << std::dec;
  else
    os << ", count " << s[7];
  const auto op = static_cast<CommOpId>(s[1]);
  if (op == CommOpId::reduce_scatter || op == CommOpId::reduce_scatter_v ||
      op == CommOpId::all_reduce || op == CommOpId::all_reduce_scalar)
    os << ", op " << reduce_op_name(static_cast<ReduceOp>(s[3]));
  if (s[4] >= 0) os << ", root " << s[4];
  os << ", phase " << comm_phase_name(static_cast<CommPhase>(s[5])) << ", collective #" << s[0]
     << ")";
  return os.str();
}
}  // namespace

std::string timeout_text(double seconds, const std::string& name) {
  char s[64];
  std::snprintf(s, sizeof(s), "%g", seconds);
  return std::string("timed out after ") + s + " s (" + (name.empty() ? "" : name + "; ") +
         "another rank is missing or stuck)";
}

void wait_requests(int n, MPI_Request* reqs, double timeout_seconds, MPI_Comm comm, int rank, const CallInfo& call,
                   const std::string& timeout_name) {
  if (n == 0) return;
  if (timeout_seconds <= 0) {
    mpi_check(MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE), comm, rank, call, "MPI_Waitall");
    return;
  }
  const double t0 = MPI_Wtime();
  for (int done = 0;;) {
    mpi_check(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), comm, rank, call, "MPI_Testall");
    if (done) return;
    PeerProbe::answer_pings();  // a peer whose collective failed asks who is alive
    if (MPI_Wtime() - t0 > timeout_seconds)
      comm_fatal(comm, rank, call, timeout_text(timeout_seconds, timeout_name));
    sched_yield();
  }
}

void check_signature(MPI_Comm comm, int rank, int world, int64_t seq, const CallInfo& call,
                     double timeout_seconds, const std::string& timeout_name) {
  int64_t mine[kSigFields];
  fill_signature(mine, seq, call);
  std::vector<int64_t> all(static_cast<size_t>(kSigFields) * world);
  MPI_Request req;
  mpi_check(MPI_Iallgather(mine, kSigFields, MPI_INT64_T, all.data(), kSigFields, MPI_INT64_T, comm, &req),
            comm, rank, call, "MPI_Iallgather (debug signature)");
  wait_requests(1, &req, timeout_seconds, comm, rank, call, timeout_name);  // the same timeout as the collective it guards
  for (int r = 1; r < world; ++r) {
    const int64_t* a = all.data();
    const int64_t* b = all.data() + static_cast<size_t>(r) * kSigFields;
    if (std::equal(a, a + kSigFields, b)) continue;
    std::fprintf(stderr,
                 "[comm debug] rank %d: collective #%lld mismatch: rank 0 called %s but rank %d "
                 "called %s; this rank called %s; aborting the job\n",
                 rank, static_cast<long long>(seq), describe_signature(a).c_str(), r,
                 describe_signature(b).c_str(), call.describe().c_str());
    std::fflush(stderr);
    // Give the other ranks a moment to print their copy of the report before the abort.
    MPI_Barrier(comm);
    MPI_Abort(comm, 4);
    std::abort();
  }
}

int64_t check_reduce_scatter_v_args(const void* send, const void* recv, const std::vector<int64_t>& counts,
                                    int world, int rank, DType dt, ReduceOp op) {
  const int64_t total = check_counts("reduce_scatter_v", counts, world);
  check_buffer("reduce_scatter_v", "send", send, total);
  check_buffer("reduce_scatter_v", "recv", recv, counts[rank]);
  check_reduce_op("reduce_scatter_v", op, dt, true);
  return total;
}

void check_reduce_op(const char* op, ReduceOp reduce, DType dt, bool allow_accumulate) {
  if (dt != DType::f32 && dt != DType::bf16)  // i32 has no arithmetic here: it is only moved
    throw std::invalid_argument(std::string("[") + op + "] reductions take f32 or bf16 values, got " +
                                dtype_name(dt) + " (" + reduce_op_name(reduce) + ")");
  if (reduce != ReduceOp::accumulate) return;
  if (!allow_accumulate)
    throw std::invalid_argument(std::string("[") + op + "] ReduceOp::accumulate is only defined for reduce_scatter(_v)");
  if (dt != DType::f32 && dt != DType::bf16)
    throw std::invalid_argument(std::string("[") + op + "] ReduceOp::accumulate needs f32 or bf16 contributions, got " +
                                dtype_name(dt));
}

void host_ordered_reduce(const std::vector<const void*>& srcs, void* out, int64_t n, DType dt,
                         ReduceOp op, float* acc) {
  const size_t k = srcs.size();
  auto load = [dt](const void* p, int64_t i) {
    return dt == DType::f32 ? static_cast<const float*>(p)[i] : bf16_to_float(static_cast<const bf16*>(p)[i]);
  };
  if (op == ReduceOp::max) {
    for (int64_t i = 0; i < n; ++i) acc[i] = load(srcs[0], i);
    for (size_t j = 1; j < k; ++j)
      for (int64_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], load(srcs[j], i));
  } else {
    if (op == ReduceOp::accumulate) {
      std::copy(static_cast<const float*>(out), static_cast<const float*>(out) + n, acc);
    } else {
      std::fill(acc, acc + n, 0.0f);
    }
    for (size_t j = 0; j < k; ++j) {
      if (dt == DType::f32) {
        const float* s = static_cast<const float*>(srcs[j]);
        for (int64_t i = 0; i < n; ++i) acc[i] += s[i];
      } else {
        for (int64_t i = 0; i < n; ++i) acc[i] += load(srcs[j], i);
      }
    }
    if (op == ReduceOp::mean) {
      const float div = static_cast<float>(k);
      for (int64_t i = 0; i < n; ++i) acc[i] /= div;
    }
  }
  if (dt == DType::f32 || op == ReduceOp::accumulate) {  // accumulate's running sums are f32
    std::copy(acc, acc + n, static_cast<float*>(out));
  } else {
    bf16* o = static_cast<bf16*>(out);
    for (int64_t i = 0; i < n; ++i) o[i] = float_to_bf16(acc[i]);
  }
}

}  // namespace detail

void set_comm_context(const std::string& context) { detail::comm_context() = context; }
}  // namespace mfsdp
