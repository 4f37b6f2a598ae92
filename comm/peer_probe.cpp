// The liveness probe of a failed collective's peers, and the bounded abort (see peer_probe.h).
#include "comm/peer_probe.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <sched.h>
#include <stdexcept>
#include <thread>

namespace mfsdp::detail {
namespace {
constexpr int kTagPing = 1, kTagPong = 2;
constexpr int kNameBytes = 64;

std::vector<PeerProbe*>& live_probes() {
  static std::vector<PeerProbe*> probes;
  return probes;
}

// "node1 (ranks 2, 3), node2 (rank 4)": ranks grouped by node, nodes in order of first rank.
std::string by_node(const std::vector<std::pair<std::string, int>>& members) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> ranks;
  for (const auto& [node, rank] : members) {
    if (!ranks.count(node)) order.push_back(node);
    ranks[node].push_back(rank);
  }
  std::string out;
  for (const std::string& node : order) {
    const auto& r = ranks[node];
    out += (out.empty() ? "" : ", ") + node + (r.size() == 1 ? " (rank " : " (ranks ");
    for (size_t i = 0; i < r.size(); ++i) out += (i ? ", " : "") + std::to_string(r[i]);
    out += ")";
  }
  return out;
}
}  // namespace

PeerProbe::PeerProbe(MPI_Comm comm) : parent_(comm) {
  if (MPI_Comm_dup(comm, &probe_comm_) != MPI_SUCCESS)
    throw std::runtime_error("[comm] MPI_Comm_dup (liveness probe) failed");
  MPI_Comm_set_errhandler(probe_comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> mine(kNameBytes, 0), all(static_cast<size_t>(kNameBytes) * size_);
  std::copy_n(name, std::min(len, kNameBytes - 1), mine.begin());
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  world_ranks_.resize(static_cast<size_t>(size_));
  if (MPI_Allgather(mine.data(), kNameBytes, MPI_CHAR, all.data(), kNameBytes, MPI_CHAR, probe_comm_) != MPI_SUCCESS ||
      MPI_Allgather(&world_rank, 1, MPI_INT, world_ranks_.data(), 1, MPI_INT, probe_comm_) != MPI_SUCCESS)
    throw std::runtime_error("[comm] MPI_Allgather (liveness probe) failed");
  for (int r = 0; r < size_; ++r) nodes_.emplace_back(all.data() + static_cast<size_t>(r) * kNameBytes);
  live_probes().push_back(this);
}

PeerProbe::~PeerProbe() {
  auto& probes = live_probes();
  probes.erase(std::remove(probes.begin(), probes.end(), this), probes.end());
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Request& r : answers_) MPI_Request_free(&r);
  MPI_Comm_free(&probe_comm_);
}

void PeerProbe::answer() {
  for (;;) {
    int arrived = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kTagPing, probe_comm_, &arrived, &st) != MPI_SUCCESS || !arrived) break;
    int nonce = 0;
    MPI_Recv(&nonce, 1, MPI_INT, st.MPI_SOURCE, kTagPing, probe_comm_, MPI_STATUS_IGNORE);
    static int reply = 0;  // the payload is never read
    MPI_Request req;
    if (MPI_Isend(&reply, 1, MPI_INT, st.MPI_SOURCE, kTagPong, probe_comm_, &req) == MPI_SUCCESS)
      answers_.push_back(req);
  }
  // Completed answers are dropped; the rest stay until they complete or the probe goes.
  answers_.erase(std::remove_if(answers_.begin(), answers_.end(),
                                [](MPI_Request& r) {
                                  int done = 0;
                                  MPI_Test(&r, &done, MPI_STATUS_IGNORE);
                                  return done != 0;
                                }),
                 answers_.end());
}

void PeerProbe::answer_pings() {
  for (PeerProbe* p : live_probes()) p->answer();
}

PeerProbe* PeerProbe::find(MPI_Comm comm) {
  for (PeerProbe* p : live_probes()) {
    int same = MPI_UNEQUAL;
    if (p->parent_ == comm || (MPI_Comm_compare(p->parent_, comm, &same) == MPI_SUCCESS && same == MPI_IDENT))
      return p;
  }
  return nullptr;
}

std::string PeerProbe::probe(double seconds) {
  static int ping = 0;
  std::vector<int> pongs(static_cast<size_t>(size_), 0);
  std::vector<MPI_Request> recvs(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  std::vector<MPI_Request> sends(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  std::vector<int> answered(static_cast<size_t>(size_), 0);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Irecv(&pongs[r], 1, MPI_INT, r, kTagPong, probe_comm_, &recvs[r]);
    MPI_Isend(&ping, 1, MPI_INT, r, kTagPing, probe_comm_, &sends[r]);
  }
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + std::chrono::duration<double>(seconds);
  int missing = size_ - 1, slowest = -1;
  double slowest_s = -1;
  while (missing > 0 && std::chrono::steady_clock::now() < end) {
    answer_pings();  // two failing ranks probe each other
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || answered[r]) continue;
      int done = 0;
      if (MPI_Test(&recvs[r], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) continue;
      answered[r] = 1, --missing;
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (t > slowest_s) slowest_s = t, slowest = r;
    }
    sched_yield();
  }
  std::vector<std::pair<std::string, int>> silent, alive;
  for (int r = 0; r < size_; ++r)
    if (r != rank_) (answered[r] ? alive : silent).emplace_back(nodes_[r], world_ranks_[r]);
  // Requests to silent peers are left posted: the process is about to abort.
  char secs[32], slow[128] = "";
  std::snprintf(secs, sizeof secs, "%g", seconds);
  if (slowest >= 0)
    std::snprintf(slow, sizeof slow, "; the slowest, rank %d on %s, after %.3f s", world_ranks_[slowest],
                  nodes_[slowest].c_str(), slowest_s);
  std::string out = silent.empty() ? std::string("every peer answered a liveness probe within ") + secs + " s (" +
                                         by_node(alive) + ")" + slow + ": a link or a peer is slow or stuck, not gone"
                                   : std::string("no answer within ") + secs + " s from " + by_node(silent);
  if (!silent.empty()) out += alive.empty() ? "; no peer answered" : "; answered: " + by_node(alive);
  return out;
}

void end_process_after_grace(int exit_code) {
  std::thread([exit_code] {
    std::this_thread::sleep_for(std::chrono::duration<double>(kAbortGraceSeconds));
    std::fprintf(stderr, "[comm] MPI_Abort did not end this process within %g s; exiting with code %d\n",
                 kAbortGraceSeconds, exit_code);
    std::fflush(stderr);
    _exit(exit_code);
  }).detach();
}

}  // namespace mfsdp::detail
