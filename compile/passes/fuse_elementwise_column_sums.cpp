// Column sums into the elementwise kernel that writes what they sum. Under autocast a Linear's bias
// gradient is the column sum of its 16-bit output gradient (compile/passes/fuse_bias_grad_cast.cpp),
// and where an activation comes before the Linear that gradient is written by a fused elementwise
// kernel (GELU's backward in an MLP: fc's output gradient = gelu'(z) * fc2's input gradient):
//
//   y = fused_elementwise(...)          y (..., C), one of the kernel's outputs         (node i)
//   ...                                 nodes that neither write y nor touch db
//   db (=|+=) column_sums(y)            db (C) f32, written or added into the gradient  (node s)
//
// becomes one fused_elementwise node with column sums (kernels/fused_expr.h, FusedColumnSums) that
// also writes db: the kernel adds each column's stored values as it writes them (on CUDA in one
// pass over the rows, kernels/jit/codegen_cuda.h), so the column-sum kernel and its read of y go.
// Equal to the column_sums op up to f32 rounding (the sums are added in another fixed order: the
// same bits on every run). Applies when the column sums read all of y, one sum per column of y's
// last dim, and the device runs fused_elementwise; runs after elementwise fusion, which makes the
// kernels it extends. Off by default (REEL_PASSES=+elementwise_column_sums): on the H200 the step
// was slower with it than with the two kernels it joins (bench/RESULTS.md).
#include "compile/passes/passes.h"
#include "kernels/fused_expr.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "elementwise_column_sums";

// The node s as column sums of all of `y`, C = y's last dim: x reads y's elements in y's order
// (y itself, or its rows (..., C) merged), db is a contiguous f32 (C). The reason in `why` when not.
bool sums_all_of(const Node& s, const TensorRef& y, Why& why) {
  if (!why(s.op == OpKind::ColumnSums && s.outputs.size() == 1 && !s.inputs.empty() && s.inputs[0], "not column sums"))
    return false;
  const TensorRef &x = *s.inputs[0], &db = s.outputs[0];
  return why(x.buffer == y.buffer && x.offset == y.offset && x.dtype == y.dtype && is_contiguous(x) &&
                 numel_of(x.shape) == numel_of(y.shape) && !x.shape.empty() && !y.shape.empty() &&
                 x.shape.back() == y.shape.back(),
             "the column sums read another part or layout of the output") &&
         why(db.dtype == DType::f32 && db.shape == Shape{y.shape.back()} && is_contiguous(db),
             "the sums are not one f32 value per column");
}

// The column-sums node that can move into fused node i, summing its output `out` (set): its index,
// or -1 with the reason in `why`.
int column_sums_of(const Graph& g, const BufferUses& u, size_t i, int& out, Why& why) {
  const Node& f = g.nodes[i];
  for (size_t k = 0; k < f.outputs.size(); ++k) {
    const TensorRef& y = f.outputs[k];
    if (y.dtype != DType::f32 && !is_16bit(y.dtype)) continue;
    for (int s : u.readers[y.buffer]) {
      if (s <= int(i)) continue;
      const Node& sums = g.nodes[size_t(s)];
      if (!sums_all_of(sums, y, why)) continue;
      const TensorRef& db = sums.outputs[0];
      const bool add = sums.attrs.b("accumulate", false);
      if (!why(!u.written_between(y.buffer, int(i), s), "the output is written again before its column sums") ||
          !why(!u.touched_between(db.buffer, int(i), s), "the sums' buffer is touched between the two") ||
          !why(!refers_to(f, db.buffer), "the kernel itself touches the sums' buffer") ||
          !why(!add || (sums.inputs.size() == 2 && sums.inputs[1] && same_ref(*sums.inputs[1], db)),
               "the sums are added to another tensor than the one they write"))
        continue;
      out = int(k);
      return s;
    }
  }
  why(false, "no column sums read one of its outputs");
  return -1;
}

}  // namespace

void fuse_elementwise_column_sums(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  fuse_each(g, [&](size_t i, std::vector<bool>& drop) {
    const Node& f = g.nodes[i];
    if (f.op != OpKind::FusedElementwise || fused_column_sums_of(f.attrs).on()) return;
    Why why;
    int out = -1;
    const int s = column_sums_of(g, u, i, out, why);
    if (s < 0 || drop[size_t(s)]) return why_not(kPass, g, i, "column sums", why.reason());
    const Node& sums = g.nodes[size_t(s)];
    const bool add = sums.attrs.b("accumulate", false);
    Node fused = f;
    set_fused_column_sums(fused.attrs, {out, add});
    fused.outputs.push_back(sums.outputs[0]);
    if (add) fused.inputs.push_back(sums.outputs[0]);
    fused.in_place = fused.in_place || add;
    if (sums.fused.empty())
      fused.fused.push_back("column_sums");
    else
      fused.fused.insert(fused.fused.end(), sums.fused.begin(), sums.fused.end());
    if (!call_supported(g, fused))
      return why_not(kPass, g, i, "column sums", "the device's kernel does not take the call");
    g.nodes[i] = std::move(fused);
    drop[size_t(s)] = true;
    stats.fused += 1;
  });
}

}  // namespace reel::compile
