#include "apps/train/preemption.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <stdexcept>

namespace mfsdp {
namespace {

struct NamedSignal {
  const char* name;
  int number;
};
constexpr NamedSignal kSignals[] = {{"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGHUP", SIGHUP},
                                    {"SIGXCPU", SIGXCPU}, {"SIGTERM", SIGTERM}, {"SIGINT", SIGINT}};

std::atomic<int> g_signal{0};  // lock-free: safe to touch in a signal handler
int g_guards = 0;              // guards alive (made and destroyed on one thread)
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_preemption_signal(int sig) {
  int none = 0;
  if (!g_signal.compare_exchange_strong(none, sig) && (sig == SIGTERM || sig == SIGINT)) _exit(128 + sig);
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

PreemptionGuard::PreemptionGuard(int notice_signal) {
  if (g_guards++ == 0) g_signal = 0;
  signals_ = {SIGTERM, SIGINT};
  if (notice_signal != SIGTERM && notice_signal != SIGINT) signals_.push_back(notice_signal);
  struct sigaction sa = {};
  sa.sa_handler = on_preemption_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads and writes in progress go on; the loop polls at step boundaries
  old_.resize(signals_.size());
  for (size_t i = 0; i < signals_.size(); ++i) sigaction(signals_[i], &sa, &old_[i]);
}

PreemptionGuard::~PreemptionGuard() {
  for (size_t i = 0; i < signals_.size(); ++i) sigaction(signals_[i], &old_[i], nullptr);
  --g_guards;
}

int PreemptionGuard::signal() const { return g_signal.load(); }

}  // namespace mfsdp
