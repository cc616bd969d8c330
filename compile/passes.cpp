// Dead-code elimination and constant folding (see passes.h).
#include "compile/passes.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/schema/views.h"

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

bool BufferUses::touched_between(int buffer, int i, int j) const {
  for (int k : touches[buffer])
    if (k > i && k < j) return true;
  return false;
}

void drop_nodes(Graph& g, const std::vector<bool>& drop) {
  std::vector<Node> kept;
  for (size_t k = 0; k < g.nodes.size(); ++k)
    if (!drop[k]) kept.push_back(std::move(g.nodes[k]));
  g.nodes = std::move(kept);
}

bool internal_once(const Graph& g, const BufferUses& u, const TensorRef& r) {
  return g.buffers[r.buffer].kind == BufferKind::Internal && u.writers[r.buffer].size() == 1;
}

bool is_plain_cast_of(const Graph& g, const BufferUses& u, int k, const TensorRef& src) {
  if (k < 0 || k >= int(g.nodes.size())) return false;
  const Node& c = g.nodes[size_t(k)];
  if (c.op != OpKind::Copy || c.in_place || c.kernel || c.inputs.size() != 1 || !c.inputs[0] ||
      !same_ref(*c.inputs[0], src) || c.outputs.size() != 1)
    return false;
  const TensorRef& out = c.outputs[0];
  return out.shape == src.shape && is_contiguous(out) && internal_once(g, u, out);
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

int later_16bit_cast(const Graph& g, const BufferUses& u, const TensorRef& out) {
  for (int k : u.readers[out.buffer])
    if (is_plain_cast_of(g, u, k, out) && is_16bit(g.nodes[size_t(k)].outputs[0].dtype) &&
        u.touches[g.nodes[size_t(k)].outputs[0].buffer].front() == k)
      return k;
  return -1;
}

std::optional<GradientWrite> gradient_write(const Node& c) {
  const bool copy = c.op == OpKind::Copy && !c.in_place && c.inputs.size() == 1;
  const bool add = c.op == OpKind::Add && c.in_place && c.inputs.size() == 2 && c.inputs[0] &&
                   same_ref(*c.inputs[0], c.outputs[0]);
  if (c.kernel || !(copy || add) || !c.inputs.back()) return std::nullopt;
  return GradientWrite{&*c.inputs.back(), add};
}

bool may_write_gradient_early(const BufferUses& u, const TensorRef& z, int i, int j, bool add) {
  if (u.touched_between(z.buffer, i, j)) return false;
  return add || u.touches[z.buffer].front() == j;  // a copy must create the gradient
}

void eliminate_dead_code(Graph& g, PassStats& stats) {
  std::vector<bool> read_later(g.buffers.size(), false);
  for (const TensorRef& r : g.outputs) read_later[r.buffer] = true;
  std::vector<bool> keep(g.nodes.size(), true);
  for (size_t i = g.nodes.size(); i-- > 0;) {
    const Node& n = g.nodes[i];
    bool dead = !n.outputs.empty();
    for (const TensorRef& r : n.outputs)
      dead = dead && g.buffers[r.buffer].kind == BufferKind::Internal && !read_later[r.buffer];
    if (dead) {
      keep[i] = false;
      ++stats.dead;
      continue;
    }
    for (const auto& r : n.inputs)
      if (r) read_later[r->buffer] = true;
  }
  std::vector<Node> kept;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (keep[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
}

void fold_constants(Graph& g, PassStats& stats) {
  std::vector<int> writers(g.buffers.size(), 0);
  for (const Node& n : g.nodes)
    for (const TensorRef& r : n.outputs) writers[r.buffer] += 1;
  std::vector<bool> constant(g.buffers.size(), false);
  std::vector<Node> kept;
  for (Node& n : g.nodes) {
    bool foldable = !n.in_place && !n.kernel && !n.outputs.empty();
    for (const auto& r : n.inputs) foldable = foldable && (!r || constant[r->buffer]);
    for (const TensorRef& r : n.outputs)
      foldable = foldable && g.buffers[r.buffer].kind == BufferKind::Internal && writers[r.buffer] == 1;
    if (!foldable) {
      kept.push_back(std::move(n));
      continue;
    }
    // Give the outputs memory of their own, run the node once, keep the results as constants.
    std::vector<Tensor> in, out;
    for (const TensorRef& r : n.outputs) {
      Buffer& b = g.buffers[r.buffer];
      b.storage = std::make_shared<Storage>(std::max<size_t>(b.nbytes, 1), b.device);
      b.kind = BufferKind::External;
      constant[r.buffer] = true;
      out.push_back(view_of(b.storage, 0, r));
    }
    for (const auto& r : n.inputs) in.push_back(r ? view_of(g.buffers[r->buffer].storage, 0, *r) : Tensor());
    run_kernel(n.op, in, out, n.attrs);
    ++stats.folded;
  }
  g.nodes = std::move(kept);
}

}  // namespace reel::compile

namespace reel::compile {

namespace {

std::string ref_key(const TensorRef& r, const std::vector<int>& version) {
  return ref_str(r) + "@" + std::to_string(version[r.buffer]) + "/" + shape_str(r.strides);
}

}  // namespace

void eliminate_common_subexpressions(Graph& g, PassStats& stats) {
  std::vector<int> version(g.buffers.size(), 0), writers(g.buffers.size(), 0), remap(g.buffers.size());
  for (size_t b = 0; b < remap.size(); ++b) remap[b] = int(b);
  for (const Node& n : g.nodes)
    for (const TensorRef& r : n.outputs) writers[r.buffer] += 1;
  std::unordered_map<std::string, size_t> seen;  // key -> index in `kept`
  std::vector<Node> kept;
  for (Node& n : g.nodes) {
    for (auto& r : n.inputs)
      if (r) r->buffer = remap[r->buffer];
    for (TensorRef& r : n.outputs) r.buffer = remap[r.buffer];
    bool pure = !n.in_place && !n.kernel && !n.outputs.empty();
    for (const TensorRef& r : n.outputs)
      pure = pure && g.buffers[r.buffer].kind == BufferKind::Internal && writers[r.buffer] == 1;
    std::string key;
    if (pure) {
      key = std::string(op_name(n.op)) + "|" + n.attrs.str();
      for (const auto& r : n.inputs) key += "|" + (r ? ref_key(*r, version) : std::string("-"));
      for (const TensorRef& r : n.outputs)  // the geometry, not the buffer: that is what differs
        key += "|" + shape_str(r.shape) + dtype_name(r.dtype) + shape_str(r.strides) + "+" + std::to_string(r.offset);
      auto it = seen.find(key);
      if (it != seen.end()) {
        const Node& first = kept[it->second];
        bool same_size = true;
        for (size_t k = 0; k < n.outputs.size(); ++k)
          same_size = same_size && g.buffers[n.outputs[k].buffer].nbytes == g.buffers[first.outputs[k].buffer].nbytes;
        if (same_size) {
          for (size_t k = 0; k < n.outputs.size(); ++k) remap[n.outputs[k].buffer] = first.outputs[k].buffer;
          ++stats.deduplicated;
          continue;
        }
      }
    }
    for (const TensorRef& r : n.outputs) version[r.buffer] += 1;
    if (pure) seen[key] = kept.size();
    kept.push_back(std::move(n));
  }
  for (TensorRef& r : g.outputs) r.buffer = remap[r.buffer];
  g.nodes = std::move(kept);
}

}  // namespace reel::compile
