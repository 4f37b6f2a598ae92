// Preemption: the signals that ask a run to save at the next step boundary and stop. Schedulers
// give notice with a signal some time before the end (Slurm's `--signal`, Open MPI's mpirun
// forwarding SIGUSR1/SIGUSR2 to the ranks); SIGTERM and SIGINT are what launchers send before
// killing. configs/README.md, "Checkpoints, resume and preemption", says how to launch.
//
// No signal handler ever runs here. main() blocks every signal of notice_signal_names() before
// MPI and before any thread exists, so every thread inherits the mask, and one thread takes them
// with sigwait(). A handler on a compute thread is not safe with the Debian oneDNN: before 3.11.2
// its JIT f32 GEMM kernels point rsp into a heap workspace, and a handler's frame written there
// corrupts the heap (runtime/README.md, "Signals and oneDNN").
#pragma once
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

/// Blocks every signal of notice_signal_names() in the calling thread and starts the thread that
/// takes them with sigwait(). Call it first in main(), before MPI_Init and before any other thread
/// exists: threads inherit the mask of the thread that makes them. Until arm_notice_signal() names
/// the run's notice signal, SIGTERM and SIGINT request a stop and any other of these signals is
/// kept; afterwards (see stop_signal() for the rules):
///   - SIGTERM, SIGINT or the notice signal, the first time: a stop is requested;
///   - a repeated notice signal: nothing more;
///   - SIGTERM or SIGINT while a stop is already requested: the process exits at once with
///     128 + the signal number;
///   - another signal of the list: its default action (the process ends by that signal).
/// Calling it again does nothing. Throws std::runtime_error when the thread cannot be started.
void start_stop_signal_thread();

/// Names the run's notice signal (a number from notice_signal_number()). A signal of the list that
/// arrived before is resolved now: the notice signal requests a stop, another one takes its default
/// action. Throws std::logic_error when start_stop_signal_thread() was not called first, since
/// threads made before it could then run the default action of a notice.
void arm_notice_signal(int notice_signal);

/// The first signal that requested a stop (SIGTERM, SIGINT or the armed notice signal), 0 while
/// none has. The training loop polls it at each step boundary.
int stop_signal();

/// For a process with nothing to save (--eval-only): from now on a stop request ends the process at
/// once with 128 + the signal number, after the line "mfsdp: SIGINT: stopping now (<why>)" on
/// stderr; a request that came before ends it now. `why` must outlive the process (a literal).
void end_on_stop_request(const char* why);

}  // namespace mfsdp
