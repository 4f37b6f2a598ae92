#include "apps/train/preemption.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>

namespace mfsdp {
namespace {

struct NamedSignal {
  const char* name;
  int number;
};
constexpr NamedSignal kSignals[] = {{"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGHUP", SIGHUP},
                                    {"SIGXCPU", SIGXCPU}, {"SIGTERM", SIGTERM}, {"SIGINT", SIGINT}};

/// What the stop-signal thread and arm_notice_signal() share. Never destroyed: the thread runs
/// until the process ends, past static destruction.
struct StopSignals {
  std::mutex mutex;
  bool started = false;
  int notice = 0;          ///< the armed notice signal, 0 until arm_notice_signal()
  unsigned long early = 0;  ///< bit s: signal s (not SIGTERM/SIGINT) arrived before the notice was armed
};
StopSignals& stop_signals() {
  static StopSignals* s = new StopSignals;
  return *s;
}
std::atomic<int> g_stop{0};  ///< the first signal that requested a stop
std::atomic<const char*> g_nothing_to_save{nullptr};  ///< end_on_stop_request()'s reason, or null

sigset_t watched_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (const NamedSignal& s : kSignals) sigaddset(&set, s.number);
  return set;
}

bool always_stops(int sig) { return sig == SIGTERM || sig == SIGINT; }

/// The first stop signal is kept for the training loop; SIGTERM or SIGINT after it ends the
/// process now (the launcher's second request, or a user's second Ctrl-C).
void request_stop(int sig) {
  if (const char* why = g_nothing_to_save.load()) {
    std::fprintf(stderr, "mfsdp: %s: stopping now (%s)\n", signal_name(sig).c_str(), why);
    std::fflush(stderr);
    _exit(128 + sig);
  }
  int none = 0;
  if (g_stop.compare_exchange_strong(none, sig) || !always_stops(sig)) return;
  std::fprintf(stderr, "mfsdp: %s while a stop was pending (%s): exiting now\n", signal_name(sig).c_str(),
               signal_name(none).c_str());
  std::fflush(stderr);
  _exit(128 + sig);
}

/// Ends the process the way `sig`'s default action would, as if it had never been blocked.
[[noreturn]] void take_default_action(int sig) {
  std::signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  pthread_kill(pthread_self(), sig);  // delivered to this thread, where it is no longer blocked
  _exit(128 + sig);                   // every signal of the list ends the process by default
}

void on_signal(int sig) {
  StopSignals& s = stop_signals();
  std::unique_lock lock(s.mutex);
  if (always_stops(sig) || sig == s.notice) {
    lock.unlock();
    request_stop(sig);
  } else if (s.notice == 0) {
    s.early |= 1ul << sig;
  } else {
    take_default_action(sig);
  }
}

void watch(sigset_t set) {
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) == 0) on_signal(sig);
  }
}

}  // namespace

const std::vector<std::string>& notice_signal_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const NamedSignal& s : kSignals) v.push_back(s.name);
    return v;
  }();
  return names;
}

int notice_signal_number(const std::string& name) {
  for (const NamedSignal& s : kSignals)
    if (name == s.name) return s.number;
  throw std::invalid_argument("unknown notice signal \"" + name + "\" (expected SIGUSR1, SIGUSR2, SIGHUP, SIGXCPU, "
                              "SIGTERM or SIGINT)");
}

std::string signal_name(int signal_number) {
  for (const NamedSignal& s : kSignals)
    if (signal_number == s.number) return s.name;
  return "signal " + std::to_string(signal_number);
}

void start_stop_signal_thread() {
  StopSignals& s = stop_signals();
  std::lock_guard lock(s.mutex);
  if (s.started) return;
  const sigset_t set = watched_signals();
  if (const int rc = pthread_sigmask(SIG_BLOCK, &set, nullptr); rc != 0)
    throw std::runtime_error("cannot block the stop signals: " + std::system_category().message(rc));
  try {
    std::thread(watch, set).detach();
  } catch (const std::system_error& e) {
    throw std::runtime_error(std::string("cannot start the stop-signal thread: ") + e.what());
  }
  s.started = true;
}

void arm_notice_signal(int notice_signal) {
  StopSignals& s = stop_signals();
  std::unique_lock lock(s.mutex);
  if (!s.started) throw std::logic_error("arm_notice_signal: start_stop_signal_thread() was not called first in main()");
  s.notice = notice_signal;
  const unsigned long early = std::exchange(s.early, 0ul);
  lock.unlock();
  for (const NamedSignal& n : kSignals) {
    if (!(early & (1ul << n.number))) continue;
    if (n.number == notice_signal) request_stop(n.number);
    else take_default_action(n.number);
  }
}

int stop_signal() { return g_stop.load(); }

void end_on_stop_request(const char* why) {
  g_nothing_to_save.store(why);
  if (const int sig = g_stop.load()) request_stop(sig);  // one that came before
}

}  // namespace mfsdp
