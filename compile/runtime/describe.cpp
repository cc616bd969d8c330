// Plan descriptions (see describe.h).
#include "compile/runtime/describe.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

namespace reel::compile {

std::string bytes_str(size_t bytes) {
  char buf[64];
  if (bytes >= (size_t(1) << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1 << 30));
  else if (bytes >= (size_t(1) << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(1 << 20));
  else if (bytes >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", double(bytes) / 1024.0);
  else std::snprintf(buf, sizeof buf, "%zu B", bytes);
  return buf;
}

std::string fused_str(const std::vector<std::string>& ops, const char* sep) {
  std::string out;
  for (size_t k = 0; k < ops.size();) {
    size_t j = k;
    while (j < ops.size() && ops[j] == ops[k]) ++j;
    out += (k ? sep : "") + ops[k];
    if (j - k > 1) out += " x" + std::to_string(j - k);
    k = j;
  }
  return out;
}

std::string plan_summary(const Plan& p) {
  const Graph& g = p.graph();
  size_t kinds[3] = {0, 0, 0};
  for (const Buffer& b : g.buffers) kinds[int(b.kind)] += 1;
  std::ostringstream os;
  os << "plan (" << mode_name(p.mode()) << "): " << p.kernels() << " kernels, " << g.buffers.size() << " buffers ("
     << kinds[int(BufferKind::Input)] << " inputs, " << kinds[int(BufferKind::External)] << " external, "
     << kinds[int(BufferKind::Internal)] << " internal), " << g.outputs.size() << " outputs";
  if (p.mode() != Mode::Default) os << ", " << p.host_nodes().size() << " kernels outside CUDA graphs";
  return os.str();
}

namespace {

// What the arena holds at its busiest node, grouped by the op that wrote each buffer and its dtype,
// largest group first: "k812 holds 901.0 MiB: 24 x matmul+add f32 = 288.0 MiB, ...".
std::string peak_breakdown(const Graph& g, const Arena& a, size_t max_groups = 12) {
  const BusiestMoment m = busiest_moment(a);
  if (m.node < 0) return "";
  struct Group {
    size_t count = 0, bytes = 0;
  };
  std::map<std::string, Group> groups;
  for (size_t i : m.live) {
    const Placement& p = a.placements[i];
    const Node& writer = g.nodes[size_t(p.first)];
    DType dtype = DType::f32;
    for (const TensorRef& r : writer.outputs)
      if (r.buffer == p.buffer) dtype = r.dtype;
    const std::string label = (writer.fused.empty() ? std::string(op_name(writer.op)) : fused_str(writer.fused, "+")) +
                              (writer.recomputed ? " (recomputed)" : "") + " " + dtype_name(dtype);
    groups[label].count += 1;
    groups[label].bytes += p.nbytes;
  }
  std::vector<std::pair<std::string, Group>> sorted(groups.begin(), groups.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) { return x.second.bytes > y.second.bytes; });
  std::ostringstream os;
  os << "\n    busiest at k" << m.node << ": " << bytes_str(m.bytes) << " live in " << m.live.size()
     << " buffers, by writer and dtype:";
  for (size_t k = 0; k < sorted.size() && k < max_groups; ++k)
    os << "\n      " << sorted[k].second.count << " x " << sorted[k].first << " = " << bytes_str(sorted[k].second.bytes);
  if (sorted.size() > max_groups) os << "\n      ... " << sorted.size() - max_groups << " more groups";
  return os.str();
}

}  // namespace

std::string memory_summary(const Plan& p) {
  const Graph& g = p.graph();
  std::ostringstream os;
  os << "memory plan:";
  for (const Arena& a : p.memory().arenas) {
    os << "\n  " << a.device.str() << ": arena " << bytes_str(a.bytes) << " (planned peak of " << a.placements.size()
       << " internal buffers; " << bytes_str(a.unplanned_bytes) << " without reuse)";
    os << peak_breakdown(g, a);
  }
  size_t ext = 0, in = 0;
  for (const Buffer& b : g.buffers) {
    if (b.kind == BufferKind::External) ext += b.nbytes;
    if (b.kind == BufferKind::Input) in += b.nbytes;
  }
  os << "\n  external (parameters, state, constants): " << bytes_str(ext) << "; inputs: " << bytes_str(in);
  return os.str();
}

std::string plan_listing(const Plan& p, size_t max_kernels) {
  const Graph& g = p.graph();
  std::ostringstream os;
  for (size_t i = 0; i < g.nodes.size() && i < max_kernels; ++i) {
    const Node& n = g.nodes[i];
    size_t bytes = 0;
    os << "  k" << i << " " << op_name(n.op);
    if (!n.fused.empty()) os << " [fused: " << fused_str(n.fused, " ") << "]";
    if (n.recomputed) os << " (recomputed)";
    if (n.stream == 1) os << " (side stream)";
    if (n.stream == kAheadStream) os << " (side stream 2: run ahead)";
    os << "  in:";
    for (const auto& r : n.inputs) {
      if (!r) continue;
      os << " " << ref_str(*r);
      bytes += r->nbytes();
    }
    os << "  out:";
    for (const TensorRef& r : n.outputs) {
      os << " " << ref_str(r);
      bytes += r.nbytes();
    }
    os << "  (" << bytes_str(bytes) << " moved at least)\n";
  }
  if (g.nodes.size() > max_kernels) os << "  ... " << g.nodes.size() - max_kernels << " more kernels\n";
  return os.str();
}

std::string plan_dot(const Plan& p) {
  const Graph& g = p.graph();
  std::ostringstream os;
  os << "digraph plan {\n  rankdir=TB;\n  node [fontname=\"monospace\", fontsize=10];\n";
  for (const Buffer& b : g.buffers) {
    const char* color = b.kind == BufferKind::Internal ? "lightblue" : b.kind == BufferKind::Input ? "palegreen" : "khaki";
    os << "  b" << b.id << " [shape=ellipse, style=filled, fillcolor=" << color << ", label=\"b" << b.id << " "
       << buffer_kind_name(b.kind) << "\\n" << bytes_str(b.nbytes) << "\"];\n";
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    os << "  k" << i << " [shape=box, label=\"k" << i << " " << op_name(n.op) << "\"];\n";
    for (const auto& r : n.inputs)
      if (r) os << "  b" << r->buffer << " -> k" << i << ";\n";
    for (const TensorRef& r : n.outputs) os << "  k" << i << " -> b" << r.buffer << ";\n";
  }
  os << "}\n";
  return os.str();
}

std::string recompute_summary(const Plan& p, size_t limit) {
  const PassStats& st = p.stats();
  if (limit == 0 && st.recomputed.empty()) return "";
  std::map<std::string, size_t> by_op;
  for (const std::string& op : st.recomputed) ++by_op[op];
  std::ostringstream out;
  out << "recompute (limit " << bytes_str(limit) << "): ";
  if (st.recomputed.empty()) {
    out << "nothing (the step's live peak, " << bytes_str(st.recompute_live_before)
        << (st.recompute_live_before <= limit ? ", fits)" : ", has no buffer the planner can recompute at its busiest node)");
    return out.str();
  }
  out << st.recomputed.size() << " nodes cloned into the backward (";
  bool first = true;
  for (const auto& [op, n] : by_op) out << (first ? "" : ", ") << n << " x " << op, first = false;
  char flops[64];
  std::snprintf(flops, sizeof flops, "%.3f", st.recompute_flops / 1e9);
  out << "); live peak " << bytes_str(st.recompute_live_before) << " -> " << bytes_str(st.recompute_live_after)
      << (st.recompute_live_after > limit ? " (above the limit: nothing more the planner can recompute helps)" : "")
      << "; about " << flops << " GFLOP more per step";
  return out.str();
}

}  // namespace reel::compile
