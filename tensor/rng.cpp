#include "tensor/rng.h"

namespace reel {

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

}  // namespace reel
