// Lets a CPU kernel assume dense outputs. dispatch() always allocates contiguous outputs, but
// dispatch_out() may hand a kernel strided views (a copy into a slice, an in-place update of a
// transposed buffer). Kernels that write whole dense blocks (GEMMs, norms) are registered through
// run_into_contiguous, which runs them into contiguous temporaries and copies those into the views.
#pragma once
#include "kernels/dispatch.h"

namespace reel::cpu {

void run_into_contiguous(const KernelCall& call, KernelFn kernel);

}  // namespace reel::cpu
