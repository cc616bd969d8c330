#include "autograd/grad_mode.h"

namespace reel {
namespace {
thread_local bool grad_mode = true;
}

bool grad_enabled() { return grad_mode; }
void set_grad_enabled(bool enabled) { grad_mode = enabled; }

}  // namespace reel
