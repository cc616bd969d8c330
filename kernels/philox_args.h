// The Philox arguments of a random op's call (PhiloxArgs, tensor/rng.h): the seed and offset attrs,
// and, when the call has its optional state input (as a compiled plan's calls do), that tensor's
// two values, which the kernel reads where it runs (on the host for the CPU, on the device for CUDA).
//   state: (2,) i64 on the op's device: {seed, base offset}, the offset attr then relative to the base
#pragma once
#include "kernels/dispatch.h"
#include "tensor/rng.h"

namespace reel {

inline PhiloxArgs philox_args(const KernelCall& c, size_t state_input) {
  PhiloxArgs a;
  a.seed = uint64_t(c.attrs.i("seed"));
  a.offset = uint64_t(c.attrs.i("offset"));
  if (c.in.size() > state_input && c.in[state_input].defined())
    a.state = static_cast<const uint64_t*>(c.in[state_input].data_ptr());
  return a;
}

}  // namespace reel
