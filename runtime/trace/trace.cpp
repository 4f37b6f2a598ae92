#include "runtime/trace/trace.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <stdexcept>

#include "runtime/core/clock.h"

namespace mfsdp::trace {
namespace {

Recorder* g_active = nullptr;
constexpr int kIdShift = 40;    // a span id is (window << kIdShift) + its index in the window
constexpr int kSubLanes = 16;   // rows per lane: tid = 1 + lane * kSubLanes + row

class HostClock final : public Clock {
 public:
  void start() override {
    marks_.clear();
    origin_ = now_seconds();
  }
  int64_t mark() override {
    marks_.push_back(static_cast<int64_t>((now_seconds() - origin_) * 1e9));
    return static_cast<int64_t>(marks_.size()) - 1;
  }
  std::vector<int64_t> resolve() override { return marks_; }

 private:
  double origin_ = 0;
  std::vector<int64_t> marks_;
};

// Microseconds with three decimals from integer nanoseconds (exact: no rounding of sums).
std::string micros(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ns / 1000), static_cast<long long>(ns % 1000));
  return buf;
}

std::string metadata(const char* what, int pid, int tid, const std::string& name, const std::string& extra = "") {
  return "{\"name\":\"" + std::string(what) + "\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
         ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"name\":" + json_string(name) + extra + "}}";
}

}  // namespace

std::unique_ptr<Clock> make_host_clock() { return std::make_unique<HostClock>(); }

const char* lane_name(Lane lane) {
  static const char* names[] = {"schedule", "collectives", "prefetch", "reduce"};
  const int i = static_cast<int>(lane);
  return i >= 0 && i < static_cast<int>(Lane::count) ? names[i] : "?";
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

Recorder* active() { return g_active; }
void set_active(Recorder* recorder) { g_active = recorder; }

Recorder::Recorder(Device device, int64_t max_events)
    : clock_(device == Device::CPU ? make_host_clock() : make_cuda_clock()), max_events_(max_events) {}

Recorder::~Recorder() {
  if (g_active == this) g_active = nullptr;
}

void Recorder::begin_window(Communicator& host) {
  events_.clear();
  dropped_ = 0;
  ++window_;
  host.barrier();
  clock_->start();
}

int64_t Recorder::open(Lane lane, const char* cat, std::string name, std::string args) {
  if (static_cast<int64_t>(events_.size()) >= max_events_) {
    ++dropped_;
    return -1;
  }
  events_.push_back({lane, cat, step_, clock_->mark(), -1, std::move(name), std::move(args)});
  return static_cast<int64_t>((window_ << kIdShift) + (events_.size() - 1));
}

void Recorder::close(int64_t id, const std::string& more_args) {
  if (id < 0 || static_cast<uint64_t>(id >> kIdShift) != window_) return;
  Event& e = events_[static_cast<size_t>(id & ((int64_t(1) << kIdShift) - 1))];
  e.end = clock_->mark();
  if (!more_args.empty()) e.args += (e.args.empty() ? "" : ",") + more_args;
}

// The row of each event within its lane: schedule and collectives spans nest by construction
// (one thread, scoped); started collectives of the prefetch and reduce lanes go to the first row
// whose previous span has ended (greedy by start time), so no two spans of a row overlap.
std::vector<int> Recorder::sub_lanes(const std::vector<int64_t>& ns) const {
  std::vector<int> row(events_.size(), 0);
  std::vector<size_t> order(events_.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ns[events_[a].begin] < ns[events_[b].begin]; });
  std::vector<std::vector<int64_t>> row_end(static_cast<size_t>(Lane::count));
  for (size_t i : order) {
    const Event& e = events_[i];
    if (e.end < 0 || (e.lane != Lane::prefetch && e.lane != Lane::reduce)) continue;
    auto& ends = row_end[static_cast<size_t>(e.lane)];
    size_t r = 0;
    while (r < ends.size() && ends[r] > ns[e.begin]) ++r;
    if (r == ends.size()) ends.push_back(0);
    ends[r] = ns[e.end];
    row[i] = static_cast<int>(std::min<size_t>(r, kSubLanes - 1));
  }
  return row;
}

// This rank's events as JSON objects separated by commas: its process row, the names of the
// rows it used, then one complete event ("ph":"X") per closed span.
std::string Recorder::local_events(int pid) const {
  const std::vector<int64_t> ns = clock_->resolve();
  const std::vector<int> row = sub_lanes(ns);
  std::string out = metadata("process_name", pid, 0, "rank " + std::to_string(pid));
  auto add = [&out](const std::string& item) {
    out += ',';
    out += item;
  };
  add(metadata("process_sort_index", pid, 0, "", ",\"sort_index\":" + std::to_string(pid)));
  if (dropped_) add(metadata("process_labels", pid, 0, std::to_string(dropped_) + " spans dropped"));
  std::vector<bool> named(static_cast<size_t>(Lane::count) * kSubLanes, false);
  for (size_t i = 0; i < events_.size(); ++i) {
    const Event& e = events_[i];
    if (e.end < 0) continue;
    const int slot = static_cast<int>(e.lane) * kSubLanes + row[i], tid = 1 + slot;
    if (!named[static_cast<size_t>(slot)]) {
      named[static_cast<size_t>(slot)] = true;
      std::string label = lane_name(e.lane);
      if (row[i]) label.append(" ").append(std::to_string(row[i] + 1));
      add(metadata("thread_name", pid, tid, label));
      add(metadata("thread_sort_index", pid, tid, "", ",\"sort_index\":" + std::to_string(tid)));
    }
    const int64_t b = ns[static_cast<size_t>(e.begin)], d = ns[static_cast<size_t>(e.end)] - b;
    add("\n{\"name\":" + json_string(e.name) + ",\"cat\":\"" + e.cat + "\",\"ph\":\"X\",\"pid\":" +
        std::to_string(pid) + ",\"tid\":" + std::to_string(tid) + ",\"ts\":" + micros(b) + ",\"dur\":" +
        micros(std::max<int64_t>(d, 0)) + ",\"args\":{\"step\":" + std::to_string(e.step) +
        (e.args.empty() ? "" : "," + e.args) + "}}");
  }
  return out;
}

std::string Recorder::end_window(Communicator& host) {
  std::string mine = local_events(host.rank());
  events_.clear();
  ++window_;  // spans still open belong to no window now
  mine.append((4 - mine.size() % 4) % 4, ' ');  // whole i32 elements on the wire
  const int64_t len = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lens(static_cast<size_t>(host.world_size()));
  host.all_gather_host(&len, lens.data(), sizeof(int64_t), CommPhase::other);
  if (host.rank() != 0) {
    host.send_recv({{true, 0, mine.data(), len / 4, DType::i32}}, CommPhase::other);
    return "";
  }
  std::vector<std::string> parts(lens.size());
  std::vector<Communicator::P2P> recvs;
  for (size_t r = 1; r < lens.size(); ++r) {
    parts[r].resize(static_cast<size_t>(lens[r]));
    recvs.push_back({false, static_cast<int>(r), parts[r].data(), lens[r] / 4, DType::i32});
  }
  if (!recvs.empty()) host.send_recv(recvs, CommPhase::other);
  parts[0] = std::move(mine);
  std::string out(kTraceFileHead);
  for (size_t r = 0; r < parts.size(); ++r) out += (r ? ",\n" : "") + parts[r];
  return out + "\n]}\n";
}

}  // namespace mfsdp::trace
