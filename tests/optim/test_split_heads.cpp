// split_heads as the engine runs it (the Tensor phase API of optim/step.h over a fused QKV matrix)
// equals a model whose every attention head's q, k and v projections are separate matrices, each
// with its own Muon (or NorMuon) state, over several steps, bit for bit.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "optim/step.h"
#include "tests/optim/test_helpers.h"

using namespace mfsdp;
using mfsdp::test::randn;

namespace {

Tensor host_tensor(const std::vector<float>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::f32, Device::CPU);
  t.copy_from_host(v.data());
  return t;
}

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

}  // namespace

TEST_CASE("split_heads equals separate per-head matrices, Muon and NorMuon, three steps", "[split_heads]") {
  const int64_t C = 32, head_dim = 8, heads = 3 * C / head_dim, rows = 3 * C, cols = C, n = rows * cols;
  const int64_t hn = head_dim * cols;  // elements of one head block
  for (MuonVariant variant : {MuonVariant::muon, MuonVariant::normuon})
    for (Orthogonalizer method : {Orthogonalizer::newton_schulz5, Orthogonalizer::gram_newton_schulz}) {
      INFO(muon_variant_name(variant) << " " << orthogonalizer_name(method));
      MuonOptions opt;
      opt.orthogonalizer = method;
      opt.variant = variant;
      opt.split_heads = true;
      opt.head_dim = head_dim;
      opt.weight_decay = 0.01;
      const bool normuon = variant == MuonVariant::normuon;
      const int64_t blocks = detail::muon_block_count(rows, cols, opt, 3, "test");
      REQUIRE(blocks == heads);
      // the fused matrix with the engine's phases
      Tensor W = host_tensor(randn(n, 7, 0.02f)), M = Tensor::zeros({n}), V = Tensor::zeros({rows});
      // the same values as `heads` separate [head_dim, cols] matrices, each with its own state
      std::vector<float> w_sep = W.to_vector(), m_sep(n, 0.0f), v_sep(rows, 0.0f), u_sep(hn);
      MuonOptions single = opt;
      single.split_heads = false;
      for (int step = 0; step < 3; ++step) {
        const std::vector<float> g = randn(n, 100 + step);
        const double lr = 0.02 * (step + 1);
        Tensor G = host_tensor(g), U = Tensor::empty({n});
        muon_momentum(G, M, U, opt);
        muon_orthogonalize(U, U, rows, cols, blocks, opt);
        if (normuon) normuon_normalize(U, V, rows, cols, blocks, opt);
        muon_apply(W, U, lr, normuon ? 1.0 : muon_scale(head_dim, cols, opt.scale_rule), opt.weight_decay);
        for (int64_t h = 0; h < heads; ++h) {
          float *w = w_sep.data() + h * hn, *m = m_sep.data() + h * hn;
          if (!normuon) {
            muon_step_cpu(w, g.data() + h * hn, m, head_dim, cols, lr, single, 1);
            continue;
          }
          muon_momentum_cpu(g.data() + h * hn, m, u_sep.data(), hn, single);
          orthogonalize_cpu(u_sep.data(), u_sep.data(), head_dim, cols, single.ns_steps, method);
          normuon_normalize_cpu(u_sep.data(), v_sep.data() + h * head_dim, head_dim, cols, opt.beta2, opt.normuon_eps);
          muon_apply_update_cpu(w, u_sep.data(), hn, lr, 1.0, opt.weight_decay);
        }
        INFO("step " << step);
        CHECK(same_bits(W.data_f32(), w_sep.data(), n));
        CHECK(same_bits(M.data_f32(), m_sep.data(), n));
        if (normuon) CHECK(same_bits(V.data_f32(), v_sep.data(), rows));
      }
      // ... and is not the split_qkv step (three q|k|v blocks)
      if (!normuon) {
        MuonOptions qkv = single;
        qkv.split_qkv = true;
        const std::vector<float> g = randn(n, 100);
        std::vector<float> w_qkv = randn(n, 7, 0.02f), w_heads = w_qkv, m1(n, 0.0f), m2(n, 0.0f);
        muon_step_cpu(w_qkv.data(), g.data(), m1.data(), rows, cols, 0.02, qkv, 3);
        muon_step_cpu(w_heads.data(), g.data(), m2.data(), rows, cols, 0.02, opt, 3);
        CHECK(!same_bits(w_qkv.data(), w_heads.data(), n));
      }
    }
}

TEST_CASE("the Tensor phases refuse what CUDA does not implement; bad blocks are named", "[split_heads]") {
  MuonOptions opt;
  Tensor U = Tensor::zeros({12}), O = Tensor::zeros({12}), v = Tensor::zeros({3});
  CHECK_THROWS_WITH(muon_orthogonalize(U, O, 3, 4, 2, opt), Catch::Contains("3 rows in 2 blocks"));
  CHECK_THROWS_WITH(normuon_normalize(O, v, 3, 4, 2, opt), Catch::Contains("3 rows in 2 blocks"));
  CHECK_THROWS_AS(normuon_normalize(O, Tensor::zeros({2}), 3, 4, 1, opt), std::invalid_argument);
}
