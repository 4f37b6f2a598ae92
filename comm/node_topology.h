// Where the world's ranks run: the nodes, as MPI's shared-memory split finds them (ranks that can
// share memory), their host names and each rank's place on its node.
#pragma once
#include <string>
#include <vector>

namespace mfsdp {

/// The world's layout over nodes. Nodes are numbered by their lowest world rank.
struct NodeTopology {
  int node = 0;                         ///< this rank's node
  int local_rank = 0, local_size = 1;   ///< this rank among its node's ranks, and their number
  std::vector<int> node_of_rank;        ///< world rank -> node
  std::vector<int> local_rank_of_rank;  ///< world rank -> its rank on its node
  std::vector<std::string> node_names;  ///< node -> host name (of its lowest rank)

  int nodes() const { return static_cast<int>(node_names.size()); }
  /// Ranks on each node, in node order.
  std::vector<int> ranks_per_node() const;
  /// "4 ranks on 2 nodes, 2 per node: node0 (ranks 0-1), node1 (ranks 2-3)".
  std::string describe() const;
  /// The nodes the given world ranks run on, without repeats, in rank order.
  std::vector<int> nodes_of(const std::vector<int>& world_ranks) const;
};

/// The topology of MPI_COMM_WORLD: collective over it (MPI_Comm_split_type, MPI_Allgather;
/// blocking, so call it once every rank is known to be running, e.g. after the start-up checks).
/// Throws std::runtime_error when MPI is not initialised or a call fails.
NodeTopology world_node_topology();

}  // namespace mfsdp
