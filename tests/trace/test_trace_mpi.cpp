// The per-rank timeline (runtime/trace/): recorder, spans and the tracing communicator under
// mpirun. Every expected byte count is the direct model of comm/communicator.h in closed form.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "comm/comm_factory.h"
#include "runtime/trace/trace.h"
#include "runtime/trace/traced_communicator.h"

using namespace mfsdp;
using json = nlohmann::json;

namespace {

// The complete events ("ph" X) of a merged file, and the thread-row names of each (pid, tid).
std::vector<json> spans_of(const json& doc) {
  std::vector<json> out;
  for (const json& e : doc.at("traceEvents"))
    if (e.at("ph") == "X") out.push_back(e);
  return out;
}

// Rank 0: the parsed file; other ranks: an empty object (they get "").
json end(trace::Recorder& rec, Communicator& host) {
  trace::set_active(nullptr);
  const std::string text = rec.end_window(host);
  if (host.rank() != 0) {
    CHECK(text.empty());
    return json::object();
  }
  return json::parse(text);
}

}  // namespace

TEST_CASE("collectives record their direct-model bytes; started ones overlap on separate rows", "[trace]") {
  auto host = make_host_communicator();
  const int W = host->world_size(), r = host->rank();
  trace::TracedCommunicator comm(*host);
  trace::Recorder rec(Device::CPU);
  rec.begin_window(*host);
  trace::set_active(&rec);
  rec.set_step(7);
  std::vector<int64_t> counts(static_cast<size_t>(W));
  for (int i = 0; i < W; ++i) counts[static_cast<size_t>(i)] = 3 + 2 * i;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0)), mine = counts[static_cast<size_t>(r)];
  std::vector<float> send(static_cast<size_t>(total), 1.0f), a(static_cast<size_t>(total)), b(static_cast<size_t>(total));
  std::vector<float> red(static_cast<size_t>(mine), 0.0f);
  {
    trace::Span outer(trace::Lane::schedule, "phase", "outer");
    comm.all_gather_v(send.data(), a.data(), counts, DType::f32, CommPhase::fwd_gather);
    auto p1 = comm.start_all_gather_v(send.data(), a.data(), counts, DType::f32, CommPhase::fwd_gather);
    auto p2 = comm.start_all_gather_v(send.data(), b.data(), counts, DType::f32, CommPhase::bwd_gather);
    p1->wait();  // p2 started before p1 ended and ends after it: the two must sit on two rows
    auto p3 = comm.start_reduce_scatter_v(send.data(), red.data(), counts, DType::f32, ReduceOp::accumulate,
                                          CommPhase::grad_reduce);
    p2->wait();
    p3->wait();
  }
  CHECK(comm.counters().at(CommPhase::fwd_gather).bytes_sent == 2 * mine * (W - 1) * 4);
  CHECK(comm.counters().at(CommPhase::grad_reduce).bytes_sent == (total - mine) * 4);
  CHECK(red == std::vector<float>(static_cast<size_t>(mine), static_cast<float>(W)));
  const json doc = end(rec, *host);
  if (r != 0) return;
  int named = 0;
  for (const json& e : doc.at("traceEvents")) {
    if (e.at("name") != "process_name") continue;
    CHECK(e.at("args").at("name") == "rank " + std::to_string(e.at("pid").get<int>()));
    ++named;
  }
  CHECK(named == W);
  const std::vector<json> spans = spans_of(doc);
  REQUIRE(spans.size() == static_cast<size_t>(5 * W));
  for (const json& e : spans) {
    const int pid = e.at("pid");
    CHECK(e.at("args").at("step") == 7);
    if (e.at("cat") != "collective") continue;
    const int64_t bytes = e.at("args").at("bytes"), own = counts[static_cast<size_t>(pid)];
    CHECK(bytes == (e.at("args").at("op") == "all_gather_v" ? own * (W - 1) * 4 : (total - own) * 4));
  }
  for (int pid = 0; pid < W; ++pid) {
    std::vector<int> started_rows;
    for (const json& e : spans)
      if (e.at("pid") == pid && e.at("args").contains("started") && e.at("args").at("op") == "all_gather_v")
        started_rows.push_back(e.at("tid"));
    REQUIRE(started_rows.size() == 2);
    CHECK(started_rows[0] != started_rows[1]);
  }
}

TEST_CASE("windows keep their own spans; the span bound drops and counts", "[trace]") {
  auto host = make_host_communicator();
  trace::Recorder rec(Device::CPU, 3);
  CHECK(trace::active() == nullptr);
  rec.begin_window(*host);
  trace::set_active(&rec);
  const int64_t stale = rec.open(trace::Lane::schedule, "phase", "left open");
  end(rec, *host);
  rec.begin_window(*host);
  trace::set_active(&rec);
  rec.close(stale);  // a span of the first window: ignored
  for (int i = 0; i < 5; ++i) trace::Span s(trace::Lane::schedule, "phase", "x", [i] { return "\"i\":" + std::to_string(i); });
  const json doc = end(rec, *host);
  CHECK(trace::active() == nullptr);
  if (host->rank() != 0) return;
  const std::vector<json> spans = spans_of(doc);
  CHECK(spans.size() == static_cast<size_t>(3 * host->world_size()));
  for (const json& e : spans) CHECK(e.at("name") == "x");
  int labels = 0;
  for (const json& e : doc.at("traceEvents")) {
    if (e.at("name") != "process_labels") continue;
    CHECK(e.at("args").at("name") == "2 spans dropped");
    ++labels;
  }
  CHECK(labels == host->world_size());
}

TEST_CASE("json_string escapes quotes, backslashes and control characters", "[trace]") {
  const std::string s = "a\"b\\c\nd\x01";
  CHECK(trace::json_string(s) == "\"a\\\"b\\\\c\\u000ad\\u0001\"");
  CHECK(json::parse(trace::json_string(s)).get<std::string>() == s);
}
