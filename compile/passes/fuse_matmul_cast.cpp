// Autocast's cast into the GEMM that precedes it:
//
//   y = matmul(a, b)          16-bit operands and result              (node i)
//   ...                       nodes that touch neither y nor z
//   z = copy(y) to f32        the cast back to f32, contiguous         (node j > i)
//
// becomes one matmul_into node at i that writes z directly in f32 from its f32 accumulator: one
// kernel and one round trip through memory fewer, and one rounding to 16 bits fewer. Applies when y
// is an Internal buffer read only by the copy (and not a graph output) and z's buffer is Internal
// and written only by the copy — then no node between i and j can see the difference — on a device
// with matmul_into. Not where z is read
// once by one elementwise op: elementwise fusion folds the cast into that op's kernel instead, which
// moves half the bytes (y in 16 bits) and keeps eager's values. Nor where z is read once by an
// attention backward as its dy: that backward reads the 16-bit y as it is (same bits) and the copy
// goes.
#include "compile/passes/passes.h"
#include "kernels/fused_expr.h"

namespace reel::compile {

namespace {

// The node that alone reads z, reading it once; null otherwise.
Node* sole_reader(Graph& g, const BufferUses& u, const TensorRef& z) {
  const int k = compile::sole_reader(g, u, z);
  return k < 0 ? nullptr : &g.nodes[size_t(k)];
}

// Whether z's sole reader is an elementwise op: elementwise fusion then folds the cast into that
// op's kernel, which reads the 16-bit y (2 bytes an element, not 4) while the GEMM writes 2 bytes
// instead of 4; and the values are eager's, which rounds to 16 bits and casts back as well. (The
// MLP's case: fc2's input gradient, read by GELU's backward.)
bool read_by_one_elementwise_op(Graph& g, const BufferUses& u, const TensorRef& z) {
  const Node* r = sole_reader(g, u, z);
  return r && is_fusable_op(r->op) && !r->in_place;
}

// z's sole reader when it is an attention backward reading z as its dy and its compute dtype is
// y's: it takes y itself, with the bits its f32 image z gives (the attention kernels round dy to the
// compute dtype). (A transformer's case: the projection's input gradient.)
Node* attention_backward_reading_dy(Graph& g, const BufferUses& u, const TensorRef& z, DType y_dtype) {
  Node* r = sole_reader(g, u, z);
  const bool dy = r && r->op == OpKind::AttentionBackward && !r->inputs.empty() && r->inputs[0] &&
                  same_ref(*r->inputs[0], z) && r->attrs.i("compute") == int64_t(y_dtype);
  return dy ? r : nullptr;
}

}  // namespace

void fuse_matmul_cast(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t j = 0; j < g.nodes.size(); ++j) {
    const Node& c = g.nodes[j];
    if (c.op != OpKind::Copy || c.in_place || c.inputs.size() != 1 || !c.inputs[0]) continue;
    const TensorRef& y = *c.inputs[0];
    const TensorRef& z = c.outputs[0];
    const int i = u.producer(y.buffer);
    if (i < 0 || drop[size_t(i)]) continue;
    Node& m = g.nodes[size_t(i)];
    const bool sixteen = is_16bit(y.dtype);
    if (m.op != OpKind::Matmul || m.in_place || !same_ref(m.outputs[0], y) || !sixteen ||
        z.dtype != DType::f32 || z.shape != y.shape || z.strides != contiguous_strides(z.shape) || z.offset != 0)
      continue;
    const Buffer& yb = g.buffers[y.buffer];
    const Buffer& zb = g.buffers[z.buffer];
    Why why;
    if (!why(yb.kind == BufferKind::Internal && u.readers[y.buffer].size() == 1 && u.writers[y.buffer].size() == 1,
             "the 16-bit product has other readers or writers") ||
        !why(zb.kind == BufferKind::Internal && u.writers[z.buffer].size() == 1 && zb.device == yb.device,
             "the f32 copy is written elsewhere too") ||
        !why(!read_by_one_elementwise_op(g, u, z), "one elementwise op reads the copy: elementwise fusion takes the cast")) {
      why_not("matmul_cast", g, size_t(i), "its cast to f32", why.reason());
      continue;
    }
    if (Node* r = attention_backward_reading_dy(g, u, z, y.dtype)) {  // it reads the 16-bit y itself
      Node reads_y = *r;
      reads_y.inputs[0] = y;
      reads_y.attrs.set("dtype", reads_y.outputs[0].dtype);
      if (!call_supported(g, reads_y)) {
        why_not("matmul_cast", g, size_t(i), "its cast to f32", "the attention backward does not take a 16-bit dy");
        continue;
      }
      *r = std::move(reads_y);
      drop[j] = true;
      ++stats.fused;
      continue;
    }
    Node into{OpKind::MatmulInto, Attrs().set("dtype", z.dtype), m.inputs, {z}, false, {"matmul", "copy"}};
    if (!device_supports(g, z, OpKind::MatmulInto) || !call_supported(g, into)) {
      why_not("matmul_cast", g, size_t(i), "its cast to f32", "the device's matmul_into does not take the call");
      continue;
    }
    m = std::move(into);
    drop[j] = true;
    ++stats.fused;
  }
  drop_nodes(g, drop);
}

}  // namespace reel::compile
