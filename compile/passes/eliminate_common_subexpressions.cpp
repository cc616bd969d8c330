// Common subexpressions: a node that repeats an earlier one — same op, attrs and input refs, none of
// whose inputs was written in between (autocast's cast of each weight, once per micro-batch) — is
// dropped and its outputs read from the first's.
#include <string>
#include <unordered_map>
#include <vector>

#include "compile/passes/passes.h"

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
    bool pure = !n.in_place && !n.outputs.empty();
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
