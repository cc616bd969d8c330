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

// How a 4-D (N, C, H, W) tensor lies in memory. Contiguous: row-major, NCHW. ChannelsLast: NHWC
// (strides (H*W*C, 1, W*C, C)), the order cuDNN's tensor-core convolutions read and write without
// transposing; for a conv weight (O, C, kH, kW) it is cuDNN's KRSC filter order. The logical shape
// is (N, C, H, W) either way: only the strides differ, so every op reads either.
enum class MemoryFormat { Contiguous, ChannelsLast };
const char* memory_format_name(MemoryFormat format);
// The strides of a dense tensor of `shape` in `format` (ChannelsLast needs 4 dims).
Shape strides_for(const Shape& shape, MemoryFormat format);
// Whether (shape, strides) is dense in `format`; size-1 dims may have any stride (as is_contiguous).
bool has_format(const Shape& shape, const Shape& strides, MemoryFormat format);
// Whether (shape, strides), shape (N, C, *positions), is an (N, C) row-major tensor broadcast over
// the positions: strides (C, 1, 0, ...) on every dim longer than 1 (a global average pool's gradient,
// as the mean's backward expands it).
bool is_position_broadcast(const Shape& shape, const Shape& strides);
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
// Whether `shape`, its leading 1s dropped, is the last dims of `target`: a tensor that repeats whole
// over target's leading dims ((T, C) or (1, T, C) over (B, T, C)), so element (r, c) of target viewed
// as rows of shape's numel reads element r % rows of it. The empty shape counts (one value).
bool is_trailing_suffix(const Shape& shape, const Shape& target);

}  // namespace reel
