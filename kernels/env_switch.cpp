#include "kernels/env_switch.h"

#include <cstdlib>
#include <cstring>

#include "tensor/error.h"

namespace reel {

bool EnvSwitch::get() const {
  int on = state_.load(std::memory_order_relaxed);
  if (on < 0) {
    const char* env = std::getenv(variable_);
    if (env != nullptr && std::strcmp(env, "0") != 0 && std::strcmp(env, "1") != 0)
      throw Error(detail::cat(variable_, ": expected 0 (", off_, default_on_ ? "" : ", the default", ") or 1 (", on_,
                              default_on_ ? ", the default" : "", "), got '", env, "'"));
    on = env == nullptr ? (default_on_ ? 1 : 0) : (std::strcmp(env, "1") == 0 ? 1 : 0);
    int expected = -1;
    if (!state_.compare_exchange_strong(expected, on)) on = expected;
  }
  return on != 0;
}

bool EnvSwitch::set(bool on) {
  const bool was = get();  // reads the environment first if nothing has yet
  state_.store(on ? 1 : 0, std::memory_order_relaxed);
  return was;
}

}  // namespace reel
