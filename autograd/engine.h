// The backward engine: walks the graph from a root in reverse creation order, summing the gradients
// that reach each node, and runs every backward closure under no_grad.
#pragma once
#include "tensor/tensor.h"

namespace reel::autograd {

// Backpropagates `grad` (ones for a one-element root when undefined) from `root` into the .grad of
// every leaf that requires grad. Frees the graph's saved tensors unless retain_graph.
void backward(const Tensor& root, const Tensor& grad = Tensor(), bool retain_graph = false);

}  // namespace reel::autograd
