// Bias gradients from the 16-bit gradient: under autocast a Linear's output gradient g (f32) is cast
// to 16 bits for the two GEMMs of its backward, and its bias gradient is the column sum of g:
//   db  = sum(g, every dim but the last)  (node s: traced inside the bias add's backward)
//   g16 = copy(g) to bf16                 (node c: the GEMMs read g16)
// The sum becomes a column_sums node that reads g16 instead, accumulating in f32, and moves to just
// after the cast when it came first (nothing between them may touch db): half the bytes
// of the largest reads of a GPT's backward (the fc layer's g is (B*T, 4d) f32), and where g has no
// other reader the elementwise kernel that produces g and g16 stops writing g at all. PyTorch's
// autocast sums the same 16-bit gradient. The result differs from the f32 sum by the 16-bit rounding
// of each summand (relative 2^-9 in bf16, averaging out over the rows): within the dtype tolerance of
// the compiled-against-eager parity tests, not equal to the bit. Applies on the GPU, when g is f32,
// contiguous and written once, and the cast is to a contiguous 16-bit buffer of g's shape.
// The sums then write the parameter's gradient themselves: compile/passes/write_sums_into_grads.cpp.
#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

// The columns a bias sum sums into: its input's last dim.
int64_t x_cols(const Node& n) { return n.inputs[0]->shape.back(); }

// Node n as a sum of an f32 tensor over every dim but the last, into f32.
bool is_bias_sum(const Node& n) {
  if (n.op != OpKind::Sum || n.in_place || n.inputs.size() != 1 || !n.inputs[0] || n.outputs.size() != 1 ||
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
  if (!internal_once(g, u, x) || !device_supports(g, x, OpKind::ColumnSums)) return -1;
  for (int k : u.readers[x.buffer]) {
    if (k == int(s) || !is_plain_cast_of(g, u, k, x) || !is_16bit(g.nodes[size_t(k)].outputs[0].dtype)) continue;
    if (k < int(s) || !u.touched_between(db.buffer, int(s), k)) return k;
  }
  return -1;
}

}  // namespace

void fuse_bias_grad_cast(Graph& g, PassStats& /*stats*/) {
  // The sums themselves drop no node; elementwise fusion later drops the f32 write that lost its
  // reader, and sums_into_grads (next) the copies and adds into the gradients.
  const BufferUses u = buffer_uses(g);
  std::vector<std::vector<size_t>> after(g.nodes.size());  // sums that move to just after node i
  std::vector<bool> moved(g.nodes.size(), false);
  for (size_t s = 0; s < g.nodes.size(); ++s) {
    if (!is_bias_sum(g.nodes[s])) continue;
    const int c = cast_of_input(g, u, s);
    if (c < 0) {
      why_not("bias_grad_cast", g, s, "a 16-bit cast of its input",
              "no such cast, or something touches the sum between the two");
      continue;
    }
    Node& n = g.nodes[s];
    // The sums as the op writes them: (N), one per column, whatever shape of N elements the traced
    // sum had (a broadcast's reduction may keep size-1 dims); the same memory.
    const TensorRef& db = n.outputs[0];
    const TensorRef sums_ref{db.buffer, {x_cols(n)}, {1}, db.offset, db.dtype};
    Node sums{OpKind::ColumnSums, Attrs(), {g.nodes[size_t(c)].outputs[0]}, {sums_ref}, false, {}};
    if (!call_supported(g, sums)) {
      why_not("bias_grad_cast", g, s, "a 16-bit cast of its input", "the device's column_sums does not take the call");
      continue;
    }
    n = std::move(sums);
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
}

}  // namespace reel::compile
