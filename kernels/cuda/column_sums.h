// Column sums into an f32 result, the kernel of the column_sums op (a bias gradient from the 16-bit gradient):
//   out (N) = sum over rows of x (..., N)     x contiguous f32, f16 or bf16 (accumulated in f32)
// It is the Sum op's column reduction (reduce_into in kernels/cuda/reduce.cu with outer = 1), so an f32
// x gives the Sum op's bits. A 16-byte aligned x with N a multiple of 8 (16-bit) or 4 (f32) takes the
// kernel that reads a thread's columns of a row with one 16-byte load (column_sums_wide_load_kernel);
// anything else the generic column kernels. Both split the rows in chunks fixed by the shape (and,
// for the wide loads, the GPU's SM count) and add them in order: the same bits on every run.
// Declared without CUDA types; defined in reduce.cu.
#pragma once
#include "tensor/tensor.h"

namespace reel::cuda {

// accumulate: out += the sums instead of out = them (a parameter's gradient over micro-batches),
// equal to the bit to summing and then adding.
void column_sums_into(const Tensor& x, const Tensor& out, bool accumulate = false);

}  // namespace reel::cuda
