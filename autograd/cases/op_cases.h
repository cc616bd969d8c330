// The catalogue of differentiable-op cases: one harness for every op, in the manner of ggml's
// test-backend-ops. Each case builds its inputs (random, seeded, on a given device, f64 unless the
// caller casts) and the function to check. The same list drives
//   - the gradcheck tests (tests/test_gradcheck.cpp),
//   - `reel gradcheck`, which prints a table of worst errors per op,
//   - the CPU-vs-CUDA parity tests of the CUDA backend.
// Inputs include broadcasting shapes and non-contiguous leaves (transposed or sliced storage).
#pragma once
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"

namespace reel {

struct OpCase {
  std::string name;  // "add broadcast (3,1)+(4)", "matmul transposed a"
  std::function<std::vector<Tensor>(Device, DType)> make_inputs;
  GradcheckFn fn;
  GradcheckOptions opts = {};
};

std::vector<OpCase> all_op_cases();
// GoogleTest prints a case by its name.
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

// Per-family lists (autograd/cases/<family>_cases.cpp).
void add_elementwise_cases(std::vector<OpCase>& cases);
void add_view_cases(std::vector<OpCase>& cases);
void add_reduce_cases(std::vector<OpCase>& cases);
void add_linalg_cases(std::vector<OpCase>& cases);
void add_pool_cases(std::vector<OpCase>& cases);
void add_norm_cases(std::vector<OpCase>& cases);
void add_attention_cases(std::vector<OpCase>& cases);

namespace cases {

// A leaf requiring grad, values ~ N(0, scale^2) (+ shift), from a generator seeded by `seed`.
Tensor leaf(const Shape& shape, Device device, DType dtype, uint64_t seed, double scale = 1.0, double shift = 0.0);
// The same, but stored transposed in its last two dims: a non-contiguous leaf.
Tensor transposed_leaf(const Shape& shape, Device device, DType dtype, uint64_t seed, double scale = 1.0,
                       double shift = 0.0);
// The same, but a strided slice (every other element along dim 0) of a larger buffer.
Tensor sliced_leaf(const Shape& shape, Device device, DType dtype, uint64_t seed, double scale = 1.0,
                   double shift = 0.0);
// A leaf with values bounded away from zero (for log, sqrt, div, pow): |x| in [lo, lo + 1).
Tensor positive_leaf(const Shape& shape, Device device, DType dtype, uint64_t seed, double lo = 0.5);
// A constant (no grad) i64 tensor with values in [0, n).
Tensor int_tensor(const Shape& shape, int64_t n, Device device, uint64_t seed);

}  // namespace cases
}  // namespace reel
