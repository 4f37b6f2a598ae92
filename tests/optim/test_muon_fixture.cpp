// Muon against the PyTorch reference fixture tests/fixtures/muon_reference.safetensors
// (gen_muon_fixture.py: fp32, Keller Jordan's algorithm; see tests/fixtures/README.md).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "optim/muon.h"

using namespace mfsdp;

namespace {

struct F32Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

/// Minimal safetensors reader (F32 tensors only): u64 header length, JSON header, raw data.
std::map<std::string, F32Tensor> read_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("[read_safetensors] cannot open " + path);
  uint64_t header_len = 0;
  f.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_len));
  std::vector<char> blob((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto j = nlohmann::json::parse(header);
  std::map<std::string, F32Tensor> out;
  for (const auto& [name, info] : j.items()) {
    if (name == "__metadata__" || info.at("dtype") != "F32") continue;
    F32Tensor t;
    t.shape = info.at("shape").get<std::vector<int64_t>>();
    const auto off = info.at("data_offsets").get<std::vector<uint64_t>>();
    if (off[1] > blob.size() || off[0] > off[1])
      throw std::runtime_error("[read_safetensors] " + path + ": tensor " + name + " offsets out of range");
    t.data.resize((off[1] - off[0]) / 4);
    std::memcpy(t.data.data(), blob.data() + off[0], off[1] - off[0]);
    out.emplace(name, std::move(t));
  }
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::abs(a[i] - b[i])));
  return m;
}

}  // namespace

TEST_CASE("Muon matches the PyTorch fixture (NS, two steps, split QKV)", "[muon][fixture]") {
  const auto fx = read_safetensors(std::string(MFSDP_FIXTURE_DIR) + "/muon_reference.safetensors");
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
