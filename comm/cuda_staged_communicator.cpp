// Host-staged CUDA backend: device buffers are copied to pinned host memory, reduced/moved by the
// MPI backend, and copied back. Several ranks may share one GPU (NCCL refuses that), so multi-rank
// GPU tests on one device use this path. Compiled only when MFSDP_WITH_CUDA.
#include <cuda_runtime.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "comm/comm_detail.h"
#include "comm/mpi_communicator.h"

namespace mfsdp {

using detail::CallInfo;
using detail::CommOpId;

namespace {

/// Grow-only pinned host buffer.
struct PinnedBuffer {
  void* p = nullptr;
  int64_t bytes = 0;
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (p) cudaFreeHost(p);
  }
  void* get(int64_t need) {
    if (need <= bytes) return p;
    if (p) cudaFreeHost(p);
    p = nullptr;
    bytes = 0;
    if (need > 0) {
      cudaError_t e = cudaMallocHost(&p, need);
      if (e != cudaSuccess)
        throw std::runtime_error("[cuda_staged] cudaMallocHost(" + std::to_string(need) +
                                 " bytes) failed: " + cudaGetErrorString(e));
      bytes = need;
    }
    return p;
  }
};

class CudaStagedCommunicator final : public Communicator {
 public:
  CudaStagedCommunicator(MPI_Comm comm, CommOptions opts, CudaCommOptions cuda)
      : mpi_(std::make_unique<MpiCommunicator>(comm, opts)),
        compute_(static_cast<cudaStream_t>(cuda.compute_stream)) {
    detail::check_process_device("make_cuda_staged_communicator");  // ranks may share it
  }

  int rank() const override { return mpi_->rank(); }
  int world_size() const override { return mpi_->world_size(); }
  int local_rank() const override { return mpi_->local_rank(); }
  int local_size() const override { return mpi_->local_size(); }
  Device device() const override { return Device::CUDA; }
  const char* backend_name() const override { return "cuda_staged"; }

  void all_gather(const void* send, void* recv, int64_t count, DType dt, CommPhase ph) override {
    const int64_t e = dtype_size(dt);
    detail::check_buffer("all_gather", "send", send, count);
    CallInfo call{CommOpId::all_gather, ph, dt, count};
    Scope s(this, ph);
    void* hs = to_host(hsend_, send, count * e, call);
    void* hr = hrecv_.get(count * world_size() * e);
    mpi_->all_gather(hs, hr, count, dt, ph);
    to_device(recv, hr, count * world_size() * e, call);
  }
  void all_gather_v(const void* send, void* recv, const std::vector<int64_t>& counts, DType dt,
                    CommPhase ph) override {
    const int64_t e = dtype_size(dt);
    const int64_t total = detail::check_counts("all_gather_v", counts, world_size());
    detail::check_buffer("all_gather_v", "send", send, counts[rank()]);
    CallInfo call{CommOpId::all_gather_v, ph, dt, total, &counts};
    Scope s(this, ph);
    void* hs = to_host(hsend_, send, counts[rank()] * e, call);
    void* hr = hrecv_.get(total * e);
    mpi_->all_gather_v(hs, hr, counts, dt, ph);
    to_device(recv, hr, total * e, call);
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                      CommPhase ph) override {
    const int64_t e = dtype_size(dt);
    detail::check_buffer("reduce_scatter", "send", send, count * world_size());
    CallInfo call{CommOpId::reduce_scatter, ph, dt, count, nullptr, -1, op};
    Scope s(this, ph);
    detail::check_reduce_op("reduce_scatter", op, dt, true);
    void* hs = to_host(hsend_, send, count * world_size() * e, call);
    const int64_t re = detail::recv_elem_bytes(dt, op);
    void* hr = op == ReduceOp::accumulate ? to_host(hrecv_, recv, count * re, call) : hrecv_.get(count * re);
    mpi_->reduce_scatter(hs, hr, count, dt, op, ph);
    to_device(recv, hr, count * re, call);
  }
  void reduce_scatter_v(const void* send, void* recv, const std::vector<int64_t>& counts, DType dt,
                        ReduceOp op, CommPhase ph) override {
    const int64_t e = dtype_size(dt);
    const int64_t total = detail::check_counts("reduce_scatter_v", counts, world_size());
    detail::check_buffer("reduce_scatter_v", "send", send, total);
    CallInfo call{CommOpId::reduce_scatter_v, ph, dt, total, &counts, -1, op};
    Scope s(this, ph);
    detail::check_reduce_op("reduce_scatter_v", op, dt, true);
    void* hs = to_host(hsend_, send, total * e, call);
    const int64_t re = detail::recv_elem_bytes(dt, op);
    void* hr = op == ReduceOp::accumulate ? to_host(hrecv_, recv, counts[rank()] * re, call)
                                          : hrecv_.get(counts[rank()] * re);
    mpi_->reduce_scatter_v(hs, hr, counts, dt, op, ph);
    to_device(recv, hr, counts[rank()] * re, call);
  }
  void all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, CommPhase ph) override {
    const int64_t e = dtype_size(dt);
    detail::check_buffer("all_reduce", "buf", buf, count);
    CallInfo call{CommOpId::all_reduce, ph, dt, count, nullptr, -1, op};
    Scope s(this, ph);
    void* h = to_host(hsend_, buf, count * e, call);
    mpi_->all_reduce(h, count, dt, op, ph);
    to_device(buf, h, count * e, call);
  }
  double all_reduce_scalar(double value, ReduceOp op, CommPhase ph) override {
    Scope s(this, ph);
    return mpi_->all_reduce_scalar(value, op, ph);
  }
  void all_gather_host(const void* send, void* recv, int64_t bytes, CommPhase ph) override {
    Scope s(this, ph);
    mpi_->all_gather_host(send, recv, bytes, ph);
  }
  void broadcast(void* buf, int64_t count, DType dt, int root, CommPhase ph) override {
    const int64_t e = dtype_size(dt);
    detail::check_buffer("broadcast", "buf", buf, count);
    CallInfo call{CommOpId::broadcast, ph, dt, count, nullptr, root};
    Scope s(this, ph);
    void* h = to_host(hsend_, buf, count * e, call);
    mpi_->broadcast(h, count, dt, root, ph);
    to_device(buf, h, count * e, call);
  }
  void barrier() override {
    Scope s(this, CommPhase::other);
    sync_compute(CallInfo{CommOpId::barrier, CommPhase::other});
    mpi_->barrier();
  }
  void set_timeout(double seconds, const std::string& name) override { mpi_->set_timeout(seconds, name); }
  void send_recv(const std::vector<P2P>& ops, CommPhase ph) override {
    CallInfo call{CommOpId::send_recv, ph, DType::f32, static_cast<int64_t>(ops.size())};
    Scope s(this, ph);
    while (p2p_.size() < ops.size()) p2p_.push_back(std::make_unique<PinnedBuffer>());
    std::vector<P2P> host_ops = ops;
    for (size_t i = 0; i < ops.size(); ++i) {
      const int64_t nb = ops[i].count * dtype_size(ops[i].dtype);
      host_ops[i].buf = ops[i].is_send ? to_host(*p2p_[i], ops[i].buf, nb, call) : p2p_[i]->get(nb);
    }
    mpi_->send_recv(host_ops, ph);
    for (size_t i = 0; i < ops.size(); ++i)
      if (!ops[i].is_send)
        to_device(ops[i].buf, host_ops[i].buf, ops[i].count * dtype_size(ops[i].dtype), call);
  }

 private:
  // Takes the inner call's bytes/calls; seconds include the staging copies.
  struct Scope {
    CudaStagedCommunicator* self;
    CommPhase ph;
    double t0;
    Scope(CudaStagedCommunicator* s, CommPhase p) : self(s), ph(p), t0(MPI_Wtime()) {}
    ~Scope() {
      const auto& in = self->mpi_->counters().at(ph);
      auto& out = self->counters_.at(ph);
      out.bytes_sent += in.bytes_sent;
      out.bytes_received += in.bytes_received;
      out.calls += in.calls;
      out.seconds += MPI_Wtime() - t0;
      self->mpi_->reset_counters();
    }
  };
  void check(cudaError_t e, const CallInfo& call, const char* fn) {
    if (e != cudaSuccess)
      detail::comm_fatal(mpi_->mpi_comm(), rank(), call,
                         std::string(fn) + " failed: " + cudaGetErrorString(e));
  }
  void sync_compute(const CallInfo& call) {
    check(cudaStreamSynchronize(compute_), call, "cudaStreamSynchronize");
  }
  void* to_host(PinnedBuffer& b, const void* dev, int64_t nbytes, const CallInfo& call) {
    void* h = b.get(nbytes);
    sync_compute(call);
    if (nbytes > 0) check(cudaMemcpy(h, dev, nbytes, cudaMemcpyDeviceToHost), call, "cudaMemcpy D2H");
    return h;
  }
  void to_device(void* dev, const void* h, int64_t nbytes, const CallInfo& call) {
    if (nbytes > 0) check(cudaMemcpy(dev, h, nbytes, cudaMemcpyHostToDevice), call, "cudaMemcpy H2D");
  }

  std::unique_ptr<MpiCommunicator> mpi_;
  cudaStream_t compute_ = nullptr;
  PinnedBuffer hsend_, hrecv_;
  std::vector<std::unique_ptr<PinnedBuffer>> p2p_;
};

}  // namespace

std::unique_ptr<Communicator> make_cuda_staged_communicator(MPI_Comm comm, CommOptions opts,
                                                            CudaCommOptions cuda) {
  return std::make_unique<CudaStagedCommunicator>(comm, opts, cuda);
}

}  // namespace mfsdp
