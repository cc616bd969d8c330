// An on/off switch of the kernels, set by an environment variable read once (0 or 1; anything else
// is an error naming the variable) and by code, which the tests use to run both sides of it. Unset,
// the switch takes its default (on unless the switch says otherwise).
// Programmatic dependent launch (kernels/cuda/programmatic_launch.h), batch norm's one-launch
// backward (kernels/cuda/batch_norm_one_launch.h) and where its statistics are combined
// (kernels/cuda/batch_norm_stats_switch.h) are such switches. Thread-safe.
#pragma once
#include <atomic>

namespace reel {

class EnvSwitch {
 public:
  // `off` and `on` say what 0 and 1 mean, for the error message; `default_on` is the switch while
  // neither the environment nor code sets it.
  constexpr EnvSwitch(const char* variable, const char* off, const char* on, bool default_on = true)
      : variable_(variable), off_(off), on_(on), default_on_(default_on) {}
  // The switch: the environment's value on first use, unless set before.
  bool get() const;
  // Sets the switch; returns it as it was.
  bool set(bool on);

 private:
  const char *variable_, *off_, *on_;
  bool default_on_;
  mutable std::atomic<int> state_{-1};  // -1: not read yet; else 0 or 1
};

// Sets a switch for a scope and puts it back on any exit.
class ScopedEnvSwitch {
 public:
  ScopedEnvSwitch(EnvSwitch& s, bool on) : switch_(s), previous_(s.set(on)) {}
  ~ScopedEnvSwitch() { switch_.set(previous_); }
  ScopedEnvSwitch(const ScopedEnvSwitch&) = delete;
  ScopedEnvSwitch& operator=(const ScopedEnvSwitch&) = delete;

 private:
  EnvSwitch& switch_;
  bool previous_;
};

}  // namespace reel
