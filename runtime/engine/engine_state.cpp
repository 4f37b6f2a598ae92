// The engine's owner state as a whole: the pieces each rank saves and loads (checkpoints), the
// full optimizer state (tests and tools) and the state fingerprint (bitwise comparisons).
#include <cstdio>
#include <cstring>

#include "runtime/engine/sharded_engine.h"

namespace mfsdp {
namespace {

// A bijective 64-bit finalizer (MurmurHash3's fmix64): every input bit affects every output bit.
uint64_t fingerprint_mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// Host values of a tensor: its own bytes on the CPU, a copy in `scratch` otherwise.
const float* host_data(const Tensor& t, std::vector<float>& scratch) {
  if (t.device() == Device::CPU) return t.numel() ? t.data_f32() : nullptr;
  scratch.resize(static_cast<size_t>(t.numel()));
  t.copy_to_host(scratch.data());
  return scratch.data();
}

}  // namespace

const char* state_kind_name(StateKind k) {
  switch (k) {
    case StateKind::param: return "param";
    case StateKind::m: return "m";
    case StateKind::v: return "v";
  }
  return "?";
}

void ShardedEngine::for_each_saved_piece(const SavedPieceFn& fn) {
  std::vector<float> scratch;
  for (OwnedPiece* o : contributed_pieces()) {
    const MatrixShard& s = plan_.shards[o->shard];
    fn(s, StateKind::param, o->param_offset, o->numel, host_data(owners_.param(*o), scratch));
    fn(s, StateKind::m, o->param_offset, o->numel, host_data(o->m, scratch));
    if (owners_.has_row_state(*o)) {  // NorMuon: the rows this piece covers
      const auto [row, rows] = owners_.piece_rows(*o);
      fn(s, StateKind::v, row, rows, host_data(o->v.view(row, {rows}), scratch));
    } else if (o->v.defined()) {
      fn(s, StateKind::v, o->param_offset, o->numel, host_data(o->v, scratch));
    }
  }
}

void ShardedEngine::load_state(const StateReadFn& read, int64_t optimizer_steps) {
  std::vector<float> host;
  auto read_into = [&](const MatrixShard& s, StateKind kind, int64_t offset, const Tensor& dst) {
    host.resize(static_cast<size_t>(dst.numel()));
    read(s, kind, offset, dst.numel(), host.data());
    dst.copy_from_host(host.data());
  };
  for (size_t si = 0; si < plan_.shards.size(); ++si)
    for (const ShardPiece& p : plan_.shards[si].pieces)
      if (Tensor dst = units_.stored_piece(static_cast<int>(si), p); dst.defined())
        read_into(plan_.shards[si], StateKind::param, p.param_offset, dst);
  units_.finish_load();
  owners_.for_each_owned([&](OwnedPiece& o) {
    const MatrixShard& s = plan_.shards[o.shard];
    read_into(s, StateKind::m, o.param_offset, o.m);
    if (o.v.defined() && !owners_.has_row_state(o)) read_into(s, StateKind::v, o.param_offset, o.v);
  });
  // NorMuon: every row (an fsdp2 rank normalizes the whole gathered matrix)
  owners_.for_each_row_state([&](OwnedPiece& o) { read_into(plan_.shards[o.shard], StateKind::v, 0, o.v); });
  owners_.set_steps(optimizer_steps);
}

std::vector<ShardedEngine::StatePiece> ShardedEngine::state_pieces_of(int r) const {
  std::vector<StatePiece> out;
  for (size_t u = 0; u < plan_.units.size(); ++u)
    for (int si : plan_.shards_in_unit(static_cast<int>(u))) {
      const MatrixShard& s = plan_.shards[si];
      if (traits_.every_rank_updates_all) {
        if (r == 0)
          for (const ShardPiece& p : s.pieces) out.push_back({si, p.param_offset, p.numel});
      } else if (const ShardPiece* p = s.piece_on(r); p && p->numel > 0) {
        out.push_back({si, p->param_offset, p->numel});
      }
    }
  return out;
}

std::vector<OwnedPiece*> ShardedEngine::contributed_pieces() {
  std::vector<OwnedPiece*> out;
  if (traits_.every_rank_updates_all && rank_ != 0) return out;
  owners_.for_each_owned([&](OwnedPiece& o) { out.push_back(&o); });
  return out;
}

ShardedEngine::FullOptimizerState ShardedEngine::full_optimizer_state() {
  const bool normuon = opts_.muon.variant == MuonVariant::normuon;
  auto v_numel = [&](const StatePiece& p) {  // AdamW: one per element; NorMuon: one per row
    const MatrixShard& s = plan_.shards[p.shard];
    if (s.optimizer == OptimizerKind::adamw) return p.numel;
    return normuon ? p.numel / s.shape[1] : int64_t{0};
  };
  auto state_numel = [&](const StatePiece& p) { return p.numel + v_numel(p); };
  std::vector<int64_t> counts(static_cast<size_t>(world_), 0);
  std::vector<std::vector<StatePiece>> layout(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r) {
    layout[r] = state_pieces_of(r);
    for (const StatePiece& p : layout[r]) counts[r] += state_numel(p);
  }
  std::vector<float> send;
  send.reserve(static_cast<size_t>(counts[rank_]));
  for (OwnedPiece* o : contributed_pieces()) {
    const std::vector<float> m = o->m.to_vector();
    send.insert(send.end(), m.begin(), m.end());
    if (owners_.has_row_state(*o)) {
      const auto [row, rows] = owners_.piece_rows(*o);
      const std::vector<float> v = o->v.view(row, {rows}).to_vector();
      send.insert(send.end(), v.begin(), v.end());
    } else if (o->v.defined()) {
      const std::vector<float> v = o->v.to_vector();
      send.insert(send.end(), v.begin(), v.end());
    }
  }
  check_arg(static_cast<int64_t>(send.size()) == counts[rank_], "full_optimizer_state", "owned state does not match the plan");
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<float> all(static_cast<size_t>(total));
  comm_.all_gather_v(send.empty() ? nullptr : send.data(), all.data(), counts, DType::f32, CommPhase::other);
  FullOptimizerState out;
  for (const MatrixShard& s : plan_.shards) {
    out.m[s.name].assign(static_cast<size_t>(s.numel()), 0.0f);
    if (s.optimizer == OptimizerKind::adamw) out.v[s.name].assign(static_cast<size_t>(s.numel()), 0.0f);
    else if (normuon) out.v[s.name].assign(static_cast<size_t>(s.shape[0]), 0.0f);
  }
  const float* src = all.data();
  for (int r = 0; r < world_; ++r)
    for (const StatePiece& p : layout[r]) {
      const MatrixShard& s = plan_.shards[p.shard];
      std::copy(src, src + p.numel, out.m[s.name].begin() + p.param_offset);
      src += p.numel;
      if (const int64_t nv = v_numel(p); nv > 0) {  // AdamW: elements; NorMuon: the piece's rows
        const int64_t first = s.optimizer == OptimizerKind::adamw ? p.param_offset : p.param_offset / s.shape[1];
        std::copy(src, src + nv, out.v[s.name].begin() + first);
        src += nv;
      }
    }
  out.step = owners_.steps();
  return out;
}

std::string ShardedEngine::state_fingerprint() {
  // Per tensor (parameter, m, v of each shard) two 64-bit sums over its elements of a strong
  // 64-bit mix of (tensor key, logical index, f32 bits): order-free, so ranks add their parts.
  const size_t S = plan_.shards.size();
  std::vector<uint64_t> sums(S * 3 * 2, 0);
  auto accumulate = [&](size_t slot, const float* x, int64_t first_index, int64_t n) {
    uint64_t a = 0, b = 0;
    const uint64_t key = fingerprint_mix(0x6d66736470ull + slot);
#pragma omp parallel for schedule(static) reduction(+ : a, b) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, x + i, 4);
      const uint64_t v = (static_cast<uint64_t>(first_index + i) << 32 | bits) ^ key;
      a += fingerprint_mix(v);
      b += fingerprint_mix(v ^ 0x9e3779b97f4a7c15ull);
    }
    sums[2 * slot] += a;
    sums[2 * slot + 1] += b;
  };
  std::vector<float> scratch;
  for (OwnedPiece* o : contributed_pieces()) {
    const size_t base = static_cast<size_t>(o->shard) * 3;
    accumulate(base, host_data(owners_.param(*o), scratch), o->param_offset, o->numel);
    accumulate(base + 1, host_data(o->m, scratch), o->param_offset, o->numel);
    if (owners_.has_row_state(*o)) {  // NorMuon: keyed by row index
      const auto [row, rows] = owners_.piece_rows(*o);
      accumulate(base + 2, host_data(o->v.view(row, {rows}), scratch), row, rows);
    } else if (o->v.defined()) {
      accumulate(base + 2, host_data(o->v, scratch), o->param_offset, o->numel);
    }
  }
  std::vector<uint64_t> all(sums.size() * static_cast<size_t>(world_));
  comm_.all_gather_host(sums.data(), all.data(), static_cast<int64_t>(sums.size() * sizeof(uint64_t)), CommPhase::other);
  // Fold the canonical sequence (tensor slot, numel, both sums, then the step) into 128 bits.
  uint64_t h1 = fingerprint_mix(static_cast<uint64_t>(owners_.steps()) + 1), h2 = fingerprint_mix(h1 ^ 0x51ed27);
  for (size_t slot = 0; slot < S * 3; ++slot) {
    uint64_t a = 0, b = 0;
    for (int r = 0; r < world_; ++r) {
      a += all[static_cast<size_t>(r) * sums.size() + 2 * slot];
      b += all[static_cast<size_t>(r) * sums.size() + 2 * slot + 1];
    }
    const uint64_t numel = static_cast<uint64_t>(plan_.shards[slot / 3].numel());
    h1 = fingerprint_mix(h1 ^ fingerprint_mix(a + numel));
    h2 = fingerprint_mix(h2 ^ fingerprint_mix(b + slot));
  }
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h1),
                static_cast<unsigned long long>(h2));
  return hex;
}

}  // namespace mfsdp
