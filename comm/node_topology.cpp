// The world's layout over nodes (see node_topology.h).
#include "comm/node_topology.h"

#include <mpi.h>

#include <algorithm>
#include <map>
#include <stdexcept>

namespace mfsdp {
namespace {
constexpr int kNameBytes = 64;

// "0-1" or "0, 2, 5": consecutive runs joined.
std::string rank_list(const std::vector<int>& r) {
  std::string out;
  for (size_t i = 0; i < r.size();) {
    size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(r[i]);
    if (j > i) out.append("-").append(std::to_string(r[j]));
    i = j + 1;
  }
  return out;
}
}  // namespace

std::vector<int> NodeTopology::ranks_per_node() const {
  std::vector<int> n(node_names.size(), 0);
  for (int node_index : node_of_rank) ++n[static_cast<size_t>(node_index)];
  return n;
}

std::vector<int> NodeTopology::nodes_of(const std::vector<int>& world_ranks) const {
  std::vector<int> out;
  for (int r : world_ranks) {
    const int n = node_of_rank.at(static_cast<size_t>(r));
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  }
  return out;
}

std::string NodeTopology::describe() const {
  const std::vector<int> per = ranks_per_node();
  const bool even = std::all_of(per.begin(), per.end(), [&](int v) { return v == per[0]; });
  std::string out = std::to_string(node_of_rank.size()) + " rank(s) on " + std::to_string(nodes()) + " node(s), " +
                    (even ? std::to_string(per[0]) + " per node" : std::string("uneven")) + ":";
  for (int n = 0; n < nodes(); ++n) {
    std::vector<int> ranks;
    for (size_t r = 0; r < node_of_rank.size(); ++r)
      if (node_of_rank[r] == n) ranks.push_back(static_cast<int>(r));
    out += (n ? ", " : " ") + node_names[static_cast<size_t>(n)] + " (rank" + (ranks.size() > 1 ? "s " : " ") +
           rank_list(ranks) + ")";
  }
  return out;
}

NodeTopology world_node_topology() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) throw std::runtime_error("[world_node_topology] MPI is not initialised");
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) != MPI_SUCCESS)
    throw std::runtime_error("[world_node_topology] MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
  NodeTopology t;
  MPI_Comm_rank(node, &t.local_rank);
  MPI_Comm_size(node, &t.local_size);
  int leader = rank;  // the node's lowest world rank names it
  MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  struct Entry {
    int leader, local_rank;
    char name[kNameBytes];
  } mine{leader, t.local_rank, {0}};
  int len = 0;
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  MPI_Get_processor_name(name, &len);
  std::copy_n(name, std::min(len, kNameBytes - 1), mine.name);
  std::vector<Entry> all(static_cast<size_t>(world));
  if (MPI_Allgather(&mine, sizeof(Entry), MPI_BYTE, all.data(), sizeof(Entry), MPI_BYTE, MPI_COMM_WORLD) != MPI_SUCCESS)
    throw std::runtime_error("[world_node_topology] MPI_Allgather failed");
  std::map<int, int> node_of_leader;  // ordered by leader rank
  for (const Entry& e : all) node_of_leader.emplace(e.leader, 0);
  int next = 0;
  for (auto& [lead, index] : node_of_leader) {
    index = next++;
    t.node_names.emplace_back(all[static_cast<size_t>(lead)].name);
  }
  for (const Entry& e : all) {
    t.node_of_rank.push_back(node_of_leader[e.leader]);
    t.local_rank_of_rank.push_back(e.local_rank);
  }
  t.node = t.node_of_rank[static_cast<size_t>(rank)];
  return t;
}

}  // namespace mfsdp
