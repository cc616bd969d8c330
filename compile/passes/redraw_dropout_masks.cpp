// Dropout's mask drawn where it is read instead of stored. Eager dropout writes y and its mask, and
// the backward multiplies the incoming gradient by the saved mask:
//
//   y, mask = dropout(x[, state]; p, seed, offset)        ...        dx = mul(dy, mask)
//
// The mask is a pure function of (Philox key, counter, element index) (tensor/rng.h), so it can be
// drawn again anywhere for the price of a few integer multiplies per element. This pass rewrites the
// dropout as
//
//   mask = dropout_mask([state]; p, seed, offset)   y = mul(x, mask)   ...   mask' = dropout_mask(same)   dx = mul(dy, mask')
//
// one dropout_mask node (kernels/ops.def) for each reader of the mask, each into a buffer of its own.
// Elementwise fusion (fuse_elementwise.cpp) then folds every dropout_mask into its reader's kernel as
// a random instruction (kernels/fused_expr.h): the forward kernel writes y alone, the backward's
// reads dy alone, and no mask is stored between them (a (B, T, C) tensor per dropout, live from the
// forward to the backward). The values are the same bits: dropout_mask draws dropout's mask, and
// mul(x, mask) is the product dropout's kernel computes.
//
// A reader's copy goes right after the last writer of the reader's other inputs (or just before the
// reader when it has none before it), so that the reader can still join the kernel of the node that
// makes its other operand. Applies on a device with fused_elementwise, to a dropout whose outputs
// are contiguous Internal buffers; the mask stays stored where it is a graph output.
#include <algorithm>

#include "compile/passes/passes.h"
#include "kernels/dispatch.h"
#include "kernels/philox_args.h"
#include "tensor/log.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "dropout_masks";

// The dropout_mask node that draws `mask` (the dropout node d's mask ref) into `out`.
Node mask_node(const Node& d, const TensorRef& out, const Device& device) {
  Node n{OpKind::DropoutMask,
         dropout_mask_attrs(out.shape, out.dtype, device, d.attrs.f("p"), d.attrs.i("seed"), d.attrs.i("offset")),
         {},
         {out},
         false,
         {"dropout"}};
  if (d.inputs.size() > 1 && d.inputs[1]) n.inputs.push_back(d.inputs[1]);
  return n;
}

bool matches(const Graph& g, const BufferUses& u, const Node& d, Why& why) {
  const TensorRef &y = d.outputs[0], &mask = d.outputs[1];
  const Device device = g.buffers[mask.buffer].device;
  return why(!d.in_place && d.inputs[0], "it writes into given memory") &&
         why(is_contiguous(y) && is_contiguous(mask) && mask.offset == 0 &&
                 g.buffers[mask.buffer].kind == BufferKind::Internal && u.writers[mask.buffer].size() == 1,
             "its mask is not a fresh contiguous buffer that only it writes") &&
         why(supports(OpKind::FusedElementwise, device.type) && supports(OpKind::DropoutMask, device.type),
             "the device has no fused_elementwise to draw the mask in");
}

}  // namespace

void redraw_dropout_masks(Graph& g, PassStats& stats) {
  (void)stats;  // nodes are added here; elementwise fusion folds them into their readers
  const BufferUses u = buffer_uses(g);
  // Nodes to insert before node k, and the readers' inputs to redirect (node, input, new ref).
  std::vector<std::vector<Node>> before(g.nodes.size() + 1);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node d = g.nodes[i];
    if (d.op != OpKind::Dropout || d.outputs.size() != 2) continue;
    Why why;
    if (!matches(g, u, d, why)) {
      why_not(kPass, g, i, "its mask drawn where it is read", why.reason());
      continue;
    }
    const TensorRef &y = d.outputs[0], &mask = d.outputs[1];
    const Device device = g.buffers[mask.buffer].device;
    // The dropout becomes its mask and a multiply, in place of the node.
    g.nodes[i] = Node{OpKind::Mul, Attrs(), {d.inputs[0], mask}, {y}, false, {"dropout"}};
    before[i].push_back(mask_node(d, mask, device));
    // Every later reader of the mask (not the graph's outputs) gets its own copy.
    for (int k : u.readers[mask.buffer]) {
      if (k <= int(i) || k >= int(g.nodes.size())) continue;
      Node& r = g.nodes[size_t(k)];
      const TensorRef fresh = new_internal_buffer(g, mask.shape, mask.dtype, device);
      int after = -1;  // the last writer, before r, of r's other inputs
      for (auto& in : r.inputs) {
        if (!in) continue;
        if (in->buffer == mask.buffer) {
          in = TensorRef{fresh.buffer, in->shape, in->strides, in->offset, in->dtype};
          continue;
        }
        for (int w : u.writers[in->buffer])
          if (w < k) after = std::max(after, w);
      }
      const size_t at = after > int(i) ? size_t(after) + 1 : size_t(k);
      before[at].push_back(mask_node(d, fresh, device));
      log_line("fusion", detail::cat(kPass, ": dropout k", i, "'s mask drawn again for ", op_name(r.op), " k", k));
    }
  }
  std::vector<Node> out;
  out.reserve(g.nodes.size() * 2);
  for (size_t k = 0; k <= g.nodes.size(); ++k) {
    for (Node& n : before[k]) out.push_back(std::move(n));
    if (k < g.nodes.size()) out.push_back(std::move(g.nodes[k]));
  }
  g.nodes = std::move(out);
}

}  // namespace reel::compile
