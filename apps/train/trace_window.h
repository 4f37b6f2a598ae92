// The trainer's side of the per-rank timeline (logging.trace, runtime/trace/trace.h): which steps
// are traced, the tracing communicator the engine is given, and the one file rank 0 writes.
#pragma once
#include <cstdint>
#include <memory>

#include "apps/train/train_config.h"
#include "comm/communicator.h"
#include "runtime/trace/trace.h"

namespace mfsdp {

/// Off (logging.trace "") it holds nothing and every call returns at once. On, it makes a host
/// communicator over the world (a collective: every rank builds its TraceWindow together) and a
/// TracedCommunicator over `comm` (and over the HSDP replica group `replicas`, when not null) for
/// the engine. Steps are 1-based, as in the logs.
class TraceWindow {
 public:
  TraceWindow(const TrainConfig& cfg, Communicator& comm, Communicator* replicas);
  ~TraceWindow();
  TraceWindow(const TraceWindow&) = delete;
  TraceWindow& operator=(const TraceWindow&) = delete;

  /// The communicator the engine trains over: the tracing one when on, else `comm`.
  Communicator& engine_comm() { return traced_ ? *traced_ : comm_; }
  /// The replica group the engine gets: the tracing one when on, else `replicas` (may be null).
  Communicator* engine_replicas() { return traced_replicas_ ? traced_replicas_.get() : replicas_; }
  /// Before step `step`: opens the window at its first step (a barrier over the world, then the
  /// common time origin) and the step's span; recording is on from here to after_step.
  void before_step(int64_t step);
  /// After step `step`: closes its span; at the window's last step gathers every rank's spans and
  /// rank 0 writes the file (write-then-rename). Collective at that step.
  void after_step(int64_t step);
  /// At the end of the run: a window the run stopped inside is written now (collective). Rank 0
  /// says when the run never reached the window.
  void finish();

 private:
  void write();

  const TrainConfig& cfg_;
  Communicator& comm_;
  Communicator* replicas_;
  std::unique_ptr<Communicator> host_, traced_, traced_replicas_;
  std::unique_ptr<trace::Recorder> recorder_;
  int64_t first_ = 0, last_ = 0, traced_last_ = 0, step_span_ = -1;
  bool open_ = false, written_ = false;
};

}  // namespace mfsdp
