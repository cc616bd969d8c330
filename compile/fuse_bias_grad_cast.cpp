// Bias gradients from the 16-bit gradient (see fuse_bias_grad_cast.h).
#include "compile/fuse_bias_grad_cast.h"

#ifdef REEL_CUDA
#include "kernels/cuda/column_sums.h"
#endif

namespace reel::compile {

#ifdef REEL_CUDA
namespace {

// in: g16 (..., N) (and, accumulating, the gradient itself); out: db (N elements, f32), written, or
// added to with `accumulate` (the parameter's gradient over micro-batches).
class ColumnSumsKernel : public FusedKernel {
 public:
  explicit ColumnSumsKernel(bool accumulate = false) : accumulate_(accumulate) {}
  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override {
    cuda::column_sums_into(in[0], out[0], accumulate_);
  }
  std::string name() const override {
    return accumulate_ ? "bias gradient: column sums of the 16-bit gradient, added to the gradient"
                       : "bias gradient: column sums of the 16-bit gradient";
  }
  bool accumulate() const { return accumulate_; }

 private:
  bool accumulate_;
};

// Node j as AccumulateGrad's write of a bias sum's result into the parameter's gradient: the copy
// that creates the gradient (first micro-batch) or the in-place add (params +=, later ones), reading
// all of db, which nothing else reads, from a column-sums node i. Returns i, or -1.
int bias_sum_written_to_grad(const Graph& g, const BufferUses& u, size_t j) {
  const Node& c = g.nodes[j];
  const std::optional<GradientWrite> write = gradient_write(c);
  if (!write) return -1;
  const TensorRef &r = *write->source, &z = c.outputs[0];
  const int i = u.producer(r.buffer);
  if (i < 0 || i >= int(j)) return -1;
  const Node& sum = g.nodes[size_t(i)];
  if (sum.op != OpKind::Sum || sum.in_place || !dynamic_cast<const ColumnSumsKernel*>(sum.kernel.get())) return -1;
  const TensorRef& db = sum.outputs[0];
  const int64_t n = numel_of(db.shape);
  if (r.buffer != db.buffer || r.offset != 0 || r.dtype != DType::f32 || numel_of(r.shape) != n || !is_contiguous(r) ||
      !internal_once(g, u, db) || u.readers[db.buffer].size() != 1)
    return -1;
  if (z.dtype != DType::f32 || numel_of(z.shape) != n || !is_contiguous(z) || !g.buffers[z.buffer].device.is_cuda() ||
      !may_write_gradient_early(u, z, i, int(j), write->add))
    return -1;
  return i;
}

// The column sums write (or add) straight into the parameter's gradient, and the copy or add goes:
// one launch fewer per bias and micro-batch, and the same bits (an f32 add of the same sums).
void write_bias_sums_into_grads(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t j = 0; j < g.nodes.size(); ++j) {
    const int i = bias_sum_written_to_grad(g, u, j);
    if (i < 0 || drop[size_t(i)]) continue;
    Node& sum = g.nodes[size_t(i)];
    const Node& c = g.nodes[j];
    const bool add = gradient_write(c)->add;
    const TensorRef z = c.outputs[0];  // the gradient (N), as many elements as db
    sum.outputs = {z};
    if (add) sum.inputs.push_back(z);
    sum.in_place = add;
    sum.kernel = std::make_shared<ColumnSumsKernel>(add);
    sum.fused = {"sum", add ? "add" : "copy"};
    drop[j] = true;
    ++stats.fused;
  }
  drop_nodes(g, drop);
}

// Node n as a sum of an f32 tensor over every dim but the last, into f32.
bool is_bias_sum(const Node& n) {
  if (n.op != OpKind::Sum || n.kernel || n.in_place || n.inputs.size() != 1 || !n.inputs[0] || n.outputs.size() != 1 ||
      !n.attrs.has("dims"))
    return false;
  const TensorRef& x = *n.inputs[0];
  const TensorRef& out = n.outputs[0];
  const int64_t nd = int64_t(x.shape.size());
  if (nd < 2 || x.dtype != DType::f32 || out.dtype != DType::f32 || !is_contiguous(x) || !is_contiguous(out) ||
      numel_of(out.shape) != x.shape.back() || x.shape.back() == 0)
    return false;
  std::vector<int64_t> want(size_t(nd - 1));
  for (int64_t d = 0; d < nd - 1; ++d) want[size_t(d)] = d;
  return wrap_dims(n.attrs.ints("dims"), nd, "sum") == want;
}

// A cast of the sum's input to 16 bits: the cast's node index, or -1. Autograd usually traces the
// bias sum first (inside the add's backward) and the cast after it (inside the cast's backward): a
// later cast qualifies when nothing between the two touches the sum's result, so that the sum can
// move to just after the cast.
int cast_of_input(const Graph& g, const BufferUses& u, size_t s) {
  const TensorRef& x = *g.nodes[s].inputs[0];
  const TensorRef& db = g.nodes[s].outputs[0];
  if (!internal_once(g, u, x) || !g.buffers[x.buffer].device.is_cuda()) return -1;
  for (int k : u.readers[x.buffer]) {
    if (k == int(s) || !is_plain_cast_of(g, u, k, x) || !is_16bit(g.nodes[size_t(k)].outputs[0].dtype)) continue;
    if (k < int(s) || !u.touched_between(db.buffer, int(s), k)) return k;
  }
  return -1;
}

}  // namespace
#endif

std::optional<bool> column_sums_accumulate(const Node& n) {
#ifdef REEL_CUDA
  if (const auto* k = dynamic_cast<const ColumnSumsKernel*>(n.kernel.get()); k && n.op == OpKind::Sum)
    return k->accumulate();
#else
  (void)n;
#endif
  return std::nullopt;
}

void fuse_bias_grad_cast(Graph& g, PassStats& stats) {
#ifdef REEL_CUDA
  // The sums themselves drop no node; elementwise fusion later drops the f32 write that lost its
  // reader, and write_bias_sums_into_grads the copies and adds into the gradients.
  const BufferUses u = buffer_uses(g);
  std::vector<std::vector<size_t>> after(g.nodes.size());  // sums that move to just after node i
  std::vector<bool> moved(g.nodes.size(), false);
  for (size_t s = 0; s < g.nodes.size(); ++s) {
    if (!is_bias_sum(g.nodes[s])) continue;
    const int c = cast_of_input(g, u, s);
    if (c < 0) continue;
    Node& n = g.nodes[s];
    n.inputs[0] = g.nodes[size_t(c)].outputs[0];
    n.kernel = std::make_shared<ColumnSumsKernel>();
    if (c > int(s)) {
      after[size_t(c)].push_back(s);
      moved[s] = true;
    }
  }
  std::vector<Node> order;
  order.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!moved[i]) order.push_back(std::move(g.nodes[i]));
    for (size_t s : after[i]) order.push_back(std::move(g.nodes[s]));
  }
  g.nodes = std::move(order);
  write_bias_sums_into_grads(g, stats);
#else
  (void)g;
  (void)stats;
#endif
}

}  // namespace reel::compile
