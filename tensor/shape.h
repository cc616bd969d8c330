// Shape arithmetic shared by tensors, op schemas and kernels.
//
// A Shape lists sizes outermost first; strides count elements (not bytes). A tensor is contiguous
// when its strides are the row-major ones for its shape (size-1 dims may have any stride).
// Broadcasting follows NumPy: align trailing dims; sizes must match or be 1.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace reel {

using Shape = std::vector<int64_t>;

int64_t numel_of(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
std::string shape_str(const Shape& shape);  // "(4, 3)"

// Wraps a possibly negative dim into [0, ndim); throws reel::Error naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// Wraps and sorts a dim list, rejecting repeats; an empty list means "all dims".
std::vector<int64_t> wrap_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op);

// The broadcast of two shapes; throws reel::Error naming `op` when they are incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Strides for viewing a tensor of (shape, strides) as `target` (which it broadcasts to): 0 on
// broadcast dims.
std::vector<int64_t> broadcast_strides(const Shape& shape, const std::vector<int64_t>& strides,
                                       const Shape& target);

}  // namespace reel
