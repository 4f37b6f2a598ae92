// mfsdp-project --paper's table (apps/bench/paper_figures.h): the published figures of owner-placed
// Muon next to the projection on the A100 cluster file, with the published baseline's semantics.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>
#include <string>

#include "apps/bench/paper_figures.h"

using namespace mfsdp;

TEST_CASE("the projection matches the published figures it claims, and names the failing term elsewhere",
          "[paper]") {
  const ClusterSpec c = ClusterSpec::load(std::string(MFSDP_SOURCE_DIR) + "/configs/clusters/a100_80gb_8x.json");
  BaselineOptions published;
  published.ns = BaselineNs::row_sharded;
  const nlohmann::json t = paper_figures(c, published);
  CHECK(t.at("baseline") ==
        "fsdp2 baseline: row_sharded Newton-Schulz, gather bf16, NS 2, 90 us host dispatch per DTensor op");
  // The figures claimed within kPaperTolerance (README of the public runtime, 8x A100-SXM4-80GB).
  std::set<std::string> claimed;
  for (const char* T : {"T=1024 ", "T=2048 ", "T=4096 ", "T=8192 ", "T=16384 "})
    for (const char* what : {"matrixfsdp step ms", "fsdp2 step ms", "step ratio fsdp2/matrixfsdp",
                             "optimizer ratio fsdp2/matrixfsdp"})
      claimed.insert(std::string(T) + what);
  claimed.insert("abstract optimizer-step speedup, 8 GPUs");
  claimed.insert("abstract end-to-end speedup (best), 8 GPUs");
  for (const char* preset : {"llama-7b", "llama-13b"})
    claimed.insert(std::string("public runtime step ratio, 4 A100-PCIe, ") + preset);
  std::set<double> abstract;
  size_t seen = 0;
  for (const nlohmann::json& f : t.at("figures")) {
    const std::string what = f.at("what");
    const double err = f.at("rel_error");
    INFO(what << ": published " << f.at("published") << ", projected " << f.at("projected"));
    CHECK(err == Approx(f.at("projected").get<double>() / f.at("published").get<double>() - 1));
    CHECK(f.at("matched") == (std::abs(err) <= kPaperTolerance));
    if (claimed.count(what)) {
      ++seen;
      CHECK(std::abs(err) <= kPaperTolerance);
    }
    if (!f.at("matched").get<bool>()) CHECK(f.at("failing_term").get<std::string>().size() > 10);
    if (what.rfind("abstract", 0) == 0) abstract.insert(f.at("published").get<double>());
  }
  CHECK(seen == claimed.size());
  CHECK(abstract == std::set<double>{2.15, 4.2, 54.6});
}
