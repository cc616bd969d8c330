// Norms reading a 16-bit input: under autocast a convolution writes its result z16 in bf16/f16, and
// autocast casts it to f32 for the batch norm (or group norm) after it:
//   t = copy(z16) to f32     y, mean, rstd = batch_norm(t, w, b, ...)     ... in the backward:
//   dt, dw, db = batch_norm_backward(g, t, w, mean, rstd)
// so the step keeps t, 4 bytes an element, from the forward to the backward. Widening 16 bits to f32
// is exact, so the norms can read z16 itself as its f32 widening (their attr dtype = f32,
// kernels/schema/norm.cpp) and compute the same bits; the step then keeps z16 (2 bytes an element),
// as PyTorch's autocast does, and the cast goes. Where every reader of t is a group or batch norm,
// forward (x: input 0) or backward (x: input 1), reading all of t as x and nothing else of it, each
// reads z16 instead with dtype = f32, and the cast goes. t must be a cast's contiguous Internal
// buffer written only there (is_plain_cast_of) and not a result of the step, z16 must not be written
// from the cast to t's last reader, and the device must take every rewritten call (call_supported).
// The readers' `fused` lists name the cast ("copy batch_norm"). Bit-identical to the unrewritten
// step. Runs in the fusion stage before elementwise fusion (passes/pipeline.cpp).
#include <string>
#include <utility>
#include <vector>

#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "norm_16bit_input";

// Which input of n is x when n is a group or batch norm, forward or backward; -1 for other ops.
int x_input(const Node& n) {
  switch (n.op) {
    case OpKind::BatchNorm:
    case OpKind::GroupNorm: return 0;
    case OpKind::BatchNormBackward:
    case OpKind::GroupNormBackward: return 1;
    default: return -1;
  }
}

// Node k as a cast of a 16-bit value to f32 on the same device: t = copy(z16).
bool is_widening_cast(const Graph& g, const BufferUses& u, size_t k) {
  const Node& c = g.nodes[k];
  if (c.op != OpKind::Copy || c.inputs.size() != 1 || !c.inputs[0] || c.outputs.size() != 1) return false;
  const TensorRef &z = *c.inputs[0], &t = c.outputs[0];
  return is_16bit(z.dtype) && t.dtype == DType::f32 && g.buffers[z.buffer].device == g.buffers[t.buffer].device &&
         is_plain_cast_of(g, u, int(k), z);
}

// A cast worth a look: one of its result's readers is a group or batch norm.
bool feeds_a_norm(const Graph& g, const BufferUses& u, size_t k) {
  for (int r : u.readers[g.nodes[k].outputs[0].buffer])
    if (r < int(g.nodes.size()) && x_input(g.nodes[size_t(r)]) >= 0) return true;
  return false;
}

int refs_to(const Node& n, int buffer) {
  int refs = 0;
  for (const auto& in : n.inputs) refs += in && in->buffer == buffer;
  return refs;
}

// The readers of cast k's result t, each rewritten to read z16 as f32 (index, new node); or nothing,
// with the reason in `why`.
std::vector<std::pair<int, Node>> rewritten_readers(const Graph& g, const BufferUses& u, size_t k, Why& why) {
  const TensorRef &z = *g.nodes[k].inputs[0], &t = g.nodes[k].outputs[0];
  std::vector<std::pair<int, Node>> out;
  for (int r : u.readers[t.buffer]) {
    if (!why(r < int(g.nodes.size()), "t is a result of the step")) return {};
    const Node& n = g.nodes[size_t(r)];
    const int xi = x_input(n);
    if (!why(xi >= 0, std::string("t is also read by ") + op_name(n.op) + ", which needs it in f32")) return {};
    if (!why(n.inputs[size_t(xi)] && same_ref(*n.inputs[size_t(xi)], t) && refs_to(n, t.buffer) == 1,
             std::string(op_name(n.op)) + " reads t other than as all of its x"))
      return {};
    Node m = n;
    m.inputs[size_t(xi)] = z;
    m.attrs.set("dtype", DType::f32);
    m.fused.insert(m.fused.begin(), "copy");
    if (m.fused.size() == 1) m.fused.push_back(op_name(n.op));
    if (!why(call_supported(g, m), std::string("the device's ") + op_name(n.op) + " does not take a 16-bit x"))
      return {};
    out.emplace_back(r, std::move(m));
  }
  const int last = u.readers[t.buffer].back();
  for (int w : u.writers[z.buffer])
    if (!why(w < int(k) || w > last, "z16 is written between the cast and t's last reader")) return {};
  return out;
}

}  // namespace

void read_norm_input_16bit(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  fuse_each(g, [&](size_t k, std::vector<bool>& drop) {
    if (!is_widening_cast(g, u, k) || !feeds_a_norm(g, u, k)) return;
    Why why;
    std::vector<std::pair<int, Node>> readers = rewritten_readers(g, u, k, why);
    if (readers.empty()) return why_not(kPass, g, k, "its norms", why.reason());
    for (auto& [r, n] : readers) g.nodes[size_t(r)] = std::move(n);
    drop[k] = true;
    stats.fused += 1;
  });
}

}  // namespace reel::compile
