// Debug-mode mismatch reports and collective timeouts, checked in child `mpirun -np 2` jobs so
// that the abort does not take the test process down (nested mpirun: run as a plain ctest).
#include <sys/wait.h>

#include <array>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <string>

namespace {
struct RunResult {
  int status = -1;
  std::string output;
  double seconds = 0;
};

RunResult run_helper(const std::string& mode, const std::string& extra_env = "") {
  const std::string cmd = std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") +
                          "OMPI_MCA_btl_vader_single_copy_mechanism=none " + extra_env + " " +
                          MFSDP_MPIEXEC + " -np 2 --oversubscribe " + MFSDP_FAULT_HELPER + " " +
                          mode + " 2>&1";
  RunResult r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }
}  // namespace

TEST_CASE("comm.faults debug mode reports a count mismatch on every rank and aborts", "[comm]") {
  auto r = run_helper("count_mismatch");
  INFO(r.output);
  CHECK(r.status != 0);
  CHECK(has(r.output, "[comm debug] rank 0: collective #1 mismatch: rank 0 called all_gather_v"));
  CHECK(has(r.output, "[comm debug] rank 1: collective #1 mismatch"));
  CHECK(has(r.output, "2 counts total 7"));
  CHECK(has(r.output, "2 counts total 8"));
  CHECK(has(r.output, "phase bwd_gather"));
}

TEST_CASE("comm.faults debug mode reports a dtype mismatch", "[comm]") {
  auto r = run_helper("dtype_mismatch");
  INFO(r.output);
  CHECK(r.status != 0);
  CHECK(has(r.output, "rank 0 called reduce_scatter(f32"));
  CHECK(has(r.output, "but rank 1 called reduce_scatter(bf16"));
}

TEST_CASE("comm.faults debug mode from MFSDP_COMM_DEBUG passes matching collectives", "[comm]") {
  auto r = run_helper("env_ok", "MFSDP_COMM_DEBUG=1");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(has(r.output, "fault helper: env_ok passed"));
  CHECK_FALSE(has(r.output, "mismatch"));
}

TEST_CASE("comm.faults a collective timeout aborts with rank, op, phase and sizes", "[comm]") {
  auto r = run_helper("timeout");
  INFO(r.output);
  CHECK(r.status != 0);
  CHECK(has(r.output, "[comm] rank 0 on "));
  CHECK(has(r.output, ": timed out after 1 s"));
  CHECK(has(r.output, "all_reduce(f32, count 16, op sum, phase opt_step)"));
  // The sleeping rank answers no liveness probe: it is named, with its node.
  CHECK(has(r.output, "no answer within 2 s from "));
  CHECK(has(r.output, " (rank 1); no peer answered"));
  CHECK(r.seconds < 25.0);  // the sleeping rank was killed by the abort, not waited for
}

TEST_CASE("comm.faults a peer waiting in another collective answers the liveness probe", "[comm]") {
  auto r = run_helper("timeout_peer_waiting");
  INFO(r.output);
  CHECK(r.status != 0);
  CHECK(has(r.output, ": timed out after 1 s"));
  CHECK(has(r.output, "every peer answered a liveness probe within 2 s ("));
  CHECK(has(r.output, "the slowest, rank 1 on "));
  CHECK_FALSE(has(r.output, "no answer within"));
  CHECK(r.seconds < 25.0);
}

TEST_CASE("comm.faults set_timeout changes the bound and the name the report gives it", "[comm]") {
  auto r = run_helper("set_timeout");
  INFO(r.output);
  CHECK(r.status != 0);
  CHECK(has(r.output, "fault helper: the 30 s bound held"));
  CHECK(has(r.output, ": timed out after 1 s (second bound; another rank is missing or stuck) in barrier"));
  CHECK_FALSE(has(r.output, "first bound"));
  CHECK(r.seconds < 25.0);
}
