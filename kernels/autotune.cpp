// Autotuning switch (see autotune.h).
#include "kernels/autotune.h"

#include <atomic>

namespace reel {

namespace {
std::atomic<bool> autotune{false};
}

void set_autotune(bool on) { autotune.store(on); }
bool autotune_enabled() { return autotune.load(); }

}  // namespace reel
