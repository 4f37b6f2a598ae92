// Prints this rank's view of the world's nodes (comm/node_topology.h), one line per rank, for
// the emulated-cluster driver to compare with what the launcher says (OMPI_COMM_WORLD_LOCAL_RANK)
// and with the host names: "rank R node N local L of S name H nodes K per_node A,B,...".
#include <mpi.h>

#include <cstdio>
#include <string>

#include "comm/comm_factory.h"
#include "comm/node_topology.h"

int main(int argc, char** argv) {
  mfsdp::MpiSession mpi(&argc, &argv);
  const mfsdp::NodeTopology t = mfsdp::world_node_topology();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string per;
  for (int n : t.ranks_per_node()) {
    if (!per.empty()) per += ",";
    per += std::to_string(n);
  }
  std::printf("rank %d node %d local %d of %d name %s nodes %d per_node %s\n", rank, t.node, t.local_rank,
              t.local_size, t.node_names[static_cast<size_t>(t.node)].c_str(), t.nodes(), per.c_str());
  return 0;
}
