// Weight gradients written by their GEMM: a 2-D GEMM's result y, read only by the node that puts it
// into a parameter's gradient — the first micro-batch's copy (AccumulateGrad's private copy) or a
// later one's in-place add (params +=), possibly through a transposed view (a Linear's W^T) — becomes
// a matmul_into node that computes straight into the gradient (transposed: z = (a b)^T), with beta = 1
// for the add. Applies when no node between the GEMM and that copy/add touches the gradient, which
// then is simply written earlier. Runs after matmul_cast (so 16-bit GEMMs that now write f32
// qualify), on a device with matmul_into. In f32 on the CPU the fused kernel is matmul then the copy
// or add: eager's bits.
#include <optional>

#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

// Whether `r` reads all of `y` as stored (0) or transposed (1); -1 otherwise. Both 2-D.
int reading(const TensorRef& r, const TensorRef& y) {
  if (r.buffer != y.buffer || r.offset != y.offset || r.dtype != y.dtype || r.shape.size() != 2 || y.shape.size() != 2)
    return -1;
  if (r.shape == y.shape && r.strides == y.strides) return 0;
  if (r.shape == Shape{y.shape[1], y.shape[0]} && r.strides == Shape{y.strides[1], y.strides[0]}) return 1;
  return -1;
}

// Node j puts a GEMM's result into a gradient (a copy creating it, or an in-place add): the GEMM's
// index, how it reads the result (0 as stored, 1 transposed) and whether j adds; or nullopt.
struct GradWrite {
  int gemm, how;
  bool add;
};

std::optional<GradWrite> grad_write(const Graph& g, const BufferUses& u, size_t j, const std::vector<bool>& drop) {
  const Node& c = g.nodes[j];
  const std::optional<GradientWrite> write = gradient_write(c);
  if (!write) return std::nullopt;
  const TensorRef& r = *write->source;
  const TensorRef& z = c.outputs[0];
  const int i = u.producer(r.buffer);
  if (i < 0 || drop[size_t(i)]) return std::nullopt;
  const Node& m = g.nodes[size_t(i)];
  // A plain GEMM, or one fuse_matmul_cast made write f32 (not yet transposed nor accumulating).
  const bool plain = m.op == OpKind::Matmul ||
                     (m.op == OpKind::MatmulInto && !m.attrs.b("transpose", false) && !m.attrs.b("accumulate", false));
  if (!plain || m.in_place || m.inputs.size() != 2 || !m.inputs[0] || !m.inputs[1] || m.inputs[0]->shape.size() != 2 ||
      m.inputs[1]->shape.size() != 2)
    return std::nullopt;
  const TensorRef& y = m.outputs[0];
  const int how = reading(r, y);
  const Buffer& yb = g.buffers[y.buffer];
  Why why;
  if (!why(how >= 0, "the gradient write reads only part of the product") ||
      !why(yb.kind == BufferKind::Internal && u.readers[y.buffer].size() == 1 && u.writers[y.buffer].size() == 1,
           "the product has other readers or writers") ||
      !why(z.dtype == y.dtype && z.shape.size() == 2 && z.strides == contiguous_strides(z.shape) &&
               g.buffers[z.buffer].device == yb.device,
           "the gradient is not a contiguous matrix of the product's dtype") ||
      !why(device_supports(g, z, OpKind::MatmulInto), "the device has no matmul_into") ||
      !why(may_write_gradient_early(u, z, i, int(j), write->add), "something touches the gradient in between")) {
    why_not("matmul_accumulate", g, size_t(i), "the write into its gradient", why.reason());
    return std::nullopt;
  }
  return GradWrite{i, how, write->add};
}

}  // namespace

void fuse_matmul_accumulate(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t j = 0; j < g.nodes.size(); ++j) {
    std::optional<GradWrite> w = grad_write(g, u, j, drop);
    if (!w) continue;
    Node& m = g.nodes[size_t(w->gemm)];
    const TensorRef z = g.nodes[j].outputs[0];
    Node into{OpKind::MatmulInto, Attrs(m.attrs).set("transpose", w->how == 1).set("accumulate", w->add),
              {m.inputs[0], m.inputs[1]}, {z}, w->add, m.fused};
    into.attrs.set("dtype", z.dtype);
    if (w->add) into.inputs.push_back(z);
    into.fused.push_back(w->add ? "add" : "copy");
    if (into.fused.front() != "matmul") into.fused.insert(into.fused.begin(), "matmul");
    if (!call_supported(g, into)) continue;
    m = std::move(into);
    drop[j] = true;
    ++stats.fused;
  }
  drop_nodes(g, drop);
}

}  // namespace reel::compile
