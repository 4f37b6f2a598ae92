// The per-rank timeline (config logging.trace): spans of the step schedule, of every collective
// with its bytes, of Newton-Schulz per matrix and of started all-gathers and reduce-scatters on
// their own lanes, recorded for a window of steps and merged on rank 0 into one Chrome-trace /
// Perfetto JSON file (open it in ui.perfetto.dev or chrome://tracing).
//
// Off costs one null check: every recording site asks active(), which is null outside a window.
// CPU ranks take steady-clock times; CUDA ranks record events on the compute stream and resolve
// them after the window (trace_clock.h). Ranks share one time origin: each starts its clock right
// after a barrier on the host communicator. Record from the thread that runs the step only.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "runtime/core/dtype.h"
#include "runtime/trace/trace_clock.h"

namespace mfsdp::trace {

/// Where a span is drawn (a thread row, "tid", of the rank's process row). Spans on one lane nest;
/// started collectives may overlap each other, so the prefetch and reduce lanes are spread over
/// numbered rows ("prefetch", "prefetch 2", ...) when the window is written.
enum class Lane : int { schedule = 0, collectives, prefetch, reduce, count };
/// "schedule", "collectives", "prefetch", "reduce".
const char* lane_name(Lane lane);

/// The first bytes of every trace file Recorder::end_window returns: how the trainer recognises a
/// trace it wrote before (logging.trace replaces only such a file).
inline constexpr std::string_view kTraceFileHead = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";

/// The JSON string literal of `s` (quoted, with ", \ and control characters escaped).
std::string json_string(const std::string& s);

/// One rank's recorder. begin_window and end_window are collectives over the host communicator
/// (every rank calls them at the same step); the spans in between are local.
class Recorder {
 public:
  /// Marks come from make_host_clock() on CPU and make_cuda_clock() on CUDA. At most max_events
  /// spans are kept per window (later ones are counted as dropped), which bounds the gather.
  Recorder(Device device, int64_t max_events = 1 << 18);
  ~Recorder();

  /// Barrier on `host`, then the time origin of this window; earlier spans are forgotten.
  void begin_window(Communicator& host);
  /// Gathers every rank's spans to rank 0 over `host` (their sizes with all_gather_host, then the
  /// bytes with send_recv, each bounded by the host communicator's timeout). Returns the merged
  /// trace file on rank 0 ({"traceEvents": [...]}, ts and dur in microseconds from the common
  /// origin, pid = host rank, one "rank N" process row each), "" on the others. Spans still open
  /// are left out.
  std::string end_window(Communicator& host);
  /// Window count so far: a span opened in an earlier window is ignored when closed.
  uint64_t window() const { return window_; }

  /// The training step (1-based, as in the logs) that new spans belong to (their args.step).
  void set_step(int64_t step) { step_ = step; }
  /// Opens a span now on `lane`: `cat` is its category ("step", "phase", "collective",
  /// "newton_schulz"), `args` the inside of a JSON object ("" or "\"unit\":3,..."), to which
  /// args.step is added. Returns its id for close().
  int64_t open(Lane lane, const char* cat, std::string name, std::string args = "");
  /// Closes span `id` now; `more_args` (JSON object members) are appended to its args.
  void close(int64_t id, const std::string& more_args = "");

 private:
  struct Event {
    Lane lane;
    const char* cat;
    int64_t step, begin, end;  // marks; end -1 while open
    std::string name, args;
  };
  std::string local_events(int pid) const;
  std::vector<int> sub_lanes(const std::vector<int64_t>& ns) const;

  std::unique_ptr<Clock> clock_;
  int64_t max_events_, dropped_ = 0, step_ = 0;
  uint64_t window_ = 0;
  std::vector<Event> events_;
};

/// The recorder spans go to, or null (no window open: recording is off).
Recorder* active();
/// Sets (or with nullptr clears) the recorder of this process.
void set_active(Recorder* recorder);

/// A span of the active recorder from construction to destruction (nothing when none is active).
/// `args` is a callable returning the args string; it runs only while recording.
class Span {
 public:
  Span(Lane lane, const char* cat, const char* name) : rec_(active()) {
    if (rec_) id_ = rec_->open(lane, cat, name);
  }
  template <class ArgsFn>
  Span(Lane lane, const char* cat, const char* name, ArgsFn&& args) : rec_(active()) {
    if (rec_) id_ = rec_->open(lane, cat, name, args());
  }
  ~Span() {
    if (rec_ && active() == rec_) rec_->close(id_);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  Recorder* rec_;
  int64_t id_ = -1;
};

}  // namespace mfsdp::trace
