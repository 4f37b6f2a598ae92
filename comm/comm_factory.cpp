#include "comm/comm_factory.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "comm/mpi_backends.h"
#include "comm/node_topology.h"
#include "comm/peer_probe.h"

namespace mfsdp {

MpiSession::MpiSession(int* argc, char*** argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return;
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    throw std::runtime_error("[MpiSession] MPI_Init_thread failed");
  owns_ = true;
}

MpiSession::~MpiSession() {
  if (!owns_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::unique_ptr<Communicator> make_host_communicator(CommOptions opts) {
  return make_mpi_communicator(MPI_COMM_WORLD, opts);
}

void abort_job(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  detail::end_process_after_grace(exit_code);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::abort();  // not reached: MPI_Abort ends the process
}

std::unique_ptr<Communicator> make_communicator_over(CommBackend b, MPI_Comm comm, CommOptions opts,
                                                     CudaCommOptions cuda) {
  switch (b) {
    case CommBackend::mpi: return make_mpi_communicator(comm, opts);
    case CommBackend::cuda_staged: return make_cuda_staged_communicator(comm, opts, cuda);
    case CommBackend::nccl: return make_nccl_communicator(comm, opts, cuda);
  }
  throw std::invalid_argument("[make_communicator_over] unknown backend");
}

std::unique_ptr<Communicator> make_communicator(CommBackend b, CommOptions opts, CudaCommOptions cuda) {
  if (b != CommBackend::mpi) select_device_for_process();
  return make_communicator_over(b, MPI_COMM_WORLD, opts, cuda);
}

std::unique_ptr<Communicator> make_split_communicator(CommBackend b, int color, int key, CommOptions opts,
                                                      CudaCommOptions cuda) {
  if (color < 0) throw std::invalid_argument("[make_split_communicator] color must be >= 0, got " + std::to_string(color));
  if (b != CommBackend::mpi) select_device_for_process();  // collective over the world, before the split
  MPI_Comm sub = MPI_COMM_NULL;
  if (MPI_Comm_split(MPI_COMM_WORLD, color, key, &sub) != MPI_SUCCESS)
    throw std::runtime_error("[make_split_communicator] MPI_Comm_split failed");
  std::unique_ptr<Communicator> out;
  try {
    out = make_communicator_over(b, sub, opts, cuda);  // every backend duplicates `sub`, so it is freed here
  } catch (...) {
    MPI_Comm_free(&sub);
    throw;
  }
  MPI_Comm_free(&sub);
  return out;
}

namespace {
// HsdpGroups::layout and spans_nodes: whether each shard group stays on one node.
void describe_layout(const NodeTopology& topo, const std::vector<int>& replica_of, int replicas, HsdpGroups& g) {
  for (int q = 0; q < replicas; ++q) {
    std::vector<int> members;
    for (size_t r = 0; r < replica_of.size(); ++r)
      if (replica_of[r] == q) members.push_back(static_cast<int>(r));
    const std::vector<int> nodes = topo.nodes_of(members);
    if (nodes.size() < 2) continue;
    std::string names;
    for (int n : nodes) names += (names.empty() ? "" : ", ") + topo.node_names[static_cast<size_t>(n)];
    g.spans_nodes = true;
    g.layout = "shard group " + std::to_string(q) + " spans nodes " + names +
               ": its gathers and reductions cross node links (the standard layout is one replica per node, "
               "sharding.replicate = " + std::to_string(topo.nodes()) + ", with the same number of ranks on every node)";
    return;
  }
  g.spans_nodes = false;
  g.layout = topo.nodes() > 1 ? "each shard group on one node, replicas across " + std::to_string(topo.nodes()) + " nodes"
                              : "one node";
}
}  // namespace

HsdpGroups make_hsdp_groups(CommBackend b, int replicas, CommOptions opts, CudaCommOptions cuda) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (replicas < 1 || world % replicas != 0)
    throw std::invalid_argument("[make_hsdp_groups] replicas = " + std::to_string(replicas) +
                                " must be >= 1 and divide the world size " + std::to_string(world));
  const int S = world / replicas;
  const NodeTopology topo = world_node_topology();
  const std::vector<int> per = topo.ranks_per_node();
  const bool by_node = topo.nodes() == replicas && std::all_of(per.begin(), per.end(), [S](int n) { return n == S; });
  std::vector<int> replica_of(static_cast<size_t>(world)), shard_of(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    replica_of[r] = by_node ? topo.node_of_rank[r] : r / S;
    shard_of[r] = by_node ? topo.local_rank_of_rank[r] : r % S;
  }
  HsdpGroups g;
  g.replicas = replicas;
  g.shard = make_split_communicator(b, replica_of[rank], shard_of[rank], opts, cuda);
  g.replica = make_split_communicator(b, shard_of[rank], replica_of[rank], opts, cuda);
  describe_layout(topo, replica_of, replicas, g);
  return g;
}

}  // namespace mfsdp
