// DataLoader order (llm.c formula, shard switching, shuffle), state save/restore, EvalSplit coverage.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "runtime/data/data_loader.h"
#include "tests/data/test_util.h"

using namespace mfsdp;
using mfsdp::test::ramp;
using mfsdp::test::ScratchDir;
using Catch::Matchers::Contains;

namespace {

constexpr int64_t kVocab = 60000;  // tokens = position (< kVocab), so a token tells its offset

// Reads one micro-batch and checks it is the contiguous run at `offset` (+ token base `base`).
void expect_micro(DataLoader& dl, int B, int T, int64_t offset, uint32_t base = 0) {
  std::vector<int32_t> x(B * T), y(B * T);
  dl.next(x.data(), y.data());
  bool ok = true;
  for (int i = 0; i < B * T; ++i) ok = ok && x[i] == base + offset + i && y[i] == base + offset + i + 1;
  INFO("expected offset " << offset << " base " << base << ", got first input " << x[0]);
  CHECK(ok);
}

// First token (offset) of each micro-batch of one step, for every rank in `loaders`.
std::vector<int32_t> step_offsets(std::vector<DataLoader>& loaders, int A, int B, int T) {
  std::vector<int32_t> out;
  std::vector<int32_t> x(B * T), y(B * T);
  for (int k = 0; k < A; ++k)
    for (auto& dl : loaders) {
      dl.next(x.data(), y.data());
      for (int b = 0; b < B; ++b) out.push_back(x[b * T]);
    }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("sequential order follows llm.c's ((s*A + k)*W + r)*B*T", "[loader]") {
  ScratchDir dir;
  const int B = 2, T = 8, A = 2;
  const std::string p = dir.file("seq.bin");
  write_token_shard(p, ramp(10000, kVocab));
  for (int W : {1, 2}) {
    const int64_t G = static_cast<int64_t>(W) * A * B * T;
    const int64_t nb = (10000 - 1) / G;
    for (int r = 0; r < W; ++r) {
      DataLoader dl(p, B, T, r, W, A, false, 0, kVocab);
      CHECK(dl.global_batch_tokens() == G);
      for (int64_t s = 0; s < nb + 2; ++s)  // past the end: wraps to the same (only) shard
        for (int k = 0; k < A; ++k) expect_micro(dl, B, T, (((s % nb) * A + k) * W + r) * B * T);
    }
  }
}

TEST_CASE("sequential order switches shards and wraps around", "[loader]") {
  ScratchDir dir;
  const int B = 2, T = 4, A = 1, W = 2;
  const int64_t G = W * A * B * T;  // 16
  write_token_shard(dir.file("d_0.bin"), ramp(3 * G + 1, kVocab, 0));         // 3 global batches
  write_token_shard(dir.file("d_1.bin"), ramp(2 * G + G / 2, kVocab, 20000));  // 2 (rest unused)
  DataLoader r0(dir.file("d_*.bin"), B, T, 0, W, A, false, 0, kVocab);
  DataLoader r1(dir.file("d_*.bin"), B, T, 1, W, A, false, 0, kVocab);
  const std::vector<std::pair<uint32_t, int64_t>> expect = {
      {0, 0}, {0, 1}, {0, 2}, {20000, 0}, {20000, 1}, {0, 0}, {0, 1}};
  for (size_t s = 0; s < expect.size(); ++s) {
    const auto [base, window] = expect[s];
    expect_micro(r0, B, T, window * G + 0 * B * T, base);
    expect_micro(r1, B, T, window * G + 1 * B * T, base);
  }
  CHECK(r0.state() == LoaderState{1, 0, 2, G});
}

TEST_CASE("a global batch larger than a shard is refused with the numbers", "[loader]") {
  ScratchDir dir;
  write_token_shard(dir.file("tiny.bin"), ramp(100, kVocab));
  CHECK_THROWS_WITH(DataLoader(dir.file("tiny.bin"), 4, 8, 0, 2, 2, false, 0, kVocab),
                    Contains("has 100 tokens") && Contains("needs 129") && Contains("4*8*2*2 + 1"));
  CHECK_THROWS_AS(DataLoader(dir.file("tiny.bin"), 1, 8, 2, 2, 1, false, 0, kVocab), std::invalid_argument);
}

TEST_CASE("same global batch content at W=1 A=4 and W=2 A=2 and W=4 A=1", "[loader]") {
  ScratchDir dir;
  const int B = 1, T = 8;
  write_token_shard(dir.file("w_0.bin"), ramp(1000, kVocab));
  write_token_shard(dir.file("w_1.bin"), ramp(700, kVocab, 30000));
  for (bool shuffle : {false, true}) {
    std::vector<std::vector<int32_t>> ref;
    for (int W : {1, 2, 4}) {
      const int A = 4 / W;
      std::vector<DataLoader> ls;
      for (int r = 0; r < W; ++r) ls.emplace_back(dir.file("w_*.bin"), B, T, r, W, A, shuffle, 7, kVocab);
      for (int s = 0; s < 60; ++s) {
        auto offs = step_offsets(ls, A, B, T);
        if (W == 1) ref.push_back(offs);
        else CHECK(offs == ref[s]);
      }
    }
  }
}

TEST_CASE("shuffle is a deterministic function of the seed and covers every window per epoch", "[loader]") {
  ScratchDir dir;
  const int B = 2, T = 4, A = 1, W = 1;
  const int64_t G = 8;
  write_token_shard(dir.file("s_0.bin"), ramp(20 * G + 1, kVocab, 0));
  write_token_shard(dir.file("s_1.bin"), ramp(15 * G + 1, kVocab, 40000));
  auto run = [&](uint64_t seed, int steps) {
    DataLoader dl(dir.file("s_*.bin"), B, T, 0, W, A, true, seed, kVocab);
    std::vector<int32_t> firsts;
    std::vector<int32_t> x(B * T), y(B * T);
    for (int s = 0; s < steps; ++s) {
      dl.next(x.data(), y.data());
      for (int i = 0; i < B * T; ++i) REQUIRE(y[i] == x[i] + 1);  // targets stay shifted inputs
      firsts.push_back(x[0]);
    }
    return firsts;
  };
  const auto a = run(42, 70), b = run(42, 70), c = run(43, 70);
  CHECK(a == b);
  CHECK(a != c);
  // Epoch 0 is the first 35 steps: every window of both shards exactly once.
  std::set<int32_t> seen(a.begin(), a.begin() + 35);
  CHECK(seen.size() == 35);
  std::set<int32_t> all;
  for (int w = 0; w < 20; ++w) all.insert(w * G);
  for (int w = 0; w < 15; ++w) all.insert(40000 + w * G);
  CHECK(seen == all);
  std::set<int32_t> epoch1(a.begin() + 35, a.begin() + 70);
  CHECK(epoch1 == all);
  CHECK(!std::equal(a.begin(), a.begin() + 35, a.begin() + 35));  // epochs differ in order
  // Not the sequential order.
  const auto seq = [&] {
    DataLoader dl(dir.file("s_*.bin"), B, T, 0, W, A, false, 42, kVocab);
    std::vector<int32_t> f, x(B * T), y(B * T);
    for (int s = 0; s < 35; ++s) {
      dl.next(x.data(), y.data());
      f.push_back(x[0]);
    }
    return f;
  }();
  CHECK(!std::equal(seq.begin(), seq.end(), a.begin()));
}

TEST_CASE("state saves and restores, also at another world size", "[loader]") {
  ScratchDir dir;
  const int B = 2, T = 4;
  write_token_shard(dir.file("r_0.bin"), ramp(9 * 32 + 1, kVocab, 0));
  write_token_shard(dir.file("r_1.bin"), ramp(7 * 32 + 5, kVocab, 30000));
  for (bool shuffle : {false, true}) {
    // Reference: W=1, A=4 for 25 steps.
    std::vector<DataLoader> ref;
    ref.emplace_back(dir.file("r_*.bin"), B, T, 0, 1, 4, shuffle, 5, kVocab);
    std::vector<std::vector<int32_t>> steps;
    for (int s = 0; s < 25; ++s) steps.push_back(step_offsets(ref, 4, B, T));

    DataLoader first(dir.file("r_*.bin"), B, T, 0, 1, 4, shuffle, 5, kVocab);
    std::vector<int32_t> x(B * T), y(B * T);
    for (int s = 0; s < 12 * 4; ++s) first.next(x.data(), y.data());
    first.next(x.data(), y.data());
    CHECK_THROWS_AS(first.state(), std::logic_error);  // mid-step
    for (int k = 1; k < 4; ++k) first.next(x.data(), y.data());
    const nlohmann::json saved = first.state();  // after 13 steps
    CHECK(saved.at("global_batch_tokens") == 32);

    // Resume at W=2, A=2 (same global batch).
    std::vector<DataLoader> resumed;
    for (int r = 0; r < 2; ++r) {
      resumed.emplace_back(dir.file("r_*.bin"), B, T, r, 2, 2, shuffle, 5, kVocab);
      resumed.back().set_state(saved.get<LoaderState>());
    }
    for (int s = 13; s < 25; ++s) CHECK(step_offsets(resumed, 2, B, T) == steps[s]);
  }
  // Sequential with another global batch: converted through the token offset (rounded up).
  DataLoader a(dir.file("r_*.bin"), B, T, 0, 1, 1, false, 0, kVocab);  // G = 8
  a.set_state(LoaderState{0, 0, 3, 32});                                 // token 96 -> window 12
  CHECK(a.next_offset() == 96);
  a.set_state(LoaderState{0, 0, 1, 20});  // token 20 -> window ceil(20/8) = 3
  CHECK(a.next_offset() == 24);
  DataLoader sh(dir.file("r_*.bin"), B, T, 0, 1, 1, true, 0, kVocab);
  CHECK_THROWS_WITH(sh.set_state(LoaderState{0, 0, 1, 32}), Contains("saved global batch has 32 tokens"));
  CHECK_THROWS_AS(a.set_state(LoaderState{0, 5, 0, 8}), DataError);
  CHECK_THROWS_AS(nlohmann::json({{"epoch", 1}}).get<LoaderState>(), DataError);
}

TEST_CASE("eval windows cover the split exactly once", "[eval]") {
  ScratchDir dir;
  const int T = 8;
  write_token_shard(dir.file("v_0.bin"), ramp(5 * T + 3 + 1, kVocab, 0));  // 5 full windows + 3 targets
  write_token_shard(dir.file("v_1.bin"), ramp(4 * T + 1, kVocab, 30000));  // 4 full windows
  for (bool pad : {true, false}) {
    for (int W : {1, 2, 3, 4}) {
      std::multiset<int32_t> targets;
      int64_t counted = 0, total_seqs = 0;
      for (int r = 0; r < W; ++r) {
        EvalSplit ev(dir.file("v_*.bin"), T, r, W, kVocab, 0, pad);
        CHECK(ev.num_sequences() == (pad ? 10 : 9));
        const int B = 2;
        const int64_t nb = ev.num_batches_all_ranks(B);
        CHECK(nb >= ev.num_batches(B));
        for (int64_t b = 0; b < nb; ++b) {
          std::vector<int32_t> x(B * T, -7), y(B * T, -7);
          const int64_t rows = ev.batch(b, B, x.data(), y.data());
          // global batch b*W + r of B consecutive sequences: the same batches at every world size
          CHECK(ev.first_sequence(b, B) == (b * W + r) * B);
          CHECK(rows == std::max<int64_t>(0, std::min<int64_t>(B, ev.num_sequences() - ev.first_sequence(b, B))));
          if (rows > 0) CHECK(b < ev.num_batches(B));
          counted += ev.num_targets(ev.first_sequence(b, B), ev.first_sequence(b, B) + rows);
          for (int64_t i = 0; i < rows * T; ++i) {
            if (y[i] == -1) continue;
            targets.insert(y[i]);
            CHECK(x[i] == y[i] - 1);
          }
          total_seqs += rows;
        }
      }
      CHECK(total_seqs == (pad ? 10 : 9));
      std::multiset<int32_t> expect;
      for (int i = 1; i <= (pad ? 5 * T + 3 : 5 * T); ++i) expect.insert(i);
      for (int i = 1; i <= 4 * T; ++i) expect.insert(30000 + i);
      CHECK(targets == expect);
      CHECK(counted == static_cast<int64_t>(expect.size()));
    }
  }
  // eval_tokens limits the split to ceil(max_tokens / T) sequences.
  EvalSplit lim(dir.file("v_*.bin"), T, 0, 1, kVocab, 20, true);
  CHECK(lim.num_sequences() == 3);
}
