// Shape logic of the view ops, shared with autograd's reshape (which copies when a view is impossible).
#pragma once
#include <optional>

#include "tensor/shape.h"

namespace reel {

// Strides that let a tensor of (old_shape, old_strides) be viewed as new_shape, or nullopt when the
// data would have to move (e.g. flattening a transposed matrix).
std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& new_shape);
// Resolves a -1 in `to` and checks the element counts agree.
Shape infer_reshape_shape(const Shape& from, const Shape& to);

}  // namespace reel
