// Identity gathers: an embedding lookup of the positions 0, 1, ..., n-1 (an arange node's ids) copies
// the first n rows of its table in order, and its backward with a table of exactly n rows scatters each
// gradient row to its own row:
//   y  = embedding(W (V, D), arange(n))                       y (n, D)  = W[0:n]    (n <= V)
//   dW = embedding_backward(g (n, D), arange(n)), V = n        dW (n, D) = g
// A GPT's learned position embedding is traced so: each micro-batch gathers the table's first T rows
// into a fresh buffer for the add to the token embeddings, and scatters the batch-summed gradient back
// through the same ids. The readers of y (of dW) read W's rows (g) where they lie instead, and the
// node goes: two kernels fewer a micro-batch. The same values: the gather copies bits, and the scatter
// of distinct ids adds each row to a zero (a negative zero comes out positive there, and stays
// negative here). Applies when the table (or g) is contiguous, y (dW) is written once and is not a
// graph output, and nothing writes the table (g) before y's (dW's) last reader; V > n in the backward
// (rows no position touches get zeros) keeps its kernel.
// The arange node is usually left without a reader and goes with dead code, which runs next.
#include <algorithm>

#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

// Whether ids are arange's values 0, 1, ..., n-1 in order: a 1-D view of an arange node's i64 output.
bool ids_count_from_zero(const Graph& g, const BufferUses& u, const TensorRef& ids) {
  const int a = u.producer(ids.buffer);
  if (a < 0 || ids.dtype != DType::i64 || ids.shape.size() != 1) return false;
  const Node& n = g.nodes[size_t(a)];
  if (n.op != OpKind::Arange || n.in_place || u.writers[ids.buffer].size() != 1) return false;
  if (ids.shape[0] > 1 && ids.strides[0] != 1) return false;
  // Element k of the view is start + step * (offset + k): zero at k = 0, then counting up by one.
  const double start = n.attrs.f("start"), step = n.attrs.f("step");
  return step == 1.0 && start + step * double(ids.offset) == 0.0;
}

// Node i's output `from` (contiguous, written once by i, no graph output) read as `to` instead, whose
// first numel(from) elements hold the same values in the same order: each reader's view of `from`
// becomes the same view of `to`. Declines (false) when nothing may move: a reader reads `from` as
// another dtype, or something writes `to` between i and the last reader.
bool read_in_place(Graph& g, const BufferUses& u, size_t i, const TensorRef& from, const TensorRef& to, Why& why) {
  const std::vector<int>& readers = u.readers[from.buffer];
  if (!why(internal_once(g, u, from) && is_contiguous(from) && is_contiguous(to) && from.dtype == to.dtype,
           "the result or its source is not one contiguous buffer of one dtype"))
    return false;
  if (!why(std::find(readers.begin(), readers.end(), int(g.nodes.size())) == readers.end(),
           "the result is an output of the step"))
    return false;
  const int last = readers.empty() ? int(i) : readers.back();
  for (int w : u.writers[to.buffer])
    if (!why(w <= int(i) || w > last, "its source is written before the result's last reader")) return false;
  for (int j : readers)
    for (auto& r : g.nodes[size_t(j)].inputs)
      if (r && r->buffer == from.buffer && !why(r->dtype == from.dtype, "a reader reads it as another dtype"))
        return false;
  for (int j : readers)
    for (auto& r : g.nodes[size_t(j)].inputs)
      if (r && r->buffer == from.buffer) {
        r->buffer = to.buffer;
        r->offset = to.offset + (r->offset - from.offset);
      }
  return true;
}

}  // namespace

void read_identity_gathers(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const bool forward = n.op == OpKind::Embedding, backward = n.op == OpKind::EmbeddingBackward;
    if (!(forward || backward) || n.in_place || n.inputs.size() != 2 || !n.inputs[0] || !n.inputs[1] ||
        n.outputs.size() != 1)
      continue;
    const TensorRef &src = *n.inputs[0], &ids = *n.inputs[1], &out = n.outputs[0];
    Why why;
    const bool identity = why(ids_count_from_zero(g, u, ids), "its ids are not an arange from 0 by 1") &&
                          why(forward ? ids.shape[0] <= src.shape[0] : out.shape[0] == ids.shape[0],
                              forward ? "more ids than table rows" : "the table has rows no id touches");
    // The forward's y is the table's first rows; the backward's dW is g itself, viewed (V, D).
    if (!identity || !read_in_place(g, u, i, out, src, why)) {
      why_not("identity_gathers", g, i, "its ids", why.reason());
      continue;
    }
    drop[i] = true;
    ++stats.in_place;
  }
  drop_nodes(g, drop);
}

}  // namespace reel::compile
