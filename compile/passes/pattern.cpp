// The passes' matching helpers (see pattern.h).
#include "compile/passes/pattern.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/philox_args.h"
#include "kernels/schema/views.h"
#include "tensor/log.h"

namespace reel::compile {

BufferUses buffer_uses(const Graph& g) {
  BufferUses u;
  const size_t nb = g.buffers.size();
  u.readers.resize(nb);
  u.writers.resize(nb);
  u.touches.resize(nb);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (const auto& r : g.nodes[i].inputs)
      if (r) {
        u.readers[r->buffer].push_back(int(i));
        u.touches[r->buffer].push_back(int(i));
      }
    for (const TensorRef& r : g.nodes[i].outputs) {
      u.writers[r.buffer].push_back(int(i));
      u.touches[r.buffer].push_back(int(i));
    }
  }
  for (const TensorRef& r : g.outputs) u.readers[r.buffer].push_back(int(g.nodes.size()));
  return u;
}

namespace {

bool any_between(const std::vector<int>& nodes, int i, int j) {
  for (int k : nodes)
    if (k > i && k < j) return true;
  return false;
}

}  // namespace

bool BufferUses::touched_between(int buffer, int i, int j) const { return any_between(touches[buffer], i, j); }
bool BufferUses::written_between(int buffer, int i, int j) const { return any_between(writers[buffer], i, j); }

void drop_nodes(Graph& g, const std::vector<bool>& drop) {
  std::vector<Node> kept;
  for (size_t k = 0; k < g.nodes.size(); ++k)
    if (!drop[k]) kept.push_back(std::move(g.nodes[k]));
  g.nodes = std::move(kept);
}

bool refers_to(const Node& n, int buffer) {
  for (const auto& r : n.inputs)
    if (r && r->buffer == buffer) return true;
  for (const TensorRef& r : n.outputs)
    if (r.buffer == buffer) return true;
  return false;
}

bool writes_an_input_of(const Node& m, const Node& n) {
  for (const TensorRef& w : m.outputs)
    for (const auto& r : n.inputs)
      if (r && r->buffer == w.buffer) return true;
  return false;
}

bool internal_once(const Graph& g, const BufferUses& u, const TensorRef& r) {
  return g.buffers[r.buffer].kind == BufferKind::Internal && u.writers[r.buffer].size() == 1;
}

bool is_plain_cast_of(const Graph& g, const BufferUses& u, int k, const TensorRef& src) {
  if (k < 0 || k >= int(g.nodes.size())) return false;
  const Node& c = g.nodes[size_t(k)];
  if (c.op != OpKind::Copy || c.in_place || c.inputs.size() != 1 || !c.inputs[0] ||
      !same_ref(*c.inputs[0], src) || c.outputs.size() != 1)
    return false;
  const TensorRef& out = c.outputs[0];
  return out.shape == src.shape && is_contiguous(out) && internal_once(g, u, out);
}

std::optional<DropoutProduct> dropout_product(const Graph& g, const BufferUses& u, int k) {
  if (k < 0 || k >= int(g.nodes.size())) return std::nullopt;
  const Node& n = g.nodes[size_t(k)];
  if (n.op != OpKind::Mul || n.in_place || n.inputs.size() != 2 || !n.inputs[0] || !n.inputs[1]) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    const TensorRef &m = *n.inputs[size_t(side)], &v = *n.inputs[size_t(1 - side)];
    const int d = u.producer(m.buffer);
    if (d < 0 || d >= k || g.nodes[size_t(d)].op != OpKind::DropoutMask || !internal_once(g, u, m) ||
        u.readers[m.buffer] != std::vector<int>{k} || m.buffer == v.buffer)
      continue;
    if (!is_contiguous(m) || m.offset != 0 || m.shape != v.shape || m.dtype != v.dtype || !is_contiguous(v)) continue;
    return DropoutProduct{d, v};
  }
  return std::nullopt;
}

void add_fused_dropout(Node& n, const Node& mask) {
  const bool state = !mask.inputs.empty() && mask.inputs[0];
  n.attrs = with_fused_dropout(n.attrs, mask.attrs, state);
  if (state) n.inputs.push_back(mask.inputs[0]);
  n.fused.push_back("dropout");
}

int sole_reader(const Graph& g, const BufferUses& u, const TensorRef& z) {
  const std::vector<int>& readers = u.readers[z.buffer];
  if (readers.size() != 1 || readers[0] < 0 || readers[0] >= int(g.nodes.size())) return -1;
  int refs = 0;
  for (const auto& in : g.nodes[size_t(readers[0])].inputs) refs += in && in->buffer == z.buffer;
  return refs == 1 ? readers[0] : -1;
}

std::optional<TensorRef> as_matrix(const TensorRef& r) {
  if (r.shape.size() < 2) return std::nullopt;
  const int64_t cols = r.shape.back(), rows = numel_of(r.shape) / std::max<int64_t>(cols, 1);
  std::optional<Shape> strides = view_strides(r.shape, r.strides, {rows, cols});
  if (!strides) return std::nullopt;
  return TensorRef{r.buffer, {rows, cols}, *strides, r.offset, r.dtype};
}

Tensor traced(const Graph& g, const TensorRef& r) {
  const Buffer& b = g.buffers[r.buffer];
  if (b.storage) return view_of(b.storage, 0, r);
  // A buffer an earlier pass made (a 16-bit cast of a bias, say) has no traced memory: a meta block of
  // its size stands in, which is all a support query looks at.
  return view_of(std::make_shared<Storage>(Storage::Meta{}, b.nbytes, b.device), 0, r);
}

TensorRef new_internal_buffer(Graph& g, const Shape& shape, DType dtype, const Device& device) {
  Buffer b;
  b.id = int(g.buffers.size());
  b.kind = BufferKind::Internal;
  b.nbytes = size_t(numel_of(shape)) * dtype_size(dtype);
  b.device = device;
  g.buffers.push_back(std::move(b));
  return TensorRef{int(g.buffers.size()) - 1, shape, contiguous_strides(shape), 0, dtype};
}

int later_16bit_cast(const Graph& g, const BufferUses& u, const TensorRef& out) {
  for (int k : u.readers[out.buffer])
    if (is_plain_cast_of(g, u, k, out) && is_16bit(g.nodes[size_t(k)].outputs[0].dtype) &&
        u.touches[g.nodes[size_t(k)].outputs[0].buffer].front() == k)
      return k;
  return -1;
}

bool device_supports(const Graph& g, const TensorRef& r, OpKind op) {
  return supports(op, g.buffers[r.buffer].device.type);
}

bool is_dense(const TensorRef& r) {
  return is_contiguous(r) || (r.shape.size() == 4 && r.strides == strides_for(r.shape, MemoryFormat::ChannelsLast));
}

bool is_position_broadcast(const TensorRef& r) { return reel::is_position_broadcast(r.shape, r.strides); }

bool call_supported(const Graph& g, const Node& n) {
  std::vector<Tensor> in, out;
  for (const auto& r : n.inputs) in.push_back(r ? traced(g, *r) : Tensor());
  for (const TensorRef& r : n.outputs) out.push_back(traced(g, r));
  return supports_call(n.op, in, out, n.attrs);
}

std::optional<GradientWrite> gradient_write(const Node& c) {
  const bool copy = c.op == OpKind::Copy && !c.in_place && c.inputs.size() == 1;
  const bool add = c.op == OpKind::Add && c.in_place && c.inputs.size() == 2 && c.inputs[0] &&
                   same_ref(*c.inputs[0], c.outputs[0]);
  if (!(copy || add) || !c.inputs.back()) return std::nullopt;
  return GradientWrite{&*c.inputs.back(), add};
}

bool may_write_gradient_early(const BufferUses& u, const TensorRef& z, int i, int j, bool add) {
  if (u.touched_between(z.buffer, i, j)) return false;
  return add || u.touches[z.buffer].front() == j;  // a copy must create the gradient
}

std::optional<ResultWrite> whole_result_written_to_grad(const Graph& g, const BufferUses& u, size_t j, Why& why) {
  const Node& c = g.nodes[j];
  const std::optional<GradientWrite> write = gradient_write(c);
  if (!write) return std::nullopt;
  const TensorRef &r = *write->source, &z = c.outputs[0];
  const int i = u.producer(r.buffer);
  if (!why(i >= 0 && i < int(j), "no node before it writes what it copies")) return std::nullopt;
  const Node& n = g.nodes[size_t(i)];
  size_t k = 0;
  while (k < n.outputs.size() && n.outputs[k].buffer != r.buffer) ++k;
  if (!why(!n.in_place && k < n.outputs.size() && internal_once(g, u, r) && u.readers[r.buffer].size() == 1,
           "the result is written or read by other nodes too"))
    return std::nullopt;
  const TensorRef& made = n.outputs[k];
  const int64_t count = numel_of(made.shape);
  if (!why(r.offset == made.offset && r.dtype == made.dtype && numel_of(r.shape) == count && is_contiguous(r) &&
               is_contiguous(made) && g.buffers[r.buffer].nbytes == made.nbytes(),
           "it copies part of the result, or through another layout"))
    return std::nullopt;
  if (!why(z.dtype == made.dtype && numel_of(z.shape) == count && is_contiguous(z),
           "the gradient has another dtype or layout"))
    return std::nullopt;
  if (!why(may_write_gradient_early(u, z, i, int(j), write->add), "the gradient is touched between the two"))
    return std::nullopt;
  return ResultWrite{i, k, write->add};
}

Link cast_link(const char* what, DType to, bool any_16bit, bool sole) {
  return {what,
          [to, any_16bit](const Graph& g, const BufferUses& u, int k, const TensorRef& in) {
            if (!is_plain_cast_of(g, u, k, in)) return false;
            const DType d = g.nodes[size_t(k)].outputs[0].dtype;
            return any_16bit ? is_16bit(d) : d == to;
          },
          sole};
}

Link op_link(const char* what, OpKind op, DType out, bool sole) {
  return {what,
          [op, out](const Graph& g, const BufferUses& u, int k, const TensorRef& in) {
            const Node& n = g.nodes[size_t(k)];
            return n.op == op && !n.in_place && n.inputs.size() == 1 && n.inputs[0] && same_ref(*n.inputs[0], in) &&
                   n.outputs.size() == 1 && n.outputs[0].dtype == out && internal_once(g, u, n.outputs[0]);
          },
          sole};
}

std::optional<std::vector<int>> match_chain(const Graph& g, const BufferUses& u, const TensorRef& from,
                                            const std::vector<Link>& links, Why& why) {
  std::vector<int> nodes;
  TensorRef value = from;
  for (const Link& l : links) {
    int next = -1;
    if (l.sole) {
      const int k = sole_reader(g, u, value);
      if (k >= 0 && l.test(g, u, k, value)) next = k;
    } else {
      for (int k : u.readers[value.buffer])
        if (k < int(g.nodes.size()) && l.test(g, u, k, value)) {
          next = k;
          break;
        }
    }
    if (!why(next >= 0, std::string(l.sole ? "the only reader is not " : "no reader is ") + l.what)) return std::nullopt;
    nodes.push_back(next);
    value = g.nodes[size_t(next)].outputs[0];
  }
  return nodes;
}

void why_not(const char* pass, const Graph& g, size_t i, const char* with, const std::string& reason) {
  if (!log_enabled("fusion")) return;
  const char* op = i < g.nodes.size() ? op_name(g.nodes[i].op) : "?";
  log_line("fusion", detail::cat(pass, ": ", op, " k", i, " not fused with ", with, ": ", reason));
}

}  // namespace reel::compile
