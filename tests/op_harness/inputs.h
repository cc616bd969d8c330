// Input builders of the op harness: seeded tensors on the CPU in any dtype and layout, and the
// placement of a whole call on another device.
//
// Every builder draws from its own Generator(seed) (Philox, tensor/rng.h), in f64, and casts to the
// dtype asked for on the CPU, so a case builds the same values every time. i64 draws are the f64
// draws rounded toward zero (callers scale them so that the integers vary).
// Layouts, so that kernels see inputs that are not row-major:
//   contiguous   row-major
//   transposed   stored with its last two dims swapped (a transposed matrix); 0-/1-dim: contiguous
//   strided      every other row of a buffer 2n+1 rows long, starting at row 1: dim 0 has stride
//                2x and the view starts at a non-zero offset
//   channels_last  a 4-D (N, C, H, W) tensor stored (N, H, W, C), as a channels-last convolution's
//                operands are; other ranks: contiguous
// A stride-0 (broadcast) input is expanded(small, shape).
#pragma once
#include <cstdint>
#include <vector>

#include "autograd/ops.h"
#include "tests/op_harness/op_harness.h"

namespace reel::harness {

enum class Layout { contiguous, transposed, strided, channels_last };

// N(shift, scale^2) values.
Tensor randn_input(const Shape& shape, DType dtype, uint64_t seed, Layout layout = Layout::contiguous,
                   double scale = 1.0, double shift = 0.0);
// U[lo, hi) values (positive inputs for log, sqrt, variances: lo > 0).
Tensor uniform_input(const Shape& shape, DType dtype, uint64_t seed, double lo, double hi,
                     Layout layout = Layout::contiguous);
// A shuffled set of distinct values (k - n/2) / 8, k < n <= 256, exact in every dtype: no ties, so
// a maximum and its position are the same on every backend.
Tensor distinct_input(const Shape& shape, DType dtype, uint64_t seed, Layout layout = Layout::contiguous);
// Whole numbers in [lo, hi], in any dtype: ties on purpose (comparisons, masks).
Tensor integer_input(const Shape& shape, DType dtype, uint64_t seed, int64_t lo, int64_t hi,
                     Layout layout = Layout::contiguous);
// i64 class or row indices in [0, n).
Tensor index_input(const Shape& shape, int64_t n, uint64_t seed);
// Given values (row-major) in a dtype.
Tensor values_input(const std::vector<double>& values, const Shape& shape, DType dtype);
// A 0-dim tensor.
Tensor scalar_input(double value, DType dtype);
// A stride-0 view of `small` broadcast to `shape` (numpy rules, new leading dims allowed).
Tensor expanded(const Tensor& small, const Shape& shape);

// The attrs of a creation op made on `device`.
Attrs with_device(Attrs attrs, Device device);

// The call with its tensors on `device`: each storage is copied whole and every tensor becomes the
// same view (shape, strides, offset) of the copy, so layouts and aliasing (an in-place op's outputs
// are its inputs) survive. On the CPU: the call itself.
OpCall place(const OpCall& call, Device device);

// Row-major values of any tensor (strided, on any device) as doubles.
std::vector<double> host_values(const Tensor& t);

}  // namespace reel::harness
