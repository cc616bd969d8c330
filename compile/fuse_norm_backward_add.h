// Layer-norm backward + residual add: in a pre-norm block x + f(layer_norm(x)) the gradient of x is
// the sum of the residual branch's and the norm's:
//   dx, dw, db = layer_norm_backward(g, x, w, mean, rstd)     (node i)
//   ...                                                       nodes that touch neither dx nor out
//   out = add(dx, r)  or  add(r, dx)                          (node j > i; r final before node i)
// becomes one layer-norm backward at node i that writes out = dx + r (kernels/cuda/layer_norm_fused.h):
// dx is never written, and one kernel and two passes over memory go. Applies when dx is read only by
// the add, no node from i to j writes r, the add's output is untouched before
// j, everything is contiguous, of one dtype and on the GPU. Equal to the unfused pair to the bit.
// A later cast of the sum to 16 bits (autocast's, for the GEMMs of the layer before) joins the same
// kernel, which writes both copies. That 16-bit sum is also the output gradient of the layer before's
// last Linear (a GPT's proj or fc2), whose bias gradient the bias-gradient pass sums from it
// (compile/fuse_bias_grad_cast.h): the same pass over the rows then sums it too, into (or onto) the
// bias's gradient, and that launch goes. Applies when the column sums read the whole 16-bit sum, one
// value per normalised column, and nothing touches their output between the two nodes. Equal to
// those column sums up to f32 rounding (another fixed order; the same bits every run).
#pragma once
#include "compile/passes.h"

namespace reel::compile {

void fuse_norm_backward_add(Graph& g, PassStats& stats);

}  // namespace reel::compile
