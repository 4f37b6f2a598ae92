// Muon against the PyTorch reference fixture tests/fixtures/muon_reference.safetensors
// (gen_muon_fixture.py: fp32, Keller Jordan's algorithm; see tests/fixtures/README.md).
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "optim/muon.h"
#include "test_helpers.h"

using namespace mfsdp;
using mfsdp::test::max_abs_diff;

namespace {

}  // namespace

TEST_CASE("Muon matches the PyTorch fixture (NS, two steps, split QKV)", "[muon][fixture]") {
  const SafetensorsFile file(std::string(MFSDP_FIXTURE_DIR) + "/muon_reference.safetensors");
  struct F32Tensor {
    std::vector<int64_t> shape;
    std::vector<float> data;
  };
  std::map<std::string, F32Tensor> fx;
  for (const auto& name : file.names()) fx[name] = F32Tensor{file.info(name).shape, file.read_f32(name)};
  MuonOptions opt;  // momentum 0.95, nesterov, 5 steps, original scale
  opt.weight_decay = 0.1;
  const double lr = 0.05;
  for (const char* key : {"48x16", "16x48", "32x32", "96x32"}) {
    const std::string k = key;
    const auto& g1 = fx.at(k + ".G1");
    const int64_t rows = g1.shape.at(0), cols = g1.shape.at(1);
    INFO("shape " << k);

    std::vector<float> ns(g1.data.size());
    newton_schulz_cpu(g1.data.data(), ns.data(), rows, cols, 5);
    CHECK(max_abs_diff(ns, fx.at(k + ".ns_G1").data) < 5e-6);

    std::vector<float> w = fx.at(k + ".W0").data, m(w.size(), 0.0f);
    muon_step_cpu(w.data(), g1.data.data(), m.data(), rows, cols, lr, opt);
    CHECK(max_abs_diff(m, fx.at(k + ".M1").data) < 1e-7);
    CHECK(max_abs_diff(w, fx.at(k + ".W1").data) < 5e-7);
    muon_step_cpu(w.data(), fx.at(k + ".G2").data.data(), m.data(), rows, cols, lr, opt);
    CHECK(max_abs_diff(m, fx.at(k + ".M2").data) < 1e-7);
    CHECK(max_abs_diff(w, fx.at(k + ".W2").data) < 5e-7);

    if (k == "96x32") {
      MuonOptions split = opt;
      split.split_qkv = true;
      std::vector<float> ws = fx.at(k + ".W0").data, ms(ws.size(), 0.0f);
      muon_step_cpu(ws.data(), g1.data.data(), ms.data(), rows, cols, lr, split, 3);
      CHECK(max_abs_diff(ws, fx.at(k + ".W1_split").data) < 5e-7);
      // The unsplit step differs from the split one by far more than the tolerance.
      CHECK(max_abs_diff(ws, fx.at(k + ".W1").data) > 1e-3);
    }
  }
}
