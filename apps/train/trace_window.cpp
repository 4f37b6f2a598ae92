#include "apps/train/trace_window.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>

#include "apps/train/preflight.h"
#include "apps/train/trainer.h"
#include "comm/comm_factory.h"
#include "runtime/core/file_checks.h"
#include "runtime/trace/traced_communicator.h"

namespace mfsdp {

TraceWindow::TraceWindow(const TrainConfig& cfg, Communicator& comm, Communicator* replicas)
    : cfg_(cfg), comm_(comm), replicas_(replicas) {
  if (cfg.logging.trace.resolved.empty()) return;
  CommOptions opts;
  opts.timeout_seconds = cfg.sharding.collective_timeout_s;
  opts.timeout_name = kCollectiveTimeoutKey;
  host_ = make_host_communicator(opts);
  traced_ = std::make_unique<trace::TracedCommunicator>(comm);
  if (replicas) traced_replicas_ = std::make_unique<trace::TracedCommunicator>(*replicas);
  recorder_ = std::make_unique<trace::Recorder>(comm.device());
  first_ = cfg.logging.trace_start;
  last_ = std::min(cfg.logging.trace_start + cfg.logging.trace_steps - 1, cfg.training.steps);
}

TraceWindow::~TraceWindow() {
  if (recorder_ && trace::active() == recorder_.get()) trace::set_active(nullptr);
}

void TraceWindow::before_step(int64_t step) {
  if (!recorder_ || written_ || step < first_ || step > last_) return;
  if (!open_) {
    recorder_->begin_window(*host_);
    open_ = true;
  }
  trace::set_active(recorder_.get());  // only inside steps: evaluations and checkpoints are not traced
  recorder_->set_step(step);
  step_span_ = recorder_->open(trace::Lane::schedule, "step", "step " + std::to_string(step));
}

void TraceWindow::after_step(int64_t step) {
  if (!open_) return;
  recorder_->close(step_span_);
  trace::set_active(nullptr);
  step_span_ = -1;
  traced_last_ = step;
  if (step >= last_) write();
}

void TraceWindow::finish() {
  if (open_) write();
  else if (recorder_ && !written_ && host_->rank() == 0)
    spdlog::warn("logging.trace: the run took no step of the trace window (steps {}..{}); no trace written", first_,
                 last_);
}

// Every rank's spans to rank 0, which writes the one file.
void TraceWindow::write() {
  trace::set_active(nullptr);
  open_ = false;
  written_ = true;
  const std::string text = recorder_->end_window(*host_);
  if (host_->rank() != 0) return;
  // the start-up rule again: another job may have started in that directory since
  if (const std::string e = trace_output_problem(cfg_); !e.empty()) {
    spdlog::error("logging.trace: the trace is not written: {}", e);
    return;
  }
  write_file_swap(cfg_.logging.trace.resolved, text);
  spdlog::info("trace of steps {}..{} written to {} ({} bytes; open it in ui.perfetto.dev or chrome://tracing)",
               first_, traced_last_, cfg_.logging.trace.resolved, text.size());
}

}  // namespace mfsdp
