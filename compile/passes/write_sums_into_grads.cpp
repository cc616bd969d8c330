// Sums written into gradients: a parameter's gradient that is a sum of another tensor's rows, over
// its leading dims (a bias's, over the rows of its output's gradient; a position table's, over the
// batch) or scattered by ids (an embedding table's),
//   s = column_sums(x16)  or  s = sum(x, dims 0..k-1)      x (R..., C...) f32, contiguous
//   s = embedding_backward(g, ids)                         s (V, D), g's dtype
//   grad = copy(s)  (the first micro-batch: AccumulateGrad creates the gradient)
//   grad += s       (the later ones)
// becomes one node that writes, or adds to, the gradient in its last step:
//   column_sums(x as (R, C)) -> grad as (C)            [accumulate: grad (C) is also its last input]
//   embedding_backward(g, ids) -> grad (V, D)          [accumulate: likewise]
// One launch fewer per parameter and micro-batch, equal to the bit to the sum and then the copy or
// add: column_sums of an f32 x is the sum op's reduction of the same (1, R, C) layout (CPU and CUDA),
// and both kernels' accumulation adds each finished sum (rounded to the gradient's dtype) to the
// gradient as the add op does (kernels/cpu/pool.cpp, kernels/cuda/pool.cu, kernels/cuda/reduce.cu).
// Applies when s is written once, read by that copy or add alone and wholly, and nothing touches the
// gradient between the sum and the write (a copy must be what creates it). The sum's reduced dims of
// size > 1 must all come before its kept ones, so that x is rows of C contiguous columns.
#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

// The (R, C) view of x that sum node n reduces over its rows, when n is a sum of a contiguous f32 x
// over leading dims into f32; nullopt otherwise.
std::optional<TensorRef> leading_sum_rows(const Node& n) {
  if (n.op != OpKind::Sum || n.in_place || n.inputs.size() != 1 || !n.inputs[0] || n.outputs.size() != 1 ||
      !n.attrs.has("dims"))
    return std::nullopt;
  const TensorRef& x = *n.inputs[0];
  const int64_t nd = int64_t(x.shape.size());
  if (nd == 0 || x.dtype != DType::f32 || n.outputs[0].dtype != DType::f32 || !is_contiguous(x)) return std::nullopt;
  std::vector<bool> reduced(size_t(nd), false);
  for (int64_t d : wrap_dims(n.attrs.ints("dims"), nd, "sum")) reduced[size_t(d)] = true;
  int64_t rows = 1;
  bool kept_seen = false;
  for (int64_t d = 0; d < nd; ++d) {
    if (x.shape[size_t(d)] == 1) continue;
    if (!reduced[size_t(d)])
      kept_seen = true;
    else if (kept_seen)
      return std::nullopt;  // a reduced dim after a kept one: not rows of columns
    else
      rows *= x.shape[size_t(d)];
  }
  const int64_t cols = rows == 0 ? 0 : numel_of(x.shape) / rows;
  if (rows == 0 || cols == 0 || numel_of(n.outputs[0].shape) != cols) return std::nullopt;
  return TensorRef{x.buffer, {rows, cols}, {cols, 1}, x.offset, x.dtype};
}

// Whether node n is a sum the pass can have write a gradient: a column-sums node or a leading-dims
// sum (f32), or an embedding backward, none of them accumulating already.
bool is_rewritable_sum(const Node& n) {
  if (n.in_place || n.attrs.b("accumulate", false) || n.outputs.size() != 1) return false;
  if (n.op == OpKind::ColumnSums || n.op == OpKind::EmbeddingBackward) return true;
  return leading_sum_rows(n).has_value();
}

// Node j as AccumulateGrad's write (compile/passes/pattern.h, whole_result_written_to_grad) of a
// sum's whole result into the parameter's gradient, the sum's kind able to write it: i, or -1.
int sum_written_to_grad(const Graph& g, const BufferUses& u, size_t j) {
  Why why;  // the declines are results_into_grads' to say
  const std::optional<ResultWrite> w = whole_result_written_to_grad(g, u, j, why);
  if (!w || w->output != 0 || !is_rewritable_sum(g.nodes[size_t(w->producer)])) return -1;
  const Node& sum = g.nodes[size_t(w->producer)];
  const TensorRef &s = sum.outputs[0], &z = g.nodes[j].outputs[0];
  // The column sums write f32 (C) whatever the gradient's shape; the embedding backward, (V, D).
  const bool geometry = sum.op == OpKind::EmbeddingBackward ? z.shape == s.shape : s.dtype == DType::f32;
  return geometry ? w->producer : -1;
}

// Sum node `sum` rewritten to write (add to, with `add`) the gradient z itself.
Node written_into(const Node& sum, const TensorRef& z, bool add) {
  Node into = sum;  // its inputs, attrs and phase
  into.attrs.set("accumulate", add);
  into.in_place = add;
  into.fused = {sum.op == OpKind::EmbeddingBackward ? "embedding_backward" : "sum", add ? "add" : "copy"};
  if (sum.op == OpKind::EmbeddingBackward) {
    into.outputs = {z};
  } else {
    // The gradient as the column sums write it: (C), the same memory, whatever shape it has.
    into.op = OpKind::ColumnSums;
    into.attrs = Attrs().set("accumulate", add);
    if (sum.op == OpKind::Sum) into.inputs = {*leading_sum_rows(sum)};
    into.outputs = {TensorRef{z.buffer, {numel_of(z.shape)}, {1}, z.offset, z.dtype}};
  }
  if (add) into.inputs.push_back(into.outputs[0]);
  return into;
}

}  // namespace

void write_sums_into_grads(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t j = 0; j < g.nodes.size(); ++j) {
    const int i = sum_written_to_grad(g, u, j);
    if (i < 0 || drop[size_t(i)]) continue;
    Node& sum = g.nodes[size_t(i)];
    const Node& c = g.nodes[j];
    Node into = written_into(sum, c.outputs[0], gradient_write(c)->add);
    if (!call_supported(g, into)) {
      why_not("sums_into_grads", g, size_t(i), "the gradient's write", "the device's kernel does not take the call");
      continue;
    }
    sum = std::move(into);
    drop[j] = true;
    ++stats.fused;
  }
  drop_nodes(g, drop);
}

}  // namespace reel::compile
