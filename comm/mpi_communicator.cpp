// MPI backend: host buffers, nonblocking MPI calls waited on with an optional timeout, chunked
// messages for 64-bit counts, and the rank-ordered owner reduction for reduce_scatter(_v).
#include "comm/mpi_communicator.h"

#include <algorithm>
#include <limits>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <string>

namespace mfsdp {

using detail::CallInfo;
using detail::CommOpId;
using detail::mpi_check;
using detail::Traffic;

namespace {
// Every DType has its own case (-Wall's -Wswitch names a new one that is not mapped here): i32
// moves all four bytes, bf16 two.
MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::f32: return MPI_FLOAT;
    case DType::bf16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
  }
  throw std::invalid_argument("[mpi] unsupported dtype code " + std::to_string(static_cast<int>(dt)) +
                              ": no MPI data type for it");
}
const unsigned char* cbytes(const void* p) { return static_cast<const unsigned char*>(p); }
unsigned char* bytes(void* p) { return static_cast<unsigned char*>(p); }
constexpr int kTagP2P = 17;
constexpr int kTagColl = 23;
constexpr int kTagStartedReduce = 29;  // round 0 of a start_reduce_scatter_v, apart from blocking rounds
}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, CommOptions opts) : opts_(opts) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited)
    throw std::runtime_error("[make_mpi_communicator] MPI is not initialised (create an MpiSession first)");
  if (opts_.reduce_chunk_bytes < 4)
    throw std::invalid_argument("[make_mpi_communicator] reduce_chunk_bytes is " +
                                std::to_string(opts_.reduce_chunk_bytes) + " (must be >= 4)");
  if (opts_.max_message_elements < 1 || opts_.max_message_elements > INT_MAX)
    throw std::invalid_argument("[make_mpi_communicator] max_message_elements is " +
                                std::to_string(opts_.max_message_elements) +
                                " (must be in [1, INT_MAX])");
  set_timeout(opts_.timeout_seconds, opts_.timeout_name);  // the check of later changes
  if (comm_debug_from_env()) opts_.debug_checks = true;
  if (MPI_Comm_dup(comm, &comm_) != MPI_SUCCESS)
    throw std::runtime_error("[make_mpi_communicator] MPI_Comm_dup failed");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &world_);
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node) != MPI_SUCCESS)
    throw std::runtime_error("[make_mpi_communicator] MPI_Comm_split_type(SHARED) failed");
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_size(node, &local_size_);
  MPI_Comm_free(&node);
  probe_ = std::make_unique<detail::PeerProbe>(comm_);
}

void MpiCommunicator::set_timeout(double seconds, const std::string& name) {
  if (!(seconds >= 0))
    throw std::invalid_argument("[mpi] collective timeout " + std::to_string(seconds) + " s (must be >= 0)");
  opts_.timeout_seconds = seconds;
  opts_.timeout_name = name;
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  probe_.reset();
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::account(CommPhase ph, const Traffic& t, double seconds) {
  auto& c = counters_.at(ph);
  c.bytes_sent += t.sent;
  c.bytes_received += t.received;
  c.calls += 1;
  c.seconds += seconds;
}

void MpiCommunicator::debug_check(const CallInfo& call) {
  if (opts_.debug_checks) detail::check_signature(comm_, rank_, world_, seq_, call, opts_.timeout_seconds, opts_.timeout_name);
  ++seq_;
}

void MpiCommunicator::post_send(const void* buf, int64_t count, DType dt, int peer, const CallInfo& call,
                                std::vector<MPI_Request>& reqs, int tag) {
  const int64_t e = dtype_size(dt), m = opts_.max_message_elements;
  for (int64_t off = 0; off < count; off += m) {
    MPI_Request r;
    int n = static_cast<int>(std::min(m, count - off));
    mpi_check(MPI_Isend(cbytes(buf) + off * e, n, mpi_type(dt), peer, tag, comm_, &r), comm_, rank_, call,
              "MPI_Isend");
    reqs.push_back(r);
  }
}

void MpiCommunicator::post_recv(void* buf, int64_t count, DType dt, int peer, const CallInfo& call,
                                std::vector<MPI_Request>& reqs, int tag) {
  const int64_t e = dtype_size(dt), m = opts_.max_message_elements;
  for (int64_t off = 0; off < count; off += m) {
    MPI_Request r;
    int n = static_cast<int>(std::min(m, count - off));
    mpi_check(MPI_Irecv(bytes(buf) + off * e, n, mpi_type(dt), peer, tag, comm_, &r), comm_, rank_, call,
              "MPI_Irecv");
    reqs.push_back(r);
  }
}

void MpiCommunicator::wait_all(const CallInfo& call) {
  detail::wait_requests(static_cast<int>(reqs_.size()), reqs_.data(), opts_.timeout_seconds, comm_, rank_, call,
                        opts_.timeout_name);
  reqs_.clear();
}

// ---------------------------------------------------------------- gathers

void MpiCommunicator::gather_v_impl(const void* send, void* recv, const std::vector<int64_t>& counts,
                                    DType dt, const CallInfo& call) {
  const int64_t e = dtype_size(dt);
  const auto off = detail::offsets_of(counts);
  const int64_t total = off.back() + counts.back();
  unsigned char* mine = bytes(recv) + off[rank_] * e;
  const bool in_place = send == mine;
  if (total <= opts_.max_message_elements) {
    std::vector<int> c(world_), d(world_);
    for (int r = 0; r < world_; ++r) {
      c[r] = static_cast<int>(counts[r]);
      d[r] = static_cast<int>(off[r]);
    }
    MPI_Request req;
    mpi_check(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : send, c[rank_], mpi_type(dt), recv,
                              c.data(), d.data(), mpi_type(dt), comm_, &req),
              comm_, rank_, call, "MPI_Iallgatherv");
    reqs_.push_back(req);
    wait_all(call);
    return;
  }
  // Large buffers: direct point-to-point exchange in messages of at most max_message_elements.
  if (!in_place && counts[rank_] > 0) std::memcpy(mine, send, counts[rank_] * e);
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    post_recv(bytes(recv) + off[r] * e, counts[r], dt, r, call, reqs_, kTagColl);
    post_send(send, counts[rank_], dt, r, call, reqs_, kTagColl);
  }
  wait_all(call);
}

void MpiCommunicator::all_gather(const void* send, void* recv, int64_t count, DType dt,
                                 CommPhase ph) {
  detail::check_buffer("all_gather", "send", send, count);
  detail::check_buffer("all_gather", "recv", recv, count * world_);
  const std::vector<int64_t> counts(world_, count);
  CallInfo call{CommOpId::all_gather, ph, dt, count};
  const double t0 = MPI_Wtime();
  debug_check(call);
  gather_v_impl(send, recv, counts, dt, call);
  account(ph, detail::traffic_all_gather_v(counts, rank_, dt), MPI_Wtime() - t0);
}

namespace {

// A started MPI_Iallgatherv: owns the int counts and displacements MPI reads until completion,
// and the call description for timeout messages.
struct MpiPendingGather final : PendingCollective {
  std::vector<int64_t> counts;
  std::vector<int> c, d;
  CallInfo call;
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  double timeout = 0;
  std::string timeout_name;
  PhaseCounters* counter = nullptr;
  void wait() override {
    if (req == MPI_REQUEST_NULL) return;
    const double t0 = MPI_Wtime();
    detail::wait_requests(1, &req, timeout, comm, rank, call, timeout_name);
    req = MPI_REQUEST_NULL;
    counter->seconds += MPI_Wtime() - t0;
  }
  ~MpiPendingGather() override { wait(); }
};

}  // namespace

std::unique_ptr<PendingCollective> MpiCommunicator::start_all_gather_v(const void* send, void* recv,
                                                                       const std::vector<int64_t>& counts, DType dt,
                                                                       CommPhase ph) {
  const int64_t total = detail::check_counts("all_gather_v", counts, world_);
  if (total > opts_.max_message_elements) return Communicator::start_all_gather_v(send, recv, counts, dt, ph);
  detail::check_buffer("all_gather_v", "send", send, counts[rank_]);
  detail::check_buffer("all_gather_v", "recv", recv, total);
  auto p = std::make_unique<MpiPendingGather>();
  p->counts = counts;
  p->call = CallInfo{CommOpId::all_gather_v, ph, dt, total, &p->counts};
  const double t0 = MPI_Wtime();
  debug_check(p->call);
  const auto off = detail::offsets_of(counts);
  for (int r = 0; r < world_; ++r) {
    p->c.push_back(static_cast<int>(counts[r]));
    p->d.push_back(static_cast<int>(off[r]));
  }
  const bool in_place = send == bytes(recv) + off[rank_] * dtype_size(dt);
  mpi_check(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : send, p->c[rank_], mpi_type(dt), recv, p->c.data(),
                            p->d.data(), mpi_type(dt), comm_, &p->req),
            comm_, rank_, p->call, "MPI_Iallgatherv");
  p->comm = comm_;
  p->rank = rank_;
  p->timeout = opts_.timeout_seconds;
  p->timeout_name = opts_.timeout_name;
  p->counter = &counters_.at(ph);
  account(ph, detail::traffic_all_gather_v(counts, rank_, dt), MPI_Wtime() - t0);
  return p;
}

void MpiCommunicator::all_gather_v(const void* send, void* recv, const std::vector<int64_t>& counts,
                                   DType dt, CommPhase ph) {
  const int64_t total = detail::check_counts("all_gather_v", counts, world_);
  detail::check_buffer("all_gather_v", "send", send, counts[rank_]);
  detail::check_buffer("all_gather_v", "recv", recv, total);
  CallInfo call{CommOpId::all_gather_v, ph, dt, total, &counts};
  const double t0 = MPI_Wtime();
  debug_check(call);
  gather_v_impl(send, recv, counts, dt, call);
  account(ph, detail::traffic_all_gather_v(counts, rank_, dt), MPI_Wtime() - t0);
}

// ---------------------------------------------------------------- reductions

MpiCommunicator::ReduceRounds MpiCommunicator::reduce_rounds(const std::vector<int64_t>& counts, DType dt) const {
  ReduceRounds r;
  r.chunk = std::max<int64_t>(1, std::min(opts_.reduce_chunk_bytes / dtype_size(dt), opts_.max_message_elements));
  for (int64_t c : counts) r.rounds = std::max(r.rounds, (c + r.chunk - 1) / r.chunk);  // the same on every rank
  r.my_chunk = std::min(r.chunk, counts[rank_]);
  return r;
}

void MpiCommunicator::post_reduce_round(int64_t k, const ReduceRounds& r, const void* send,
                                        const std::vector<int64_t>& counts, DType dt, const CallInfo& call,
                                        unsigned char* stage, std::vector<MPI_Request>& reqs, int tag) {
  const int64_t e = dtype_size(dt), base = k * r.chunk;
  const auto off = detail::offsets_of(counts);
  const int64_t n_me = std::clamp<int64_t>(counts[rank_] - base, 0, r.chunk);
  for (int j = 0; j < world_; ++j)
    if (j != rank_ && n_me > 0) post_recv(stage + j * r.my_chunk * e, n_me, dt, j, call, reqs, tag);
  for (int o = 0; o < world_; ++o) {
    const int64_t n_o = std::clamp<int64_t>(counts[o] - base, 0, r.chunk);
    if (o != rank_ && n_o > 0) post_send(cbytes(send) + (off[o] + base) * e, n_o, dt, o, call, reqs, tag);
  }
}

void MpiCommunicator::finish_reduce_round(int64_t k, const ReduceRounds& r, const void* send, void* recv,
                                          const std::vector<int64_t>& counts, DType dt, ReduceOp op,
                                          const unsigned char* stage) {
  const int64_t e = dtype_size(dt), base = k * r.chunk;
  const int64_t n_me = std::clamp<int64_t>(counts[rank_] - base, 0, r.chunk);
  if (n_me == 0) return;
  const int64_t mine = detail::offsets_of(counts)[rank_];
  if (static_cast<int64_t>(acc_.size()) < r.my_chunk) acc_.resize(static_cast<size_t>(r.my_chunk));
  std::vector<const void*> srcs(world_);
  for (int j = 0; j < world_; ++j)
    srcs[j] = j == rank_ ? static_cast<const void*>(cbytes(send) + (mine + base) * e)
                         : static_cast<const void*>(stage + j * r.my_chunk * e);
  detail::host_ordered_reduce(srcs, bytes(recv) + base * detail::recv_elem_bytes(dt, op), n_me, dt, op, acc_.data());
}

void MpiCommunicator::reduce_scatter_v_impl(const void* send, void* recv, const std::vector<int64_t>& counts,
                                            DType dt, ReduceOp op, const CallInfo& call, int64_t first_round) {
  const ReduceRounds r = reduce_rounds(counts, dt);
  if (static_cast<int64_t>(stage_.size()) < world_ * r.my_chunk * dtype_size(dt))
    stage_.resize(static_cast<size_t>(world_ * r.my_chunk * dtype_size(dt)));
  for (int64_t k = first_round; k < r.rounds; ++k) {
    post_reduce_round(k, r, send, counts, dt, call, stage_.data(), reqs_, kTagColl);
    wait_all(call);
    finish_reduce_round(k, r, send, recv, counts, dt, op, stage_.data());
  }
}

// A started reduce_scatter_v: round 0's messages are in flight (own staging, own tag, so other
// collectives may run before wait()); wait() completes them, reduces round 0 in rank order and
// runs any further rounds as the blocking call does.
struct MpiCommunicator::PendingReduce final : PendingCollective {
  MpiCommunicator* comm = nullptr;
  const void* send = nullptr;
  void* recv = nullptr;
  std::vector<int64_t> counts;
  DType dt = DType::f32;
  ReduceOp op = ReduceOp::sum;
  CallInfo call;
  std::vector<unsigned char> stage;
  std::vector<MPI_Request> reqs;
  bool done = false;
  void wait() override {
    if (done) return;
    done = true;
    comm->finish_started_reduce(*this);
  }
  ~PendingReduce() override { wait(); }
};

std::unique_ptr<PendingCollective> MpiCommunicator::start_reduce_scatter_v(const void* send, void* recv,
                                                                           const std::vector<int64_t>& counts,
                                                                           DType dt, ReduceOp op, CommPhase ph) {
  const int64_t total = detail::check_reduce_scatter_v_args(send, recv, counts, world_, rank_, dt, op);
  auto p = std::make_unique<PendingReduce>();
  p->comm = this;
  p->send = send;
  p->recv = recv;
  p->counts = counts;
  p->dt = dt;
  p->op = op;
  p->call = CallInfo{CommOpId::reduce_scatter_v, ph, dt, total, &p->counts, -1, op};
  const double t0 = MPI_Wtime();
  debug_check(p->call);
  const ReduceRounds r = reduce_rounds(counts, dt);
  if (r.rounds > 0) {
    if (!spare_stages_.empty()) {  // reuse a finished handle's staging: no allocation in the steady state
      p->stage = std::move(spare_stages_.back());
      spare_stages_.pop_back();
    }
    if (p->stage.size() < static_cast<size_t>(world_ * r.my_chunk * dtype_size(dt)))
      p->stage.resize(static_cast<size_t>(world_ * r.my_chunk * dtype_size(dt)));
    post_reduce_round(0, r, send, counts, dt, p->call, p->stage.data(), p->reqs, kTagStartedReduce);
  }
  account(ph, detail::traffic_reduce_scatter_v(counts, rank_, dt), MPI_Wtime() - t0);
  return p;
}

void MpiCommunicator::finish_started_reduce(PendingReduce& p) {
  const double t0 = MPI_Wtime();
  const ReduceRounds r = reduce_rounds(p.counts, p.dt);
  if (r.rounds > 0) {
    detail::wait_requests(static_cast<int>(p.reqs.size()), p.reqs.data(), opts_.timeout_seconds, comm_, rank_, p.call,
                          opts_.timeout_name);
    finish_reduce_round(0, r, p.send, p.recv, p.counts, p.dt, p.op, p.stage.data());
    reduce_scatter_v_impl(p.send, p.recv, p.counts, p.dt, p.op, p.call, 1);
    spare_stages_.push_back(std::move(p.stage));
  }
  counters_.at(p.call.phase).seconds += MPI_Wtime() - t0;
}

void MpiCommunicator::reduce_scatter(const void* send, void* recv, int64_t count, DType dt,
                                     ReduceOp op, CommPhase ph) {
  detail::check_buffer("reduce_scatter", "send", send, count * world_);
  detail::check_buffer("reduce_scatter", "recv", recv, count);
  detail::check_reduce_op("reduce_scatter", op, dt, true);
  const std::vector<int64_t> counts(world_, count);
  CallInfo call{CommOpId::reduce_scatter, ph, dt, count, nullptr, -1, op};
  const double t0 = MPI_Wtime();
  debug_check(call);
  reduce_scatter_v_impl(send, recv, counts, dt, op, call);
  account(ph, detail::traffic_reduce_scatter_v(counts, rank_, dt), MPI_Wtime() - t0);
}

void MpiCommunicator::reduce_scatter_v(const void* send, void* recv,
                                       const std::vector<int64_t>& counts, DType dt, ReduceOp op,
                                       CommPhase ph) {
  const int64_t total = detail::check_reduce_scatter_v_args(send, recv, counts, world_, rank_, dt, op);
  CallInfo call{CommOpId::reduce_scatter_v, ph, dt, total, &counts, -1, op};
  const double t0 = MPI_Wtime();
  debug_check(call);
  reduce_scatter_v_impl(send, recv, counts, dt, op, call);
  account(ph, detail::traffic_reduce_scatter_v(counts, rank_, dt), MPI_Wtime() - t0);
}

void MpiCommunicator::all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, CommPhase ph) {
  detail::check_buffer("all_reduce", "buf", buf, count);
  detail::check_reduce_op("all_reduce", op, dt, false);
  CallInfo call{CommOpId::all_reduce, ph, dt, count, nullptr, -1, op};
  const double t0 = MPI_Wtime();
  debug_check(call);
  const auto parts = split_even(count, world_);
  const auto off = detail::offsets_of(parts);
  unsigned char* mine = bytes(buf) + off[rank_] * dtype_size(dt);
  reduce_scatter_v_impl(buf, mine, parts, dt, op, call);  // in place into this rank's part
  gather_v_impl(mine, buf, parts, dt, call);               // in place gather
  account(ph, detail::traffic_all_reduce(count, world_, rank_, dt), MPI_Wtime() - t0);
}

double MpiCommunicator::all_reduce_scalar(double value, ReduceOp op, CommPhase ph) {
  CallInfo call{CommOpId::all_reduce_scalar, ph, DType::f32, 1, nullptr, -1, op};
  const double t0 = MPI_Wtime();
  debug_check(call);
  std::vector<double> all(world_);
  MPI_Request req;
  mpi_check(MPI_Iallgather(&value, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, comm_, &req), comm_,
            rank_, call, "MPI_Iallgather");
  reqs_.push_back(req);
  wait_all(call);
  double r = all[0];
  for (int j = 1; j < world_; ++j) r = op == ReduceOp::max ? std::max(r, all[j]) : r + all[j];
  if (op == ReduceOp::mean) r /= world_;
  account(ph, Traffic{8 * int64_t(world_ - 1), 8 * int64_t(world_ - 1)}, MPI_Wtime() - t0);
  return r;
}

void MpiCommunicator::all_gather_host(const void* send, void* recv, int64_t bytes, CommPhase ph) {
  detail::check_buffer("all_gather_host", "send", send, bytes);
  detail::check_buffer("all_gather_host", "recv", recv, bytes * world_);
  if (bytes > std::numeric_limits<int>::max())
    throw std::invalid_argument("[all_gather_host] " + std::to_string(bytes) + " bytes is more than one MPI message");
  CallInfo call{CommOpId::all_gather_host, ph, DType::f32, bytes};
  const double t0 = MPI_Wtime();
  debug_check(call);
  MPI_Request req;
  mpi_check(MPI_Iallgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE, comm_, &req),
            comm_, rank_, call, "MPI_Iallgather");
  reqs_.push_back(req);
  wait_all(call);
  account(ph, Traffic{bytes * (world_ - 1), bytes * (world_ - 1)}, MPI_Wtime() - t0);
}

void MpiCommunicator::broadcast(void* buf, int64_t count, DType dt, int root, CommPhase ph) {
  detail::check_buffer("broadcast", "buf", buf, count);
  detail::check_root("broadcast", root, world_);
  CallInfo call{CommOpId::broadcast, ph, dt, count, nullptr, root};
  const double t0 = MPI_Wtime();
  debug_check(call);
  const int64_t e = dtype_size(dt), m = opts_.max_message_elements;
  for (int64_t o = 0; o < count; o += m) {
    MPI_Request req;
    mpi_check(MPI_Ibcast(bytes(buf) + o * e, static_cast<int>(std::min(m, count - o)), mpi_type(dt),
                         root, comm_, &req),
              comm_, rank_, call, "MPI_Ibcast");
    reqs_.push_back(req);
  }
  wait_all(call);
  account(ph, detail::traffic_broadcast(count, world_, rank_, root, dt), MPI_Wtime() - t0);
}

void MpiCommunicator::barrier() {
  CallInfo call{CommOpId::barrier, CommPhase::other};
  const double t0 = MPI_Wtime();
  debug_check(call);
  MPI_Request req;
  mpi_check(MPI_Ibarrier(comm_, &req), comm_, rank_, call, "MPI_Ibarrier");
  reqs_.push_back(req);
  wait_all(call);
  account(CommPhase::other, Traffic{}, MPI_Wtime() - t0);
}

void MpiCommunicator::send_recv(const std::vector<P2P>& ops, CommPhase ph) {
  const Traffic t = detail::check_send_recv_args(ops, world_);
  CallInfo call{CommOpId::send_recv, ph, ops.empty() ? DType::f32 : ops[0].dtype,
                static_cast<int64_t>(ops.size())};
  const double t0 = MPI_Wtime();
  for (const auto& op : ops) {
    if (op.is_send) post_send(op.buf, op.count, op.dtype, op.peer, call, reqs_, kTagP2P);
    else post_recv(op.buf, op.count, op.dtype, op.peer, call, reqs_, kTagP2P);
  }
  wait_all(call);
  account(ph, t, MPI_Wtime() - t0);
}

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, CommOptions opts) {
  return std::make_unique<MpiCommunicator>(comm, opts);
}

}  // namespace mfsdp
