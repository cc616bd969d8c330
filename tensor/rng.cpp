#include "tensor/rng.h"

namespace reel {

namespace {
thread_local DrawObserver* tls_draw_observer = nullptr;
}

DrawObserver* set_draw_observer(DrawObserver* observer) {
  DrawObserver* previous = tls_draw_observer;
  tls_draw_observer = observer;
  return previous;
}

DrawObserver* draw_observer() { return tls_draw_observer; }

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

}  // namespace reel
