// Helper for test_comm_faults: run under `mpirun -np 2`, it issues deliberately wrong collectives.
// Modes: count_mismatch, dtype_mismatch (debug checks on via options), env_ok (matching calls,
// debug checks via MFSDP_COMM_DEBUG=1), timeout (rank 1 skips a collective; 1 s timeout),
// set_timeout (a 30 s bound named "first bound" passes a barrier that rank 1 reaches after 2 s;
// then set_timeout(1, "second bound") and rank 1 skips a barrier), timeout_peer_waiting (rank 1
// waits in another communicator's barrier instead of sleeping).
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_backends.h"

using namespace mfsdp;

int main(int argc, char** argv) {
  MpiSession session(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  CommOptions opts;
  if (mode == "count_mismatch" || mode == "dtype_mismatch") opts.debug_checks = true;
  if (mode == "timeout" || mode == "timeout_peer_waiting") opts.timeout_seconds = 1.0;
  auto c = make_mpi_communicator(MPI_COMM_WORLD, opts);
  const int me = c->rank();
  std::vector<float> send(16, 1.0f), recv(64, 0.0f);
  if (mode == "count_mismatch") {
    std::vector<int64_t> counts = {3, me == 0 ? 4 : 5};
    c->all_gather(send.data(), recv.data(), 2, DType::f32, CommPhase::fwd_gather);  // agrees
    c->all_gather_v(send.data(), recv.data(), counts, DType::f32, CommPhase::bwd_gather);
  } else if (mode == "dtype_mismatch") {
    c->reduce_scatter(send.data(), recv.data(), 4, me == 0 ? DType::f32 : DType::bf16,
                      ReduceOp::sum, CommPhase::grad_reduce);
  } else if (mode == "env_ok") {
    std::vector<int64_t> counts = {3, 5};
    c->all_gather_v(send.data(), recv.data(), counts, DType::f32, CommPhase::bwd_gather);
    c->reduce_scatter_v(recv.data(), send.data(), counts, DType::f32, ReduceOp::sum,
                        CommPhase::grad_reduce);
    c->all_reduce(send.data(), 8, DType::bf16, ReduceOp::max, CommPhase::other);
    c->barrier();
    if (me == 0) std::printf("fault helper: env_ok passed\n");
  } else if (mode == "set_timeout") {
    c->set_timeout(30, "first bound");
    if (me == 1) std::this_thread::sleep_for(std::chrono::seconds(2));
    c->barrier();
    if (me == 0) std::printf("fault helper: the 30 s bound held\n");
    std::fflush(stdout);
    c->set_timeout(1, "second bound");
    if (me == 0) c->barrier();
    else std::this_thread::sleep_for(std::chrono::seconds(30));
  } else if (mode == "timeout") {
    if (me == 0) c->all_reduce(send.data(), 16, DType::f32, ReduceOp::sum, CommPhase::opt_step);
    else std::this_thread::sleep_for(std::chrono::seconds(30));
  } else if (mode == "timeout_peer_waiting") {
    // Rank 1 waits in a barrier of another communicator: alive, it answers rank 0's probe.
    CommOptions patient;
    patient.timeout_seconds = 30;
    auto other = make_mpi_communicator(MPI_COMM_WORLD, patient);
    if (me == 0) c->all_reduce(send.data(), 16, DType::f32, ReduceOp::sum, CommPhase::opt_step);
    else other->barrier();
  } else {
    std::fprintf(stderr, "fault helper: unknown mode '%s'\n", mode.c_str());
    return 2;
  }
  return 0;
}
