#include "tensor/shape.h"

#include <algorithm>

#include "tensor/error.h"

namespace reel {

int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    // Checked: a product that wraps would make a huge shape look small (and its storage too small).
    REEL_CHECK(!__builtin_mul_overflow(n, s, &n), "shape ", shape_str(shape), " has more than 2^63 - 1 elements");
  }
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

const char* memory_format_name(MemoryFormat format) {
  return format == MemoryFormat::ChannelsLast ? "channels_last" : "contiguous";
}

Shape strides_for(const Shape& shape, MemoryFormat format) {
  if (format == MemoryFormat::Contiguous) return contiguous_strides(shape);
  REEL_CHECK(shape.size() == 4, "channels_last: needs a 4-D (N, C, H, W) shape, got ", shape_str(shape));
  // Row-major strides of the (N, H, W, C) order, put back in (N, C, H, W) order.
  const Shape nhwc = contiguous_strides({shape[0], shape[2], shape[3], shape[1]});
  return {nhwc[0], nhwc[3], nhwc[1], nhwc[2]};
}

bool has_format(const Shape& shape, const Shape& strides, MemoryFormat format) {
  if (format == MemoryFormat::ChannelsLast && shape.size() != 4) return false;
  const Shape want = strides_for(shape, format);
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] != 1 && strides[i] != want[i]) return false;
  return true;
}

bool is_position_broadcast(const Shape& shape, const Shape& strides) {
  if (shape.size() < 3) return false;
  if ((shape[0] > 1 && strides[0] != shape[1]) || (shape[1] > 1 && strides[1] != 1)) return false;
  for (size_t d = 2; d < shape.size(); ++d)
    if (shape[d] > 1 && strides[d] != 0) return false;
  return true;
}

std::string shape_str(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t lo = -std::max<int64_t>(ndim, 1), hi = std::max<int64_t>(ndim, 1) - 1;
  REEL_CHECK(dim >= lo && dim <= hi, op, ": dim ", dim, " is out of range for a tensor of ", ndim,
             " dims (expected ", lo, " to ", hi, ")");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

std::vector<int64_t> wrap_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < ndim; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) out.push_back(wrap_dim(d, ndim, op));
  std::sort(out.begin(), out.end());
  REEL_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), op, ": dim list ",
             shape_str(dims), " repeats a dim");
  return out;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t sa = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t sb = i < n - b.size() ? 1 : b[i - (n - b.size())];
    REEL_CHECK(sa == sb || sa == 1 || sb == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
               " cannot be broadcast together (dim ", i, ": ", sa, " vs ", sb, ")");
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

std::vector<int64_t> broadcast_strides(const Shape& shape, const std::vector<int64_t>& strides,
                                       const Shape& target) {
  std::vector<int64_t> out(target.size(), 0);
  size_t lead = target.size() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i)
    out[lead + i] = (shape[i] == 1 && target[lead + i] != 1) ? 0 : strides[i];
  return out;
}

bool is_trailing_suffix(const Shape& shape, const Shape& target) {
  size_t lead = 0;
  while (lead < shape.size() && shape[lead] == 1) ++lead;
  const size_t k = shape.size() - lead;
  return k <= target.size() && std::equal(shape.begin() + long(lead), shape.end(), target.end() - long(k));
}

}  // namespace reel
