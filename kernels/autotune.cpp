// Autotuning switch (see autotune.h).
#include "kernels/autotune.h"

#include <atomic>

namespace reel {

namespace {
std::atomic<bool> autotune{false};
std::atomic<bool> deterministic{true};
}

void set_deterministic_algorithms(bool on) { deterministic.store(on); }
bool deterministic_algorithms() { return deterministic.load(); }

void set_autotune(bool on) { autotune.store(on); }
bool autotune_enabled() { return autotune.load(); }

}  // namespace reel
