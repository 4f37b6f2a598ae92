// MPI backend tests; run under mpirun at 1, 2, 3, 4 and 8 ranks (and once without mpirun).
// Data are small exact values so every expected result is a closed form, checked exactly.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "comm/mpi_backends.h"

using namespace mfsdp;

namespace {

/// A host buffer of f32 or bf16 elements with float accessors.
struct Buf {
  DType dt;
  std::vector<unsigned char> b;
  Buf(DType d, int64_t n) : dt(d), b(static_cast<size_t>(n * dtype_size(d)), 0xAB) {}
  int64_t size() const { return static_cast<int64_t>(b.size()) / dtype_size(dt); }
  void* data() { return b.empty() ? nullptr : b.data(); }
  void set(int64_t i, float v) {
    if (dt == DType::f32) std::memcpy(&b[i * 4], &v, 4);
    else { bf16 h = float_to_bf16(v); std::memcpy(&b[i * 2], &h, 2); }
  }
  float get(int64_t i) const {
    if (dt == DType::f32) { float v; std::memcpy(&v, &b[i * 4], 4); return v; }
    bf16 h; std::memcpy(&h, &b[i * 2], 2); return bf16_to_float(h);
  }
};

/// Deterministic per-rank value of global element i; exact in bf16 and f32 and their sums.
float val(int rank, int64_t i, DType dt) {
  return float(rank + 1) + float(i % 5) + (dt == DType::f32 ? 0.25f * float(i % 3) : 0.0f);
}
/// Closed form of the op over ranks 0..n-1 of val(r, i).
float expect_reduced(int n, int64_t i, DType dt, ReduceOp op) {
  const float extra = float(i % 5) + (dt == DType::f32 ? 0.25f * float(i % 3) : 0.0f);
  if (op == ReduceOp::max) return float(n) + extra;
  const float sum = float(n * (n + 1) / 2) + float(n) * extra;  // exact: small multiples of 1/4
  float r = op == ReduceOp::mean ? sum / float(n) : sum;
  return dt == DType::bf16 ? bf16_to_float(float_to_bf16(r)) : r;
}

std::vector<std::vector<int64_t>> layouts(int n) {
  std::vector<std::vector<int64_t>> L;
  std::vector<int64_t> uneven(n);
  for (int r = 0; r < n; ++r) uneven[r] = (r * 7 + 3) % 11;
  if (n > 1) uneven[1] = 0;
  L.push_back(uneven);
  std::vector<int64_t> one_small(n, 0);  // 7 of 8 segments empty (at 8 ranks)
  one_small[n / 2] = 5;
  L.push_back(one_small);
  L.push_back(std::vector<int64_t>(n, 0));  // all empty
  std::vector<int64_t> owner0(n, 0);        // one rank owns everything
  owner0[0] = 100;
  L.push_back(owner0);
  std::vector<int64_t> last_big(n, 1);  // large last segment: many chunk rounds
  last_big[n - 1] = 1000;
  L.push_back(last_big);
  return L;
}

std::vector<CommOptions> option_sets() {
  CommOptions tiny;
  tiny.reduce_chunk_bytes = 12;  // 3 f32 / 6 bf16 elements per round
  tiny.max_message_elements = 5;  // split messages, point-to-point gather path
  return {CommOptions{}, tiny};
}

const DType kDtypes[] = {DType::f32, DType::bf16};

}  // namespace

TEST_CASE("comm.mpi basics: rank, world, names, split_even", "[comm]") {
  auto c = make_mpi_communicator();
  int r, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  CHECK(c->rank() == r);
  CHECK(c->world_size() == n);
  CHECK(c->local_rank() == r);  // every rank runs on this one node
  CHECK(c->device() == Device::CPU);
  CHECK(std::string(comm_phase_name(CommPhase::grad_reduce)) == "grad_reduce");
  CHECK(std::string(comm_phase_name(CommPhase::fwd_gather)) == "fwd_gather");
  CHECK(split_even(10, 4) == std::vector<int64_t>{3, 3, 2, 2});
  CHECK(split_even(2, 3) == std::vector<int64_t>{1, 1, 0});
  CHECK_THROWS_AS(split_even(5, 0), std::invalid_argument);
}

TEST_CASE("comm.mpi all_gather and all_gather_v match closed forms", "[comm]") {
  for (const auto& opts : option_sets()) {
    auto c = make_mpi_communicator(MPI_COMM_WORLD, opts);
    const int n = c->world_size(), me = c->rank();
    for (DType dt : kDtypes) {
      const int64_t count = 13;
      Buf s(dt, count), rbuf(dt, count * n);
      for (int64_t i = 0; i < count; ++i) s.set(i, val(me, i, dt));
      c->all_gather(s.data(), rbuf.data(), count, dt, CommPhase::fwd_gather);
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < count; ++i) REQUIRE(rbuf.get(r * count + i) == val(r, i, dt));

      for (const auto& counts : layouts(n)) {
        const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
        int64_t off = 0;
        for (int r = 0; r < me; ++r) off += counts[r];
        Buf sv(dt, counts[me]), rv(dt, total);
        for (int64_t i = 0; i < counts[me]; ++i) sv.set(i, val(me, off + i, dt));
        c->all_gather_v(sv.data(), rv.data(), counts, dt, CommPhase::bwd_gather);
        int64_t g = 0;
        for (int r = 0; r < n; ++r)
          for (int64_t i = 0; i < counts[r]; ++i, ++g) REQUIRE(rv.get(g) == val(r, g, dt));
        // In place: this rank's part already sits in the output buffer.
        Buf ip(dt, total);
        for (int64_t i = 0; i < counts[me]; ++i) ip.set(off + i, val(me, off + i, dt));
        c->all_gather_v(total ? ip.b.data() + off * dtype_size(dt) : nullptr, ip.data(), counts, dt,
                        CommPhase::bwd_gather);
        for (int64_t i = 0; i < total; ++i) REQUIRE(ip.get(i) == rv.get(i));
      }
    }
  }
}

TEST_CASE("comm.mpi reduce_scatter and reduce_scatter_v match closed forms", "[comm]") {
  for (const auto& opts : option_sets()) {
    auto c = make_mpi_communicator(MPI_COMM_WORLD, opts);
    const int n = c->world_size(), me = c->rank();
    for (DType dt : kDtypes) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max}) {
        const int64_t count = 11;
        Buf s(dt, count * n), rb(dt, count);
        for (int64_t i = 0; i < count * n; ++i) s.set(i, val(me, i, dt));
        c->reduce_scatter(s.data(), rb.data(), count, dt, op, CommPhase::grad_reduce);
        for (int64_t i = 0; i < count; ++i)
          REQUIRE(rb.get(i) == expect_reduced(n, me * count + i, dt, op));

        for (const auto& counts : layouts(n)) {
          const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
          int64_t off = 0;
          for (int r = 0; r < me; ++r) off += counts[r];
          Buf sv(dt, total), rv(dt, counts[me]);
          for (int64_t i = 0; i < total; ++i) sv.set(i, val(me, i, dt));
          c->reduce_scatter_v(sv.data(), rv.data(), counts, dt, op, CommPhase::grad_reduce);
          for (int64_t i = 0; i < counts[me]; ++i)
            REQUIRE(rv.get(i) == expect_reduced(n, off + i, dt, op));
          // In place: recv is this rank's segment of the send buffer.
          c->reduce_scatter_v(sv.data(), total ? sv.b.data() + off * dtype_size(dt) : nullptr,
                              counts, dt, op, CommPhase::grad_reduce);
          for (int64_t i = 0; i < counts[me]; ++i) REQUIRE(sv.get(off + i) == rv.get(i));
        }
      }
    }
  }
}

TEST_CASE("comm.mpi accumulate adds each rank's contribution onto recv in rank order", "[comm]") {
  for (const auto& opts : option_sets()) {
    auto c = make_mpi_communicator(MPI_COMM_WORLD, opts);
    const int n = c->world_size(), me = c->rank();
    // Contributions whose f32 sum depends on association: recv starts at 1, rank r adds
    // (r + 1) * 2^-24 (plus a per-element offset), so ((1 + c_0) + c_1) + ... rounds at every step.
    auto contrib = [](int r, int64_t i) { return float(r + 1) * 0x1p-24f + float(i % 4) * 0x1p-23f; };
    for (const auto& counts : layouts(n)) {
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
      int64_t off = 0;
      for (int r = 0; r < me; ++r) off += counts[r];
      std::vector<float> send(static_cast<size_t>(total)), recv(static_cast<size_t>(counts[me]), 1.0f);
      for (int64_t i = 0; i < total; ++i) send[i] = contrib(me, i);
      c->reduce_scatter_v(total ? send.data() : nullptr, counts[me] ? recv.data() : nullptr, counts, DType::f32,
                          ReduceOp::accumulate, CommPhase::grad_reduce);
      for (int64_t i = 0; i < counts[me]; ++i) {
        float want = 1.0f;
        for (int r = 0; r < n; ++r) want += contrib(r, off + i);  // the documented order
        REQUIRE(std::memcmp(&recv[i], &want, 4) == 0);
      }
    }
    if (n >= 2) {  // the order is observable: 1 + (sum of the others) rounds differently
      float ordered = 1.0f, grouped = 0.0f;
      for (int r = 0; r < n; ++r) ordered += contrib(r, 0);
      for (int r = 0; r < n; ++r) grouped += contrib(r, 0);
      CHECK(ordered != 1.0f + grouped);
    }
    // bf16 contributions (mixed-precision gradient reduction) are widened and added in f32
    for (const auto& counts : layouts(n)) {
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
      int64_t off = 0;
      for (int r = 0; r < me; ++r) off += counts[r];
      auto contrib16 = [](int r, int64_t i) { return float_to_bf16(0.001f * float(r + 1) + 0.37f * float(i % 7)); };
      std::vector<bf16> send(static_cast<size_t>(total));
      std::vector<float> recv(static_cast<size_t>(counts[me]), 1.0f);
      for (int64_t i = 0; i < total; ++i) send[i] = contrib16(me, i);
      c->reduce_scatter_v(total ? send.data() : nullptr, counts[me] ? recv.data() : nullptr, counts, DType::bf16,
                          ReduceOp::accumulate, CommPhase::grad_reduce);
      for (int64_t i = 0; i < counts[me]; ++i) {
        float want = 1.0f;
        for (int r = 0; r < n; ++r) want += bf16_to_float(contrib16(r, off + i));
        REQUIRE(std::memcmp(&recv[i], &want, 4) == 0);
      }
    }
    std::vector<float> buf(static_cast<size_t>(n) * 2, 0.0f);
    CHECK_THROWS_AS(c->reduce_scatter(buf.data(), buf.data(), 2, DType::i32, ReduceOp::accumulate,
                                      CommPhase::grad_reduce),
                    std::invalid_argument);
    CHECK_THROWS_AS(c->all_reduce(buf.data(), 2, DType::f32, ReduceOp::accumulate, CommPhase::grad_reduce),
                    std::invalid_argument);
  }
}

TEST_CASE("comm.mpi i32 (token ids) moves all four bytes of every element and is never reduced", "[comm]") {
  auto c = make_mpi_communicator();
  const int n = c->world_size(), me = c->rank();
  std::vector<int64_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = 3 + 5 * r;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  auto id = [](int r, int64_t i) { return static_cast<int32_t>(0x01020304 * (r + 1) + 65537 * i); };  // high bytes used
  std::vector<int32_t> mine(counts[me]), all(total, -1);
  for (int64_t i = 0; i < counts[me]; ++i) mine[i] = id(me, i);
  c->all_gather_v(mine.data(), all.data(), counts, DType::i32, CommPhase::other);
  int64_t at = 0;
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < counts[r]; ++i) REQUIRE(all[at++] == id(r, i));
  std::vector<int32_t> b(7);
  for (int64_t i = 0; i < 7; ++i) b[i] = id(me, i);
  c->broadcast(b.data(), 7, DType::i32, n - 1, CommPhase::other);
  for (int64_t i = 0; i < 7; ++i) REQUIRE(b[i] == id(n - 1, i));
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max})
    CHECK_THROWS_WITH(c->all_reduce(b.data(), 7, DType::i32, op, CommPhase::other),
                      Catch::Contains("reductions take f32 or bf16 values, got i32"));
  CHECK_THROWS_AS(c->reduce_scatter_v(all.data(), mine.data(), counts, DType::i32, ReduceOp::sum, CommPhase::other),
                  std::invalid_argument);
}

TEST_CASE("comm.mpi all_gather_host moves every rank's bytes", "[comm]") {
  auto c = make_mpi_communicator();
  const int n = c->world_size(), me = c->rank();
  const int64_t mine[3] = {me, -me, int64_t(1) << (40 + me % 8)};
  std::vector<int64_t> all(static_cast<size_t>(n) * 3);
  c->all_gather_host(mine, all.data(), sizeof(mine), CommPhase::other);
  for (int r = 0; r < n; ++r) {
    CHECK(all[r * 3] == r);
    CHECK(all[r * 3 + 1] == -r);
    CHECK(all[r * 3 + 2] == int64_t(1) << (40 + r % 8));
  }
  CHECK(c->counters().at(CommPhase::other).bytes_received == int64_t(sizeof(mine)) * (n - 1));
}

TEST_CASE("comm.mpi all_reduce, all_reduce_scalar, broadcast, send_recv", "[comm]") {
  for (const auto& opts : option_sets()) {
    auto c = make_mpi_communicator(MPI_COMM_WORLD, opts);
    const int n = c->world_size(), me = c->rank();
    for (DType dt : kDtypes) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max}) {
        for (int64_t count : {int64_t(0), int64_t(1), int64_t(2), int64_t(37)}) {
          Buf b(dt, count);
          for (int64_t i = 0; i < count; ++i) b.set(i, val(me, i, dt));
          c->all_reduce(b.data(), count, dt, op, CommPhase::opt_step);
          for (int64_t i = 0; i < count; ++i) REQUIRE(b.get(i) == expect_reduced(n, i, dt, op));
        }
      }
      const int root = n - 1;
      Buf bc(dt, 29);
      for (int64_t i = 0; i < 29; ++i) bc.set(i, me == root ? val(root, i, dt) : -1.0f);
      c->broadcast(bc.data(), 29, dt, root, CommPhase::other);
      for (int64_t i = 0; i < 29; ++i) REQUIRE(bc.get(i) == val(root, i, dt));

      // Ring: two sends and two receives in one group (includes self-exchange at 1 rank).
      const int next = (me + 1) % n, prev = (me + n - 1) % n;
      Buf s1(dt, 9), s2(dt, 4), r1(dt, 9), r2(dt, 4);
      for (int64_t i = 0; i < 9; ++i) s1.set(i, val(me, i, dt));
      for (int64_t i = 0; i < 4; ++i) s2.set(i, -val(me, i, dt));
      c->send_recv({{false, prev, r1.data(), 9, dt}, {true, next, s1.data(), 9, dt},
                    {true, next, s2.data(), 4, dt}, {false, prev, r2.data(), 4, dt}},
                   CommPhase::other);
      for (int64_t i = 0; i < 9; ++i) REQUIRE(r1.get(i) == val(prev, i, dt));
      for (int64_t i = 0; i < 4; ++i) REQUIRE(r2.get(i) == -val(prev, i, dt));
    }
    CHECK(c->all_reduce_scalar(me + 1.0, ReduceOp::sum, CommPhase::other) == n * (n + 1) / 2.0);
    CHECK(c->all_reduce_scalar(me + 1.0, ReduceOp::max, CommPhase::other) == double(n));
    CHECK(c->all_reduce_scalar(me + 1.0, ReduceOp::mean, CommPhase::other) == (n + 1) / 2.0);
    c->barrier();
  }
}

TEST_CASE("comm.mpi all_to_all_v moves every segment to its rank, in rank order", "[comm]") {
  auto c = make_mpi_communicator(MPI_COMM_WORLD);
  const int n = c->world_size(), r = c->rank();
  // rank s sends (s + 2 d) % 5 elements to rank d (zero counts included), element i valued
  // 1000 s + 10 d + i: every received value names its source, destination and position
  auto count = [](int s, int d) { return static_cast<int64_t>((s + 2 * d) % 5); };
  for (DType dt : {DType::f32, DType::i32}) {
    std::vector<int64_t> send_counts(n);
    for (int d = 0; d < n; ++d) send_counts[d] = count(r, d);
    const std::vector<int64_t> recv_counts = c->exchange_counts(send_counts, CommPhase::other);
    for (int s = 0; s < n; ++s) CHECK(recv_counts[s] == count(s, r));
    std::vector<int32_t> send;
    for (int d = 0; d < n; ++d)
      for (int64_t i = 0; i < send_counts[d]; ++i) send.push_back(1000 * r + 10 * d + static_cast<int32_t>(i));
    std::vector<float> send_f(send.begin(), send.end());
    const int64_t total = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
    std::vector<int32_t> recv(static_cast<size_t>(total), -1);
    std::vector<float> recv_f(recv.size(), -1.0f);
    c->reset_counters();
    if (dt == DType::f32) c->all_to_all_v(send_f.data(), send_counts, recv_f.data(), recv_counts, dt, CommPhase::other);
    else c->all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, dt, CommPhase::other);
    size_t k = 0;
    for (int s = 0; s < n; ++s)
      for (int64_t i = 0; i < recv_counts[s]; ++i, ++k) {
        const int32_t want = 1000 * s + 10 * r + static_cast<int32_t>(i);
        if (dt == DType::f32) CHECK(recv_f[k] == static_cast<float>(want));
        else CHECK(recv[k] == want);
      }
    // the own segment is no traffic
    const PhaseCounters& pc = c->counters().at(CommPhase::other);
    CHECK(pc.bytes_sent == 4 * (std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0}) - send_counts[r]));
    CHECK(pc.bytes_received == 4 * (total - recv_counts[r]));
  }
  // argument errors throw on every rank before any message
  std::vector<int64_t> wrong(n + 1, 0), negative(n, 0);
  negative[0] = -1;
  CHECK_THROWS_WITH(c->exchange_counts(wrong, CommPhase::other), Catch::Contains("exchange_counts"));
  CHECK_THROWS_WITH(c->all_to_all_v(nullptr, negative, nullptr, std::vector<int64_t>(n, 0), DType::f32, CommPhase::other),
                    Catch::Contains("all_to_all_v"));
  std::vector<int64_t> self(n, 0), other(n, 0);
  self[r] = 1;
  float x = 0;
  CHECK_THROWS_WITH(c->all_to_all_v(&x, self, &x, other, DType::f32, CommPhase::other),
                    Catch::Contains("sends itself 1 elements but expects 0"));
}

TEST_CASE("comm.mpi reduce_scatter_v is bitwise deterministic and rank-ordered", "[comm]") {
  auto c = make_mpi_communicator();
  CommOptions tiny;
  tiny.reduce_chunk_bytes = 64;
  auto ct = make_mpi_communicator(MPI_COMM_WORLD, tiny);
  const int n = c->world_size(), me = c->rank();
  for (DType dt : kDtypes) {
    std::vector<int64_t> counts(n);
    for (int r = 0; r < n; ++r) counts[r] = 300 + 97 * r;
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
    int64_t off = 0;
    for (int r = 0; r < me; ++r) off += counts[r];
    // Values of very different magnitudes, so the summation order changes the rounding.
    auto v = [&](int r, int64_t i) {
      return float(std::sin(0.37 * double(i) + 1.3 * r) * std::pow(10.0, double((i + r) % 7) - 3));
    };
    Buf s(dt, total);
    for (int64_t i = 0; i < total; ++i) s.set(i, v(me, i));
    std::vector<Buf> outs;
    for (int rep = 0; rep < 3; ++rep) {
      outs.emplace_back(dt, counts[me]);
      c->reduce_scatter_v(s.data(), outs.back().data(), counts, dt, ReduceOp::sum,
                          CommPhase::grad_reduce);
    }
    outs.emplace_back(dt, counts[me]);
    ct->reduce_scatter_v(s.data(), outs.back().data(), counts, dt, ReduceOp::sum,
                         CommPhase::grad_reduce);
    for (size_t k = 1; k < outs.size(); ++k) REQUIRE(outs[k].b == outs[0].b);
    // Reference: ((c_0 + c_1) + c_2) + ... in f32 from the values each rank stored.
    for (int64_t i = 0; i < counts[me]; ++i) {
      Buf one(dt, 1);
      float acc = 0;
      for (int r = 0; r < n; ++r) {
        one.set(0, v(r, off + i));
        acc = r == 0 ? one.get(0) : acc + one.get(0);
      }
      one.set(0, acc);
      REQUIRE(outs[0].get(i) == one.get(0));
    }
  }
  // all_reduce gives bitwise the same bytes on every rank.
  Buf a(DType::f32, 101);
  for (int64_t i = 0; i < 101; ++i) a.set(i, float(std::sin(double(i + 7 * me)) * 1e3));
  c->all_reduce(a.data(), 101, DType::f32, ReduceOp::sum, CommPhase::other);
  Buf all(DType::f32, 101 * n);
  c->all_gather(a.data(), all.data(), 101, DType::f32, CommPhase::other);
  for (int r = 0; r < n; ++r) REQUIRE(std::memcmp(all.b.data() + r * 404, a.b.data(), 404) == 0);
}

TEST_CASE("comm.mpi start_reduce_scatter_v: the bytes of reduce_scatter_v, with collectives in between",
          "[comm]") {
  for (const CommOptions& o : option_sets()) {
    auto c = make_mpi_communicator(MPI_COMM_WORLD, o);
    const int n = c->world_size(), me = c->rank();
    for (DType dt : kDtypes)
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::accumulate})
        for (const auto& counts : layouts(n)) {
          INFO("dtype " << dtype_name(dt) << " accumulate " << (op == ReduceOp::accumulate) << " chunk "
                        << o.reduce_chunk_bytes << " counts[0] " << counts[0]);
          const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
          const DType out_dt = op == ReduceOp::accumulate ? DType::f32 : dt;
          Buf s1(dt, total), s2(dt, total);
          for (int64_t i = 0; i < total; ++i) {
            s1.set(i, std::sin(0.37f * float(i) + 1.3f * float(me)) * float(1 + (i + me) % 7));
            s2.set(i, val(me, i, dt));
          }
          auto fresh = [&] {
            Buf b(out_dt, counts[me]);
            for (int64_t i = 0; i < counts[me]; ++i) b.set(i, 0.5f * float(i % 9));
            return b;
          };
          Buf want1 = fresh(), want2 = fresh(), got1 = fresh(), got2 = fresh();
          c->reduce_scatter_v(s1.data(), want1.data(), counts, dt, op, CommPhase::grad_reduce);
          c->reduce_scatter_v(s2.data(), want2.data(), counts, dt, op, CommPhase::grad_reduce);
          // two started reductions, a blocking gather and a blocking reduction between start and wait
          auto p1 = c->start_reduce_scatter_v(s1.data(), got1.data(), counts, dt, op, CommPhase::grad_reduce);
          auto p2 = c->start_reduce_scatter_v(s2.data(), got2.data(), counts, dt, op, CommPhase::grad_reduce);
          Buf gs(DType::f32, 3), g(DType::f32, 3 * n);
          c->all_gather_v(gs.data(), g.data(), std::vector<int64_t>(n, 3), DType::f32, CommPhase::other);
          Buf blocking = fresh();
          c->reduce_scatter_v(s2.data(), blocking.data(), counts, dt, op, CommPhase::other);
          p1->wait();
          p2->wait();
          CHECK(got1.b == want1.b);
          CHECK(got2.b == want2.b);
          CHECK(blocking.b == want2.b);
          // destroying an unwaited handle waits
          Buf got3 = fresh();
          c->start_reduce_scatter_v(s1.data(), got3.data(), counts, dt, op, CommPhase::grad_reduce).reset();
          CHECK(got3.b == want1.b);
        }
    // counted when started: the same bytes as the blocking call
    c->reset_counters();
    std::vector<int64_t> counts(n, 4);
    Buf s(DType::f32, 4 * n), out(DType::f32, 4);
    c->start_reduce_scatter_v(s.data(), out.data(), counts, DType::f32, ReduceOp::sum, CommPhase::grad_reduce)->wait();
    const auto started = c->counters().at(CommPhase::grad_reduce);
    c->reset_counters();
    c->reduce_scatter_v(s.data(), out.data(), counts, DType::f32, ReduceOp::sum, CommPhase::grad_reduce);
    CHECK(started.bytes_sent == c->counters().at(CommPhase::grad_reduce).bytes_sent);
    CHECK(started.bytes_received == c->counters().at(CommPhase::grad_reduce).bytes_received);
    CHECK(started.calls == 1);
  }
}

TEST_CASE("comm.mpi counters are exact for a known sequence", "[comm]") {
  auto c = make_mpi_communicator();
  const int64_t n = c->world_size(), me = c->rank();
  std::vector<int64_t> counts(n, 0);
  for (int r = 0; r < n; ++r) counts[r] = 2 * r + 1;  // total n^2
  const int64_t total = n * n;
  std::vector<float> big(total, 1.0f), seg(counts[me], 1.0f), eq(10 * n, 1.0f);
  std::vector<uint16_t> hb(total, 0), hseg(counts[me], 0);

  std::vector<float> ten(10, 2.0f);
  c->all_gather(nullptr, nullptr, 0, DType::f32, CommPhase::fwd_gather);  // a call, no bytes
  c->all_gather(ten.data(), eq.data(), 10, DType::f32, CommPhase::fwd_gather);
  c->all_gather_v(hseg.data(), hb.data(), counts, DType::bf16, CommPhase::bwd_gather);
  c->reduce_scatter_v(big.data(), seg.data(), counts, DType::f32, ReduceOp::sum,
                      CommPhase::grad_reduce);
  c->reduce_scatter_v(hb.data(), hseg.data(), counts, DType::bf16, ReduceOp::mean,
                      CommPhase::grad_reduce);
  c->all_reduce(eq.data(), 10, DType::f32, ReduceOp::sum, CommPhase::opt_step);
  c->broadcast(eq.data(), 7, DType::f32, 0, CommPhase::other);
  double s = c->all_reduce_scalar(1.0, ReduceOp::sum, CommPhase::other);
  CHECK(s == double(n));
  c->barrier();

  const auto& k = c->counters();
  const auto& fg = k.at(CommPhase::fwd_gather);
  CHECK(fg.calls == 2);
  CHECK(fg.bytes_sent == 10 * (n - 1) * 4);
  CHECK(fg.bytes_received == 10 * (n - 1) * 4);
  const auto& bg = k.at(CommPhase::bwd_gather);
  CHECK(bg.calls == 1);
  CHECK(bg.bytes_sent == counts[me] * (n - 1) * 2);
  CHECK(bg.bytes_received == (total - counts[me]) * 2);
  const auto& gr = k.at(CommPhase::grad_reduce);
  CHECK(gr.calls == 2);
  CHECK(gr.bytes_sent == (total - counts[me]) * (4 + 2));
  CHECK(gr.bytes_received == counts[me] * (n - 1) * (4 + 2));
  const auto& os = k.at(CommPhase::opt_step);
  const auto parts = split_even(10, int(n));
  CHECK(os.calls == 1);
  CHECK(os.bytes_sent == ((10 - parts[me]) + parts[me] * (n - 1)) * 4);
  CHECK(os.bytes_received == os.bytes_sent);
  const auto& ot = k.at(CommPhase::other);
  CHECK(ot.calls == 3);
  CHECK(ot.bytes_sent == (me == 0 ? 7 * (n - 1) * 4 : 0) + 8 * (n - 1));
  CHECK(ot.bytes_received == (me == 0 ? 0 : 7 * 4) + 8 * (n - 1));
  const auto t = k.total();
  CHECK(t.calls == 9);
  CHECK(t.bytes_sent == fg.bytes_sent + bg.bytes_sent + gr.bytes_sent + os.bytes_sent +
                            ot.bytes_sent);
  CHECK(t.seconds >= 0.0);
  c->reset_counters();
  CHECK(c->counters().total().calls == 0);
  CHECK(c->counters().total().bytes_sent == 0);
}

TEST_CASE("comm.mpi argument errors throw before communicating", "[comm]") {
  auto c = make_mpi_communicator();
  const int n = c->world_size();
  std::vector<float> buf(64);
  std::vector<int64_t> wrong(n + 1, 1);
  try {
    c->all_gather_v(buf.data(), buf.data(), wrong, DType::f32, CommPhase::fwd_gather);
    FAIL("no throw");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("[all_gather_v] counts has " + std::to_string(n + 1) +
                                     " entries, world size is " + std::to_string(n)) !=
          std::string::npos);
  }
  std::vector<int64_t> neg(n, 1);
  neg[0] = -2;
  CHECK_THROWS_AS(c->reduce_scatter_v(buf.data(), buf.data(), neg, DType::f32, ReduceOp::sum,
                                      CommPhase::grad_reduce),
                  std::invalid_argument);
  CHECK_THROWS_AS(c->broadcast(buf.data(), 4, DType::f32, n, CommPhase::other),
                  std::invalid_argument);
  CHECK_THROWS_AS(c->all_reduce(nullptr, 3, DType::f32, ReduceOp::sum, CommPhase::other),
                  std::invalid_argument);
  CHECK(c->counters().total().calls == 0);
}
