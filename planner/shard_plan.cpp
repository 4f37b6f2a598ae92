#include "planner/shard_plan.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>

#include "planner/cost_model.h"
#include "runtime/core/json_fields.h"

namespace mfsdp {

using nlohmann::json;

// ---------------------------------------------------------------- names

const char* placement_name(Placement p) {
  const char* n = kPlacementNames.name(p);
  if (n[0] == '?')
    throw std::invalid_argument("[placement_name] unknown placement value " + std::to_string(static_cast<int>(p)));
  return n;
}

Placement parse_placement(const std::string& s) { return kPlacementNames.parse(s, "placement"); }

const char* optimizer_name(OptimizerKind k) {
  const char* n = kOptimizerKindNames.name(k);
  if (n[0] == '?')
    throw std::invalid_argument("[optimizer_name] unknown optimizer value " + std::to_string(static_cast<int>(k)));
  return n;
}

OptimizerKind parse_optimizer(const std::string& s) { return kOptimizerKindNames.parse(s, "optimizer"); }

// ---------------------------------------------------------------- MatrixShard / UnitLayout

int64_t MatrixShard::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t MatrixShard::rows() const { return shape.empty() ? 1 : shape[0]; }

int64_t MatrixShard::row_numel() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

int64_t MatrixShard::fsdp2_rows_per_rank(int world) const {
  if (world < 1)
    throw std::invalid_argument("[fsdp2_rows_per_rank] " + name + ": world size " +
                                std::to_string(world) + " < 1");
  return (rows() + world - 1) / world;
}

int64_t MatrixShard::fsdp2_rows_on(int rank, int world) const {
  const int64_t rpr = fsdp2_rows_per_rank(world);
  if (rank < 0 || rank >= world)
    throw std::invalid_argument("[fsdp2_rows_on] " + name + ": rank " + std::to_string(rank) +
                                " not in [0, " + std::to_string(world) + ")");
  return std::clamp<int64_t>(rows() - static_cast<int64_t>(rank) * rpr, 0, rpr);
}

int64_t MatrixShard::fsdp2_slot_numel(int world) const {
  return fsdp2_rows_per_rank(world) * row_numel();
}

int64_t MatrixShard::fsdp2_padding_numel(int world) const {
  return (fsdp2_rows_per_rank(world) * world - rows()) * row_numel();
}

const ShardPiece* MatrixShard::piece_on(int rank) const {
  for (const auto& p : pieces)
    if (p.rank == rank) return &p;
  return nullptr;
}

int64_t MatrixShard::numel_on(int rank) const {
  const ShardPiece* p = piece_on(rank);
  return p ? p->numel : 0;
}

int64_t UnitLayout::total_numel() const {
  return std::accumulate(segment_numel.begin(), segment_numel.end(), int64_t{0});
}

int64_t UnitLayout::segment_offset(int rank) const {
  if (rank < 0 || rank > static_cast<int>(segment_numel.size()))
    throw std::out_of_range("[UnitLayout::segment_offset] unit " + name + ": rank " +
                            std::to_string(rank) + " not in [0, " +
                            std::to_string(segment_numel.size()) + "]");
  return std::accumulate(segment_numel.begin(), segment_numel.begin() + rank, int64_t{0});
}

// ---------------------------------------------------------------- BalanceStats

namespace {
double ratio(double max, double mean) { return mean > 0.0 ? max / mean : 1.0; }
}  // namespace

double BalanceStats::flops_max() const {
  return rank_flops.empty() ? 0.0 : *std::max_element(rank_flops.begin(), rank_flops.end());
}
double BalanceStats::flops_mean() const {
  if (rank_flops.empty()) return 0.0;
  return std::accumulate(rank_flops.begin(), rank_flops.end(), 0.0) /
         static_cast<double>(rank_flops.size());
}
double BalanceStats::flops_ratio() const { return ratio(flops_max(), flops_mean()); }
int64_t BalanceStats::bytes_max() const {
  return rank_bytes.empty() ? 0 : *std::max_element(rank_bytes.begin(), rank_bytes.end());
}
double BalanceStats::bytes_mean() const {
  if (rank_bytes.empty()) return 0.0;
  return static_cast<double>(std::accumulate(rank_bytes.begin(), rank_bytes.end(), int64_t{0})) /
         static_cast<double>(rank_bytes.size());
}
double BalanceStats::bytes_ratio() const {
  return ratio(static_cast<double>(bytes_max()), bytes_mean());
}
double BalanceStats::unit_ratio(int u) const {
  return ratio(static_cast<double>(unit_segment_max_bytes.at(u)), unit_segment_mean_bytes.at(u));
}
double BalanceStats::worst_unit_ratio() const {
  double w = 1.0;
  for (size_t u = 0; u < unit_segment_max_bytes.size(); ++u)
    w = std::max(w, unit_ratio(static_cast<int>(u)));
  return w;
}

BalanceStats compute_stats(const ShardPlan& plan) {
  const int N = plan.world_size;
  BalanceStats st;
  st.rank_flops.assign(N, 0.0);
  st.rank_bytes.assign(N, 0);
  int64_t total_numel = 0;
  double all_muon_flops = 0.0;
  for (const auto& s : plan.shards) {
    const int64_t n = s.numel();
    total_numel += n;
    if (s.optimizer == OptimizerKind::muon) {
      ++st.muon_params;
      st.muon_numel += n;
    } else {
      ++st.adamw_params;
      st.adamw_numel += n;
    }
    if (s.pieces.size() > 1) ++st.split_tensors;
    const double mf = shard_muon_flops(s, plan.options);
    all_muon_flops += mf;
    const int64_t state = state_per_element(s.optimizer) * kF32Bytes;
    switch (plan.placement) {
      case Placement::matrixfsdp:
      case Placement::zero1:
        for (const auto& p : s.pieces) {
          // Muon matrices are never split here, so the piece's rank runs the whole NS.
          st.rank_flops[p.rank] += s.optimizer == OptimizerKind::muon ? mf : adamw_flops(p.numel);
          st.rank_bytes[p.rank] += plan.placement == Placement::matrixfsdp
                                       ? p.numel * owner_bytes_per_element(s.optimizer)
                                       : p.numel * state;
        }
        break;
      case Placement::fsdp2: {
        const int64_t slot = s.fsdp2_slot_numel(N);
        st.padding_numel += s.fsdp2_padding_numel(N);
        for (int r = 0; r < N; ++r) st.rank_bytes[r] += slot * 2 * kF32Bytes;
        for (const auto& p : s.pieces) {
          st.rank_bytes[p.rank] += p.numel * state;
          if (s.optimizer == OptimizerKind::adamw) st.rank_flops[p.rank] += adamw_flops(p.numel);
        }
        break;
      }
      case Placement::ddp:
        for (int r = 0; r < N; ++r) {
          st.rank_bytes[r] += n * owner_bytes_per_element(s.optimizer);
          if (s.optimizer == OptimizerKind::adamw) st.rank_flops[r] += adamw_flops(n);
        }
        break;
    }
  }
  // Every rank orthogonalizes every matrix (fsdp2 after the step gather; ddp replicas).
  if (plan.placement == Placement::fsdp2 || plan.placement == Placement::ddp)
    for (int r = 0; r < N; ++r) st.rank_flops[r] += all_muon_flops;
  if (plan.placement == Placement::zero1)
    for (int r = 0; r < N; ++r) st.rank_bytes[r] += total_numel * 2 * kF32Bytes;
  for (const auto& u : plan.units) {
    int64_t mx = 0;
    for (int64_t seg : u.segment_numel) {
      mx = std::max(mx, seg);
      if (seg == 0) ++st.empty_segments;
    }
    st.unit_segment_max_bytes.push_back(mx * kF32Bytes);
    st.unit_segment_mean_bytes.push_back(static_cast<double>(u.total_numel() * kF32Bytes) /
                                         static_cast<double>(N));
  }
  return st;
}

// ---------------------------------------------------------------- lookup

const MatrixShard* ShardPlan::find(const std::string& name) const {
  for (const auto& s : shards)
    if (s.name == name) return &s;
  return nullptr;
}

const MatrixShard& ShardPlan::shard(const std::string& name) const {
  if (const MatrixShard* s = find(name)) return *s;
  throw std::out_of_range("[ShardPlan::shard] no parameter named '" + name + "' in the plan (" +
                          std::to_string(shards.size()) + " parameters)");
}

std::vector<int> ShardPlan::shards_in_unit(int unit) const {
  std::vector<int> out;
  for (size_t i = 0; i < shards.size(); ++i)
    if (shards[i].unit == unit) out.push_back(static_cast<int>(i));
  return out;
}

// ---------------------------------------------------------------- validate

namespace {

[[noreturn]] void fail(const std::string& m) { throw std::runtime_error("[ShardPlan::validate] " + m); }

// Every unit has one segment per rank, none negative.
void validate_units(const std::vector<UnitLayout>& units, int N) {
  for (const auto& unit : units) {
    if (unit.segment_numel.size() != static_cast<size_t>(N))
      fail("unit " + unit.name + " has " + std::to_string(unit.segment_numel.size()) +
           " segments, world size is " + std::to_string(N));
    for (int r = 0; r < N; ++r)
      if (unit.segment_numel[r] < 0)
        fail("unit " + unit.name + " rank " + std::to_string(r) + " segment numel " +
             std::to_string(unit.segment_numel[r]) + " < 0");
  }
}

// The tensor's own fields: a unit in range, positive dims, role and optimizer that agree.
void validate_tensor(const MatrixShard& s, size_t U) {
  const std::string who = "parameter " + s.name;
  if (s.unit < 0 || static_cast<size_t>(s.unit) >= U)
    fail(who + " unit " + std::to_string(s.unit) + " not in [0, " + std::to_string(U) + ")");
  for (int64_t d : s.shape)
    if (d < 1) fail(who + " has dim " + std::to_string(d) + " < 1");
  const bool is_matrix = s.role == ParamRole::matrix;
  if (is_matrix != (s.optimizer == OptimizerKind::muon))
    fail(who + " has role " + param_role_name(s.role) + " but optimizer " + optimizer_name(s.optimizer));
  if (is_matrix && s.shape.size() != 2)
    fail(who + " has role matrix but " + std::to_string(s.shape.size()) + " dims");
  if (s.pieces.empty()) fail(who + " has no pieces");
}

// The pieces are ordered, one per rank at most, cover the tensor once and lie inside their
// segments; their segment intervals are appended to iv[unit * N + rank].
void validate_pieces(const MatrixShard& s, const std::vector<UnitLayout>& units, int N,
                     std::vector<std::vector<std::pair<int64_t, int64_t>>>& iv) {
  const std::string who = "parameter " + s.name;
  std::vector<char> seen(N, 0);
  int64_t next = 0;
  for (const auto& p : s.pieces) {
    const std::string pw = who + " piece on rank " + std::to_string(p.rank);
    if (p.rank < 0 || p.rank >= N) fail(pw + ": rank not in [0, " + std::to_string(N) + ")");
    if (seen[p.rank]) fail(pw + ": second piece on that rank");
    seen[p.rank] = 1;
    if (p.numel < 1) fail(pw + ": numel " + std::to_string(p.numel) + " < 1");
    if (p.param_offset != next)
      fail(pw + ": param_offset " + std::to_string(p.param_offset) + ", expected " + std::to_string(next) +
           " (pieces must be ordered and cover the tensor once)");
    next += p.numel;
    const int64_t seg = units[s.unit].segment_numel[p.rank];
    if (p.segment_offset < 0 || p.segment_offset + p.numel > seg)
      fail(pw + ": [" + std::to_string(p.segment_offset) + ", " + std::to_string(p.segment_offset + p.numel) +
           ") outside the segment of " + std::to_string(seg) + " elements in unit " + units[s.unit].name);
    iv[static_cast<size_t>(s.unit) * N + p.rank].emplace_back(p.segment_offset, p.segment_offset + p.numel);
  }
  if (next != s.numel())
    fail(who + " pieces cover " + std::to_string(next) + " of " + std::to_string(s.numel()) + " elements");
}

// The placement's rules for one tensor: its owner, ddp's single piece on rank 0, whole Muon
// matrices under matrixfsdp and zero1, and fsdp2's row slices at the unit's slot `cursor`
// (advanced past this tensor's slot).
void validate_placement(const MatrixShard& s, Placement placement, int N, int64_t& cursor) {
  const std::string who = "parameter " + s.name;
  const int expected_owner = placement == Placement::ddp ? -1 : (s.pieces.size() == 1 ? s.pieces[0].rank : -1);
  if (s.owner != expected_owner)
    fail(who + " owner " + std::to_string(s.owner) + ", expected " + std::to_string(expected_owner));
  if (placement == Placement::ddp && (s.pieces.size() != 1 || s.pieces[0].rank != 0))
    fail(who + ": ddp keeps every tensor as one piece on rank 0");
  if ((placement == Placement::matrixfsdp || placement == Placement::zero1) && s.role == ParamRole::matrix &&
      s.pieces.size() != 1)
    fail(who + " is a Muon matrix split into " + std::to_string(s.pieces.size()) + " pieces");
  if (placement != Placement::fsdp2) return;
  const int64_t rpr = s.fsdp2_rows_per_rank(N), cols = s.row_numel();
  size_t k = 0;
  for (int r = 0; r < N; ++r) {
    const int64_t rows_on = s.fsdp2_rows_on(r, N);
    if (rows_on == 0) continue;
    if (k >= s.pieces.size() || s.pieces[k].rank != r || s.pieces[k].segment_offset != cursor ||
        s.pieces[k].param_offset != r * rpr * cols || s.pieces[k].numel != rows_on * cols)
      fail(who + ": fsdp2 piece for rank " + std::to_string(r) + " must be " + std::to_string(rows_on) +
           " rows at segment offset " + std::to_string(cursor));
    ++k;
  }
  if (k != s.pieces.size()) fail(who + ": fsdp2 piece on a rank without rows");
  cursor += rpr * cols;
}

// Per (unit, rank): the pieces' intervals do not overlap and fill the segment exactly (fsdp2: the
// segment is the unit's slot total, `fsdp2_cursor`).
void validate_coverage(const std::vector<UnitLayout>& units, int N, Placement placement,
                       std::vector<std::vector<std::pair<int64_t, int64_t>>>& iv,
                       const std::vector<int64_t>& fsdp2_cursor) {
  for (size_t u = 0; u < units.size(); ++u)
    for (int r = 0; r < N; ++r) {
      auto& v = iv[u * N + r];
      std::sort(v.begin(), v.end());
      int64_t covered = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        if (i > 0 && v[i].first < v[i - 1].second)
          fail("unit " + units[u].name + " rank " + std::to_string(r) + ": pieces overlap at " +
               std::to_string(v[i].first));
        covered += v[i].second - v[i].first;
      }
      const int64_t seg = units[u].segment_numel[r];
      const int64_t expected = placement == Placement::fsdp2 ? fsdp2_cursor[u] : covered;
      if (seg != expected || (placement != Placement::fsdp2 && covered != seg))
        fail("unit " + units[u].name + " rank " + std::to_string(r) + ": segment numel " + std::to_string(seg) +
             ", expected " + std::to_string(expected));
    }
}

}  // namespace

void ShardPlan::set_gathered_numel() {
  for (UnitLayout& u : units) u.gathered_numel = u.segment_numel;
  if (!options.expert_parallel) return;
  std::vector<std::vector<int64_t>> first_expert(units.size());  // per unit and rank: the lowest expert offset
  for (UnitLayout& u : units) first_expert[&u - units.data()] = u.segment_numel;
  for (const MatrixShard& s : shards)
    if (s.expert >= 0)
      for (const ShardPiece& p : s.pieces) {
        units[s.unit].gathered_numel[p.rank] -= p.numel;
        int64_t& first = first_expert[s.unit][p.rank];
        first = std::min(first, p.segment_offset);
      }
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t r = 0; r < units[u].segment_numel.size(); ++r)
      if (first_expert[u][r] != units[u].gathered_numel[r])
        throw std::runtime_error("expert_parallel: unit " + units[u].name + " rank " + std::to_string(r) +
                                 ": its expert matrices do not fill the tail of its segment");
}

void ShardPlan::validate() const {
  const int N = world_size;
  if (N < 1) fail("world_size " + std::to_string(N) + " < 1");
  validate_units(units, N);
  const size_t U = units.size();
  // Intervals [segment_offset, end) per (unit, rank); fsdp2 slot cursor per unit.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> iv(U * static_cast<size_t>(N));
  std::vector<int64_t> fsdp2_cursor(U, 0);
  std::set<std::string> names;
  for (const auto& s : shards) {
    if (!names.insert(s.name).second) fail("parameter " + s.name + " appears twice");
    validate_tensor(s, U);
    validate_pieces(s, units, N, iv);
    validate_placement(s, placement, N, fsdp2_cursor[s.unit]);
  }
  validate_coverage(units, N, placement, iv, fsdp2_cursor);
}

// ---------------------------------------------------------------- JSON

nlohmann::json ShardPlan::to_json() const {
  json j;
  j["format"] = "mfsdp.shard_plan";
  j["version"] = 1;
  j["world_size"] = world_size;
  j["placement"] = placement_name(placement);
  j["options"] = {{"ns_steps", options.ns_steps},
                  {"split_qkv", options.split_qkv},
                  {"round_robin", options.round_robin},
                  {"orthogonalizer", orthogonalizer_name(options.orthogonalizer)},
                  {"head_dim", options.head_dim}};
  if (!options.node_of_rank.empty()) j["options"]["node_of_rank"] = options.node_of_rank;
  if (options.expert_parallel) j["options"]["expert_parallel"] = true;
  json ju = json::array();
  for (const auto& u : units) ju.push_back({{"name", u.name}, {"segment_numel", u.segment_numel}});
  j["units"] = std::move(ju);
  json js = json::array();
  for (const auto& s : shards) {
    json pieces = json::array();
    for (const auto& p : s.pieces)
      pieces.push_back(json::array({p.rank, p.segment_offset, p.param_offset, p.numel}));
    js.push_back({{"name", s.name},
                  {"shape", s.shape},
                  {"role", param_role_name(s.role)},
                  {"unit", s.unit},
                  {"qkv_blocks", s.qkv_blocks},
                  {"optimizer", optimizer_name(s.optimizer)},
                  {"owner", s.owner},
                  {"pieces", std::move(pieces)}});
    if (s.expert >= 0) js.back()["expert"] = s.expert;
  }
  j["shards"] = std::move(js);
  j["stats"] = {{"muon_params", stats.muon_params},
                {"adamw_params", stats.adamw_params},
                {"muon_numel", stats.muon_numel},
                {"adamw_numel", stats.adamw_numel},
                {"rank_flops", stats.rank_flops},
                {"rank_bytes", stats.rank_bytes},
                {"unit_segment_max_bytes", stats.unit_segment_max_bytes},
                {"unit_segment_mean_bytes", stats.unit_segment_mean_bytes},
                {"empty_segments", stats.empty_segments},
                {"split_tensors", stats.split_tensors},
                {"padding_numel", stats.padding_numel}};
  return j;
}

namespace {

using Fields = JsonFields<>;

// The enumerator `parse` makes of the string at `v`; its refusal names the field.
template <class F>
auto parse_enum(const Fields::Field& v, F parse) {
  const std::string s = v.string();
  try {
    return parse(s);
  } catch (const std::invalid_argument& e) {
    v.fail(e.what());
  }
}

}  // namespace

ShardPlan ShardPlan::from_json(const nlohmann::json& j) {
  ShardPlan p;
  const Fields f("ShardPlan::from_json");
  const std::string format = f.at(j, "format").string();
  if (format != "mfsdp.shard_plan") f.fail("format", "expected 'mfsdp.shard_plan', got '" + format + "'");
  const int version = f.at(j, "version").get<int>();
  if (version != 1) f.fail("version", "unsupported version " + std::to_string(version));
  p.world_size = f.at(j, "world_size").get<int>();
  p.placement = parse_enum(f.at(j, "placement"), parse_placement);
  const json& o = f.at(j, "options").value();
  const Fields fo = f.in("options");
  p.options.ns_steps = fo.at(o, "ns_steps").get<int>();
  p.options.split_qkv = fo.at(o, "split_qkv").get<bool>();
  p.options.round_robin = fo.at(o, "round_robin").get<bool>();
  // plans written before the orthogonalizer and head split were options lack them: the defaults
  if (auto v = fo.find(o, "orthogonalizer")) p.options.orthogonalizer = parse_enum(*v, parse_orthogonalizer);
  if (auto v = fo.find(o, "head_dim")) p.options.head_dim = v->get<int64_t>();
  if (auto v = fo.find(o, "node_of_rank")) p.options.node_of_rank = v->get<std::vector<int>>();
  if (auto v = fo.find(o, "expert_parallel")) p.options.expert_parallel = v->get<bool>();
  const json& ju = f.at(j, "units").value();
  if (!ju.is_array()) f.fail("units", "is not an array");
  for (size_t u = 0; u < ju.size(); ++u) {
    const Fields fu = f.in("units[" + std::to_string(u) + "]");
    p.units.push_back(UnitLayout{fu.at(ju[u], "name").string(), fu.at(ju[u], "segment_numel").get<std::vector<int64_t>>(), {}});
  }
  const json& js = f.at(j, "shards").value();
  if (!js.is_array()) f.fail("shards", "is not an array");
  for (size_t i = 0; i < js.size(); ++i) {
    const Fields fs = f.in("shards[" + std::to_string(i) + "]");
    MatrixShard s;
    s.name = fs.at(js[i], "name").string();
    s.shape = fs.at(js[i], "shape").get<std::vector<int64_t>>();
    s.role = parse_enum(fs.at(js[i], "role"), parse_param_role);
    s.unit = fs.at(js[i], "unit").get<int>();
    s.qkv_blocks = fs.at(js[i], "qkv_blocks").get<int>();
    s.optimizer = parse_enum(fs.at(js[i], "optimizer"), parse_optimizer);
    s.owner = fs.at(js[i], "owner").get<int>();
    if (auto v = fs.find(js[i], "expert")) s.expert = v->get<int>();
    const auto pieces = fs.at(js[i], "pieces").get<std::vector<std::vector<int64_t>>>();
    for (size_t k = 0; k < pieces.size(); ++k) {
      if (pieces[k].size() != 4)
        fs.fail("pieces[" + std::to_string(k) + "]", "expected [rank, segment_offset, param_offset, numel], got " +
                                                        std::to_string(pieces[k].size()) + " numbers");
      s.pieces.push_back(ShardPiece{static_cast<int>(pieces[k][0]), pieces[k][1], pieces[k][2], pieces[k][3]});
    }
    p.shards.push_back(std::move(s));
  }
  const json& st = f.at(j, "stats").value();
  const Fields ft = f.in("stats");
  p.stats.muon_params = ft.at(st, "muon_params").get<int>();
  p.stats.adamw_params = ft.at(st, "adamw_params").get<int>();
  p.stats.muon_numel = ft.at(st, "muon_numel").get<int64_t>();
  p.stats.adamw_numel = ft.at(st, "adamw_numel").get<int64_t>();
  p.stats.rank_flops = ft.at(st, "rank_flops").get<std::vector<double>>();
  p.stats.rank_bytes = ft.at(st, "rank_bytes").get<std::vector<int64_t>>();
  p.stats.unit_segment_max_bytes = ft.at(st, "unit_segment_max_bytes").get<std::vector<int64_t>>();
  p.stats.unit_segment_mean_bytes = ft.at(st, "unit_segment_mean_bytes").get<std::vector<double>>();
  p.stats.empty_segments = ft.at(st, "empty_segments").get<int64_t>();
  p.stats.split_tensors = ft.at(st, "split_tensors").get<int>();
  p.stats.padding_numel = ft.at(st, "padding_numel").get<int64_t>();
  try {
    p.set_gathered_numel();
    p.validate();
  } catch (const std::runtime_error& e) {
    f.fail("", std::string("invalid plan: ") + e.what());
  }
  return p;
}

}  // namespace mfsdp
