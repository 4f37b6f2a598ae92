#include "runtime/trace/traced_communicator.h"

#include <numeric>

#include "runtime/trace/trace.h"

namespace mfsdp::trace {
namespace {

int64_t total(const std::vector<int64_t>& counts) { return std::accumulate(counts.begin(), counts.end(), int64_t(0)); }

// A started collective's span: closed when the collective is waited for (or its handle dropped).
class TracedPending final : public PendingCollective {
 public:
  TracedPending(std::unique_ptr<PendingCollective> inner, Recorder* rec, int64_t id, std::string args)
      : inner_(std::move(inner)), rec_(rec), id_(id), args_(std::move(args)) {}
  ~TracedPending() override {
    if (inner_) wait();
  }
  void wait() override {
    if (!inner_) return;
    inner_->wait();
    inner_.reset();
    if (rec_ && active() == rec_) rec_->close(id_, args_);
  }

 private:
  std::unique_ptr<PendingCollective> inner_;
  Recorder* rec_;
  int64_t id_;
  std::string args_;
};

}  // namespace

std::string TracedCommunicator::absorb(const CommCounters& before, const Call& call) {
  const PhaseCounters& now = inner_.counters().at(call.phase);
  const PhaseCounters& was = before.at(call.phase);
  PhaseCounters delta;
  delta.bytes_sent = now.bytes_sent - was.bytes_sent;
  delta.bytes_received = now.bytes_received - was.bytes_received;
  delta.calls = now.calls - was.calls;
  delta.seconds = now.seconds - was.seconds;
  counters_.at(call.phase) += delta;
  return "\"op\":\"" + std::string(call.op) + "\",\"phase\":\"" + comm_phase_name(call.phase) + "\",\"dtype\":\"" +
         dtype_name(call.dtype) + "\",\"elements\":" + std::to_string(call.elements) +
         ",\"bytes\":" + std::to_string(delta.bytes_sent) + ",\"bytes_received\":" + std::to_string(delta.bytes_received);
}

template <class Fn>
void TracedCommunicator::traced(const Call& call, Fn&& fn) {
  Recorder* rec = active();
  const CommCounters before = inner_.counters();
  const int64_t id = rec ? rec->open(Lane::collectives, "collective", call.op) : -1;
  fn();
  const std::string args = absorb(before, call);
  if (rec && active() == rec) rec->close(id, args);
}

void TracedCommunicator::all_gather(const void* send, void* recv, int64_t count, DType dt, CommPhase ph) {
  traced({"all_gather", ph, dt, count * world_size()}, [&] { inner_.all_gather(send, recv, count, dt, ph); });
}

void TracedCommunicator::all_gather_v(const void* send, void* recv, const std::vector<int64_t>& counts, DType dt,
                                      CommPhase ph) {
  traced({"all_gather_v", ph, dt, total(counts)}, [&] { inner_.all_gather_v(send, recv, counts, dt, ph); });
}

std::unique_ptr<PendingCollective> TracedCommunicator::start_all_gather_v(const void* send, void* recv,
                                                                          const std::vector<int64_t>& counts, DType dt,
                                                                          CommPhase ph) {
  Recorder* rec = active();
  const CommCounters before = inner_.counters();
  const int64_t id = rec ? rec->open(Lane::prefetch, "collective", "all_gather_v") : -1;
  auto inner = inner_.start_all_gather_v(send, recv, counts, dt, ph);
  std::string args = absorb(before, {"all_gather_v", ph, dt, total(counts)}) + ",\"started\":true";
  return std::make_unique<TracedPending>(std::move(inner), rec, id, std::move(args));
}

void TracedCommunicator::reduce_scatter(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                                        CommPhase ph) {
  traced({"reduce_scatter", ph, dt, count * world_size()}, [&] { inner_.reduce_scatter(send, recv, count, dt, op, ph); });
}

void TracedCommunicator::reduce_scatter_v(const void* send, void* recv, const std::vector<int64_t>& counts, DType dt,
                                          ReduceOp op, CommPhase ph) {
  traced({"reduce_scatter_v", ph, dt, total(counts)}, [&] { inner_.reduce_scatter_v(send, recv, counts, dt, op, ph); });
}

std::unique_ptr<PendingCollective> TracedCommunicator::start_reduce_scatter_v(const void* send, void* recv,
                                                                              const std::vector<int64_t>& counts,
                                                                              DType dt, ReduceOp op, CommPhase ph) {
  Recorder* rec = active();
  const CommCounters before = inner_.counters();
  const int64_t id = rec ? rec->open(Lane::reduce, "collective", "reduce_scatter_v") : -1;
  auto inner = inner_.start_reduce_scatter_v(send, recv, counts, dt, op, ph);
  std::string args = absorb(before, {"reduce_scatter_v", ph, dt, total(counts)}) + ",\"started\":true";
  return std::make_unique<TracedPending>(std::move(inner), rec, id, std::move(args));
}

void TracedCommunicator::all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, CommPhase ph) {
  traced({"all_reduce", ph, dt, count}, [&] { inner_.all_reduce(buf, count, dt, op, ph); });
}

double TracedCommunicator::all_reduce_scalar(double value, ReduceOp op, CommPhase ph) {
  double out = 0;
  traced({"all_reduce_scalar", ph, DType::f32, 1}, [&] { out = inner_.all_reduce_scalar(value, op, ph); });
  return out;
}

void TracedCommunicator::all_gather_host(const void* send, void* recv, int64_t bytes, CommPhase ph) {
  traced({"all_gather_host", ph, DType::i32, bytes * world_size()}, [&] { inner_.all_gather_host(send, recv, bytes, ph); });
}

void TracedCommunicator::broadcast(void* buf, int64_t count, DType dt, int root, CommPhase ph) {
  traced({"broadcast", ph, dt, count}, [&] { inner_.broadcast(buf, count, dt, root, ph); });
}

void TracedCommunicator::barrier() {
  traced({"barrier", CommPhase::other, DType::f32, 0}, [&] { inner_.barrier(); });
}

void TracedCommunicator::send_recv(const std::vector<P2P>& ops, CommPhase ph) {
  int64_t n = 0;
  for (const P2P& p : ops) n += p.count;
  traced({"send_recv", ph, ops.empty() ? DType::f32 : ops[0].dtype, n}, [&] { inner_.send_recv(ops, ph); });
}

}  // namespace mfsdp::trace
