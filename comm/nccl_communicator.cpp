// NCCL backend (CUDA buffers), bootstrapped by MPI. Compiled only when
// MFSDP_WITH_CUDA. Collectives run on a dedicated comm stream ordered against the compute stream
// by events; reductions use the same rank-ordered owner reduction as the MPI backend (grouped
// ncclSend/ncclRecv of bounded chunks, then a rank-ordered f32-accumulating kernel), so results
// are deterministic and bitwise equal to the MPI backend's. The communicator is non-blocking by
// default (ncclConfig_t::blocking = 0): an NCCL call that answers ncclInProgress is followed by
// ncclCommGetAsyncError polling until NCCL is ready, calls return once their work is enqueued,
// and a watchdog thread (nccl_watchdog.h) times the enqueued collectives.
#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "comm/comm_detail.h"
#include "comm/mpi_communicator.h"
#include "comm/nccl_kernels.h"
#include "comm/nccl_watchdog.h"

namespace mfsdp {

using detail::CallInfo;
using detail::CommOpId;
using detail::Traffic;

namespace {

// Every DType has its own case (-Wall's -Wswitch names a new one that is not mapped here); a value
// outside the enumeration is refused rather than moved as another type's bytes.
ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
  }
  throw std::invalid_argument("[nccl] unsupported dtype code " + std::to_string(static_cast<int>(dt)) +
                              ": no NCCL data type for it");
}
const unsigned char* cbytes(const void* p) { return static_cast<const unsigned char*>(p); }
unsigned char* bytes(void* p) { return static_cast<unsigned char*>(p); }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, CommOptions opts, CudaCommOptions cuda)
      : mpi_(std::make_unique<MpiCommunicator>(comm, opts)), opts_(mpi_->options()), cuda_(cuda) {
    rank_ = mpi_->rank();
    world_ = mpi_->world_size();
    local_rank_ = mpi_->local_rank();
    local_size_ = mpi_->local_size();
    compute_ = static_cast<cudaStream_t>(cuda.compute_stream);
    const ProcessDevice dev = detail::check_process_device("make_nccl_communicator");
    if (dev.local_size > dev.device_count)  // the same answer on every rank of the node
      throw std::runtime_error("[make_nccl_communicator] rank " + std::to_string(rank_) + "'s node runs " +
                               std::to_string(dev.local_size) + " processes but only " +
                               std::to_string(dev.device_count) +
                               " CUDA devices are visible (NCCL needs one GPU per rank; use "
                               "make_cuda_staged_communicator to share a GPU)");
    CallInfo boot{CommOpId::broadcast, CommPhase::other, DType::f32, sizeof(ncclUniqueId), nullptr, 0};
    ncclUniqueId id;
    if (rank_ == 0) nccl_check(ncclGetUniqueId(&id), boot, "ncclGetUniqueId", false);
    detail::mpi_check(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi_->mpi_comm()), mpi_->mpi_comm(),
                      rank_, boot, "MPI_Bcast (ncclUniqueId)");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = cuda.blocking ? 1 : 0;
    nccl_check(ncclCommInitRankConfig(&nccl_, world_, id, rank_, &config), boot, "ncclCommInitRankConfig");
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), boot, "cudaStreamCreate");
    cuda_check(cudaEventCreateWithFlags(&ev_in_, cudaEventDisableTiming), boot, "cudaEventCreate");
    cuda_check(cudaEventCreateWithFlags(&ev_out_, cudaEventDisableTiming), boot, "cudaEventCreate");
    if (!cuda.blocking) watchdog_ = std::make_unique<detail::NcclWatchdog>(nccl_, rank_, opts_.timeout_seconds, opts_.timeout_name);
  }

  ~NcclCommunicator() override {
    if (stream_) cudaStreamSynchronize(stream_);
    if (watchdog_) watchdog_->stop();
    if (stage_) cudaFree(stage_);
    if (ev_in_) cudaEventDestroy(ev_in_);
    if (ev_out_) cudaEventDestroy(ev_out_);
    if (stream_) cudaStreamDestroy(stream_);
    if (!nccl_) return;
    // a non-blocking communicator finalizes asynchronously: poll before destroying it
    if (ncclCommFinalize(nccl_) == ncclInProgress) {
      ncclResult_t state = ncclInProgress;
      while (state == ncclInProgress && ncclCommGetAsyncError(nccl_, &state) == ncclSuccess) sched_yield();
    }
    ncclCommDestroy(nccl_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  Device device() const override { return Device::CUDA; }
  const char* backend_name() const override { return "nccl"; }

  void all_gather(const void* send, void* recv, int64_t count, DType dt, CommPhase ph) override {
    detail::check_buffer("all_gather", "send", send, count);
    detail::check_buffer("all_gather", "recv", recv, count * world_);
    const std::vector<int64_t> counts(world_, count);
    CallInfo call{CommOpId::all_gather, ph, dt, count};
    const double t0 = begin(call);
    if (count > 0)
      nccl_check(ncclAllGather(send, recv, count, nccl_type(dt), nccl_, stream_), call, "ncclAllGather");
    finish(call, detail::traffic_all_gather_v(counts, rank_, dt), t0);
  }

  void all_gather_v(const void* send, void* recv, const std::vector<int64_t>& counts, DType dt,
                    CommPhase ph) override {
    const int64_t total = detail::check_counts("all_gather_v", counts, world_);
    detail::check_buffer("all_gather_v", "send", send, counts[rank_]);
    detail::check_buffer("all_gather_v", "recv", recv, total);
    CallInfo call{CommOpId::all_gather_v, ph, dt, total, &counts};
    const double t0 = begin(call);
    gather_v_impl(send, recv, counts, dt, call);
    finish(call, detail::traffic_all_gather_v(counts, rank_, dt), t0);
  }

  // Enqueued on the comm stream after the compute work queued so far; wait() makes the compute
  // stream wait for this gather only (and, when blocking, waits for the comm stream here).
  std::unique_ptr<PendingCollective> start_all_gather_v(const void* send, void* recv,
                                                        const std::vector<int64_t>& counts, DType dt,
                                                        CommPhase ph) override {
    const int64_t total = detail::check_counts("all_gather_v", counts, world_);
    detail::check_buffer("all_gather_v", "send", send, counts[rank_]);
    detail::check_buffer("all_gather_v", "recv", recv, total);
    auto p = std::make_unique<Pending>(this);
    p->counts = counts;
    p->call = CallInfo{CommOpId::all_gather_v, ph, dt, total, &p->counts};
    const double t0 = begin(p->call);
    gather_v_impl(send, recv, counts, dt, p->call);
    record_done(*p);
    account(ph, detail::traffic_all_gather_v(counts, rank_, dt), MPI_Wtime() - t0);
    return p;
  }

  void reduce_scatter(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                      CommPhase ph) override {
    detail::check_buffer("reduce_scatter", "send", send, count * world_);
    detail::check_buffer("reduce_scatter", "recv", recv, count);
    detail::check_reduce_op("reduce_scatter", op, dt, true);
    const std::vector<int64_t> counts(world_, count);
    CallInfo call{CommOpId::reduce_scatter, ph, dt, count, nullptr, -1, op};
    const double t0 = begin(call);
    reduce_scatter_v_impl(send, recv, counts, dt, op, call);
    finish(call, detail::traffic_reduce_scatter_v(counts, rank_, dt), t0);
  }

  void reduce_scatter_v(const void* send, void* recv, const std::vector<int64_t>& counts, DType dt,
                        ReduceOp op, CommPhase ph) override {
    const int64_t total = detail::check_reduce_scatter_v_args(send, recv, counts, world_, rank_, dt, op);
    CallInfo call{CommOpId::reduce_scatter_v, ph, dt, total, &counts, -1, op};
    const double t0 = begin(call);
    reduce_scatter_v_impl(send, recv, counts, dt, op, call);
    finish(call, detail::traffic_reduce_scatter_v(counts, rank_, dt), t0);
  }

  // As start_all_gather_v: enqueued on the comm stream; wait() orders the compute stream after it.
  std::unique_ptr<PendingCollective> start_reduce_scatter_v(const void* send, void* recv,
                                                            const std::vector<int64_t>& counts, DType dt,
                                                            ReduceOp op, CommPhase ph) override {
    const int64_t total = detail::check_reduce_scatter_v_args(send, recv, counts, world_, rank_, dt, op);
    auto p = std::make_unique<Pending>(this);
    p->counts = counts;
    p->call = CallInfo{CommOpId::reduce_scatter_v, ph, dt, total, &p->counts, -1, op};
    const double t0 = begin(p->call);
    reduce_scatter_v_impl(send, recv, counts, dt, op, p->call);
    record_done(*p);
    account(ph, detail::traffic_reduce_scatter_v(counts, rank_, dt), MPI_Wtime() - t0);
    return p;
  }

  void all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, CommPhase ph) override {
    detail::check_buffer("all_reduce", "buf", buf, count);
    detail::check_reduce_op("all_reduce", op, dt, false);
    CallInfo call{CommOpId::all_reduce, ph, dt, count, nullptr, -1, op};
    const double t0 = begin(call);
    const auto parts = split_even(count, world_);
    const auto off = detail::offsets_of(parts);
    unsigned char* mine = bytes(buf) + off[rank_] * dtype_size(dt);
    reduce_scatter_v_impl(buf, mine, parts, dt, op, call);
    gather_v_impl(mine, buf, parts, dt, call);
    finish(call, detail::traffic_all_reduce(count, world_, rank_, dt), t0);
  }

  double all_reduce_scalar(double value, ReduceOp op, CommPhase ph) override {
    // Host value: reduced over MPI (rank-ordered, deterministic); counted here.
    const double t0 = MPI_Wtime();
    const double r = mpi_->all_reduce_scalar(value, op, ph);
    account(ph, Traffic{8 * int64_t(world_ - 1), 8 * int64_t(world_ - 1)}, MPI_Wtime() - t0);
    return r;
  }

  void all_gather_host(const void* send, void* recv, int64_t bytes, CommPhase ph) override {
    // Host bytes over MPI; counted here.
    const double t0 = MPI_Wtime();
    mpi_->all_gather_host(send, recv, bytes, ph);
    account(ph, Traffic{bytes * (world_ - 1), bytes * (world_ - 1)}, MPI_Wtime() - t0);
  }

  void broadcast(void* buf, int64_t count, DType dt, int root, CommPhase ph) override {
    detail::check_buffer("broadcast", "buf", buf, count);
    detail::check_root("broadcast", root, world_);
    CallInfo call{CommOpId::broadcast, ph, dt, count, nullptr, root};
    const double t0 = begin(call);
    if (count > 0)
      nccl_check(ncclBroadcast(buf, buf, count, nccl_type(dt), root, nccl_, stream_), call,
                 "ncclBroadcast");
    finish(call, detail::traffic_broadcast(count, world_, rank_, root, dt), t0);
  }

  void barrier() override {
    CallInfo call{CommOpId::barrier, CommPhase::other};
    const double t0 = MPI_Wtime();
    cuda_check(cudaStreamSynchronize(stream_), call, "cudaStreamSynchronize");
    mpi_->barrier();
    account(CommPhase::other, Traffic{}, MPI_Wtime() - t0);
  }
  void set_timeout(double seconds, const std::string& name) override {
    mpi_->set_timeout(seconds, name);  // checks the value
    opts_.timeout_seconds = seconds;
    opts_.timeout_name = name;
    if (watchdog_) watchdog_->set_timeout(seconds, name);
  }

  void send_recv(const std::vector<P2P>& ops, CommPhase ph) override {
    const Traffic t = detail::check_send_recv_args(ops, world_);
    CallInfo call{CommOpId::send_recv, ph, ops.empty() ? DType::f32 : ops[0].dtype,
                  static_cast<int64_t>(ops.size())};
    const double t0 = MPI_Wtime();
    order_in(call);
    nccl_check(ncclGroupStart(), call, "ncclGroupStart");
    for (const auto& op : ops) {
      if (op.count == 0) continue;
      if (op.is_send)
        nccl_check(ncclSend(op.buf, op.count, nccl_type(op.dtype), op.peer, nccl_, stream_), call,
                   "ncclSend");
      else
        nccl_check(ncclRecv(op.buf, op.count, nccl_type(op.dtype), op.peer, nccl_, stream_), call,
                   "ncclRecv");
    }
    nccl_check(ncclGroupEnd(), call, "ncclGroupEnd");
    finish(call, t, t0);
  }

 private:
  struct Pending final : PendingCollective {
    explicit Pending(NcclCommunicator* c) : comm(c) {}
    NcclCommunicator* comm;
    std::vector<int64_t> counts;
    CallInfo call{};
    cudaEvent_t done = nullptr;
    void wait() override {
      if (!done) return;
      comm->cuda_check(cudaStreamWaitEvent(comm->compute_, done, 0), call, "cudaStreamWaitEvent");
      if (comm->cuda_.blocking) comm->wait_stream(call);
      else comm->poll_async_error(call);
      cudaEventDestroy(done);
      done = nullptr;
    }
    ~Pending() override { wait(); }
  };

  // The event a started collective's wait() makes the compute stream wait for.
  void record_done(Pending& p) {
    cuda_check(cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming), p.call, "cudaEventCreate");
    cuda_check(cudaEventRecord(p.done, stream_), p.call, "cudaEventRecord");
    watch(p.call);
  }
  // Non-blocking: the watchdog times the work enqueued for `call` on the comm stream.
  void watch(const CallInfo& call) {
    if (!watchdog_) return;
    const std::string ctx = detail::comm_context_text();
    cuda_check(watchdog_->watch(stream_, call.describe() + (ctx.empty() ? "" : " at " + ctx)), call,
               "cudaEventRecord (watchdog)");
  }
  // Debug check, then make the comm stream wait for work already queued on the compute stream.
  double begin(const CallInfo& call) {
    const double t0 = MPI_Wtime();
    mpi_->debug_check(call);
    order_in(call);
    return t0;
  }
  void order_in(const CallInfo& call) {
    cuda_check(cudaEventRecord(ev_in_, compute_), call, "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream_, ev_in_, 0), call, "cudaStreamWaitEvent");
  }
  // Make the compute stream wait for the collective; in blocking mode wait for it here.
  void finish(const CallInfo& call, const Traffic& t, double t0) {
    cuda_check(cudaEventRecord(ev_out_, stream_), call, "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(compute_, ev_out_, 0), call, "cudaStreamWaitEvent");
    if (cuda_.blocking) wait_stream(call);
    else watch(call);
    account(call.phase, t, MPI_Wtime() - t0);
  }
  // Non-blocking: an asynchronous error NCCL already knows of is reported now (no waiting).
  void poll_async_error(const CallInfo& call) {
    ncclResult_t async = ncclSuccess;
    if (nccl_) ncclCommGetAsyncError(nccl_, &async);
    if (async != ncclSuccess && async != ncclInProgress) nccl_check(async, call, "ncclCommGetAsyncError");
  }
  // A non-blocking NCCL call answered ncclInProgress: NCCL must see its state become ready
  // (ncclCommGetAsyncError) before any other NCCL call or kernel on its stream.
  ncclResult_t wait_ready(const CallInfo& call, const char* fn) {
    const double t0 = MPI_Wtime();
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) {
      const ncclResult_t r = ncclCommGetAsyncError(nccl_, &state);
      if (r != ncclSuccess) return r;
      if (opts_.timeout_seconds > 0 && MPI_Wtime() - t0 > opts_.timeout_seconds) {
        abort_comm();
        detail::comm_fatal(mpi_->mpi_comm(), rank_, call,
                           std::string(fn) + " still in progress: " +
                               detail::timeout_text(opts_.timeout_seconds, opts_.timeout_name));
      }
      if (state == ncclInProgress) sched_yield();
    }
    return state;
  }
  void abort_comm() {
    if (watchdog_) watchdog_->stop();
    if (nccl_) ncclCommAbort(nccl_);
    nccl_ = nullptr;
  }
  void wait_stream(const CallInfo& call) {
    const double t0 = MPI_Wtime();
    for (;;) {
      cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda_check(q, call, "cudaStreamQuery");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(nccl_, &async);
      if (async != ncclSuccess && async != ncclInProgress) nccl_check(async, call, "ncclCommGetAsyncError");
      if (opts_.timeout_seconds > 0 && MPI_Wtime() - t0 > opts_.timeout_seconds) {
        abort_comm();
        detail::comm_fatal(mpi_->mpi_comm(), rank_, call,
                           detail::timeout_text(opts_.timeout_seconds, opts_.timeout_name));
      }
      sched_yield();
    }
  }
  void account(CommPhase ph, const Traffic& t, double seconds) {
    auto& c = counters_.at(ph);
    c.bytes_sent += t.sent;
    c.bytes_received += t.received;
    c.calls += 1;
    c.seconds += seconds;
  }
  void cuda_check(cudaError_t e, const CallInfo& call, const char* fn) {
    if (e == cudaSuccess) return;
    abort_comm();
    detail::comm_fatal(mpi_->mpi_comm(), rank_, call,
                       std::string(fn) + " failed: " + cudaGetErrorString(e));
  }
  // Every NCCL call goes through here: ncclInProgress (non-blocking) is waited out first.
  void nccl_check(ncclResult_t r, const CallInfo& call, const char* fn, bool abort_on_error = true) {
    if (r == ncclInProgress && nccl_) r = wait_ready(call, fn);
    if (r == ncclSuccess) return;
    std::string what = std::string(fn) + " failed: " + ncclGetErrorString(r);
    const char* last = ncclGetLastError(nccl_);
    if (last && *last) what += std::string(" (") + last + ")";
    if (abort_on_error) abort_comm();
    else if (watchdog_) watchdog_->stop();
    nccl_ = nullptr;
    detail::comm_fatal(mpi_->mpi_comm(), rank_, call, what);
  }

  void gather_v_impl(const void* send, void* recv, const std::vector<int64_t>& counts, DType dt,
                     const CallInfo& call) {
    const int64_t e = dtype_size(dt);
    const auto off = detail::offsets_of(counts);
    nccl_check(ncclGroupStart(), call, "ncclGroupStart");
    for (int r = 0; r < world_; ++r) {
      if (counts[r] == 0) continue;
      void* dst = bytes(recv) + off[r] * e;
      nccl_check(ncclBroadcast(r == rank_ ? send : dst, dst, counts[r], nccl_type(dt), r, nccl_,
                               stream_),
                 call, "ncclBroadcast");
    }
    nccl_check(ncclGroupEnd(), call, "ncclGroupEnd");
  }

  void reduce_scatter_v_impl(const void* send, void* recv, const std::vector<int64_t>& counts,
                             DType dt, ReduceOp op, const CallInfo& call) {
    const int64_t e = dtype_size(dt);
    const int64_t chunk = std::max<int64_t>(1, opts_.reduce_chunk_bytes / e);
    const auto off = detail::offsets_of(counts);
    int64_t rounds = 0;
    for (int64_t c : counts) rounds = std::max(rounds, (c + chunk - 1) / chunk);
    const int64_t my_chunk = std::min(chunk, counts[rank_]);
    const int64_t need = world_ * my_chunk * e;
    if (need > stage_bytes_) {
      cuda_check(cudaStreamSynchronize(stream_), call, "cudaStreamSynchronize");
      if (stage_) cuda_check(cudaFree(stage_), call, "cudaFree");
      stage_ = nullptr;
      cuda_check(cudaMalloc(&stage_, need), call, "cudaMalloc (reduce staging)");
      stage_bytes_ = need;
    }
    for (int64_t k = 0; k < rounds; ++k) {
      const int64_t base = k * chunk;
      const int64_t n_me = std::clamp<int64_t>(counts[rank_] - base, 0, chunk);
      nccl_check(ncclGroupStart(), call, "ncclGroupStart");
      for (int j = 0; j < world_; ++j)
        if (j != rank_ && n_me > 0)
          nccl_check(ncclRecv(bytes(stage_) + j * my_chunk * e, n_me, nccl_type(dt), j, nccl_,
                              stream_),
                     call, "ncclRecv");
      for (int o = 0; o < world_; ++o) {
        const int64_t n_o = std::clamp<int64_t>(counts[o] - base, 0, chunk);
        if (o != rank_ && n_o > 0)
          nccl_check(ncclSend(cbytes(send) + (off[o] + base) * e, n_o, nccl_type(dt), o, nccl_,
                              stream_),
                     call, "ncclSend");
      }
      nccl_check(ncclGroupEnd(), call, "ncclGroupEnd");
      if (n_me == 0) continue;
      detail::launch_ordered_reduce(stage_, my_chunk, cbytes(send) + (off[rank_] + base) * e,
                                    rank_, world_, bytes(recv) + base * detail::recv_elem_bytes(dt, op), n_me, dt, op,
                                    stream_);
      cuda_check(cudaGetLastError(), call, "ordered_reduce kernel launch");
    }
  }

  std::unique_ptr<MpiCommunicator> mpi_;  // bootstrap, debug signatures, scalars, barrier
  CommOptions opts_;
  CudaCommOptions cuda_;
  int rank_ = 0, world_ = 1, local_rank_ = 0, local_size_ = 1;
  ncclComm_t nccl_ = nullptr;
  std::unique_ptr<detail::NcclWatchdog> watchdog_;  // non-blocking only
  cudaStream_t compute_ = nullptr, stream_ = nullptr;
  cudaEvent_t ev_in_ = nullptr, ev_out_ = nullptr;
  void* stage_ = nullptr;
  int64_t stage_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, CommOptions opts,
                                                     CudaCommOptions cuda) {
  return std::make_unique<NcclCommunicator>(comm, opts, cuda);
}

}  // namespace mfsdp
