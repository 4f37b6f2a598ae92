// Preemption: the signals that ask a run to save at the next step boundary and stop. Schedulers
// give notice with a signal some time before the end (Slurm's `--signal`, Open MPI's mpirun
// forwarding SIGUSR1/SIGUSR2 to the ranks); SIGTERM and SIGINT are what launchers send before
// killing. configs/README.md, "Checkpoints, resume and preemption", says how to launch.
#pragma once
#include <csignal>
#include <string>
#include <vector>

namespace mfsdp {

/// The names checkpoint.notice_signal accepts: SIGUSR1 (the default), SIGUSR2, SIGHUP, SIGXCPU,
/// SIGTERM, SIGINT.
const std::vector<std::string>& notice_signal_names();

/// The number of a signal named in notice_signal_names(); throws std::invalid_argument otherwise.
int notice_signal_number(const std::string& name);

/// "SIGUSR1" etc. for a signal number handled here, else "signal <n>".
std::string signal_name(int signal_number);

/// While alive, `notice_signal`, SIGTERM and SIGINT ask for a stop: requested() turns true and the
/// training loop saves and stops at its next step boundary. A SIGTERM or SIGINT that arrives while
/// a stop is already pending exits the process at once (exit code 128 + signal); a repeated notice
/// signal changes nothing. The previous handlers come back in the destructor. Guards nest (one
/// made at start-up, the trainer's inside it): an inner guard keeps a signal the outer one caught.
class PreemptionGuard {
 public:
  explicit PreemptionGuard(int notice_signal);
  ~PreemptionGuard();
  PreemptionGuard(const PreemptionGuard&) = delete;
  PreemptionGuard& operator=(const PreemptionGuard&) = delete;
  /// True once one of the signals arrived.
  bool requested() const { return signal() != 0; }
  /// The first signal that arrived, 0 while none has.
  int signal() const;

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> old_;  // the previous handler of each of signals_
};

}  // namespace mfsdp
