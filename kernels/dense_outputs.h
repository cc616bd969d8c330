// Lets a kernel assume dense outputs. dispatch() allocates contiguous outputs (channels-last ones only
// where its caller asks: a convolution's result and gradients, a cast), and dispatch_out()
// may hand a kernel strided views (a copy into a slice, an in-place update of a transposed buffer).
// Kernels that write whole dense blocks (GEMMs, norms) are registered through run_into_contiguous,
// which runs them into contiguous temporaries and then copies those into the views with the
// backend's own strided copy (a host loop on the CPU, a device kernel in stream order on CUDA).
#pragma once
#include "kernels/dispatch.h"

namespace reel {

using StridedCopyFn = void (*)(const Tensor& dst, const Tensor& src);

void run_into_contiguous(const KernelCall& call, KernelFn kernel, StridedCopyFn copy);

// For a kernel that adds into outputs out[first_out + k] the values of inputs in[first_in + k] (k < n;
// an attr accumulate): each such output is made to hold its input first (nothing to do where they are
// the same memory, as the compiler passes them), and must be contiguous, since run_into_contiguous
// would hand the kernel a temporary that does not hold them.
void prepare_accumulated_outputs(const KernelCall& call, size_t first_out, size_t first_in, size_t n,
                                 StridedCopyFn copy);

}  // namespace reel
