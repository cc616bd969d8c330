// Recomputation for a memory limit: activations dropped after the forward and computed again where
// the backward reads them, as torch.utils.checkpoint and Inductor's min-cut partitioner do, chosen
// by the planner rather than by hand.
//
// The pattern. Buffer B is written by node p and read early (the forward, up to the step's busiest
// node t) and late (the backward, after t), so it is live across t. If every input of p is live at
// B's first late reader q anyway (a parameter, or an activation the backward keeps for itself) and
// nothing writes those inputs between p and q, a clone of p placed just before q writes B again into a
// fresh buffer B', the late readers read B', and B dies after its last early reader: t holds B's
// bytes less. An input that is not live at q can itself be recomputed first (its producer cloned
// before p's clone), up to a chain of kMaxChain nodes: whole blocks, a GEMM and the norm before it.
//
// What may be cloned: nodes that are pure functions of their inputs (casts, elementwise and fused
// elementwise ops, the norms but batch norm, whose training forward updates its running statistics,
// GEMMs and convolutions that do not accumulate into their output, attention, pooling, softmax); not
// random ops, not in-place nodes, not the optimizer's. A clone is the same kernel on the same input
// values, so it writes the same bits: a step with recomputation equals the step without it, to the
// bit, wherever the plan runs.
//
// The choice, greedy: while the step's live bytes at its busiest node exceed the limit, take among
// the buffers live there that can be recomputed the one whose chain adds the fewest FLOPs per byte
// it frees (a cast or an elementwise op about one per element, a GEMM hundreds), apply it, and keep
// it only if the busiest node then holds less and no node more than the busiest held. Live bytes are
// counted over the memory plan's lifetimes (memory_plan.h); the arena the plan then places is at
// least that, usually within a few percent.
#include <algorithm>
#include <set>

#include "compile/passes/memory_plan.h"
#include "compile/passes/passes.h"
#include "compile/passes/pattern.h"
#include "compile/passes/step_cost.h"
#include "kernels/fused_expr.h"
#include "tensor/error.h"
#include "tensor/log.h"

namespace reel::compile {

namespace {

constexpr int kMaxChain = 6;

enum class Cost { None, Cheap, Costly };

Cost clone_cost(const Node& n) {
  if (n.in_place || is_random_op(n.op)) return Cost::None;
  // A kernel that also writes column sums (a bias gradient): a clone would write them again.
  if (n.op == OpKind::FusedElementwise && fused_column_sums_of(n.attrs).on()) return Cost::None;
  for (const std::string& f : n.fused)  // a fused kernel that draws random numbers (a dropout's mask)
    if (f.find("dropout") != std::string::npos || f.find("rand") != std::string::npos) return Cost::None;
  switch (n.op) {
    case OpKind::Copy: case OpKind::FusedElementwise:
    case OpKind::Neg: case OpKind::Exp: case OpKind::Log: case OpKind::Sqrt: case OpKind::Rsqrt:
    case OpKind::Abs: case OpKind::Tanh: case OpKind::Sigmoid: case OpKind::Relu: case OpKind::Gelu:
    case OpKind::GeluErf: case OpKind::Silu: case OpKind::PowScalar: case OpKind::AddScalar:
    case OpKind::MulScalar: case OpKind::Add: case OpKind::Sub: case OpKind::Mul: case OpKind::Div:
    case OpKind::Where: case OpKind::MaskedFill:
    case OpKind::LayerNorm: case OpKind::LayerNormCast: case OpKind::GroupNorm:
      return Cost::Cheap;
    case OpKind::Matmul: case OpKind::GemmEpilogue: case OpKind::Conv2d: case OpKind::Attention:
    case OpKind::AttentionCast: case OpKind::MaxPool2d: case OpKind::AvgPool2d: case OpKind::Softmax:
    case OpKind::MaskedSoftmax: case OpKind::Concat:
      return Cost::Costly;
    default:
      return Cost::None;
  }
}

// Lifetimes as the memory plan has them (memory_plan.h's buffer_lifetimes), by buffer id.
using Lifetimes = std::vector<Placement>;

// The live bytes of Internal buffers on `device` at each node, and the busiest node (the first of
// equals: a step of ACCUM micro-batches has as many).
struct LiveProfile {
  std::vector<size_t> live;
  size_t peak = 0;
  int at = -1;
};

LiveProfile live_profile(const Graph& g, const Lifetimes& l, const Device& device) {
  std::vector<int64_t> delta(g.nodes.size() + 2, 0);
  for (size_t b = 0; b < g.buffers.size(); ++b) {
    const Buffer& buf = g.buffers[b];
    if (buf.kind != BufferKind::Internal || l[b].first < 0 || !(buf.device == device)) continue;
    delta[l[b].first] += int64_t(buf.nbytes);
    delta[l[b].last + 1] -= int64_t(buf.nbytes);
  }
  LiveProfile p;
  int64_t live = 0;
  p.live.resize(g.nodes.size() + 1);
  for (size_t i = 0; i <= g.nodes.size(); ++i) {
    live += delta[i];
    p.live[i] = size_t(live);
    if (size_t(live) > p.peak) p.peak = size_t(live), p.at = int(i);
  }
  return p;
}

// A recomputation: the nodes to clone, in order (producers first), placed before node `before`, and
// the buffer whose late readers move to the last clone's output.
struct Candidate {
  int buffer = -1, before = -1;
  std::vector<int> chain;  // node indices of the original graph, producers first
  Cost cost = Cost::Cheap;
  double flops = 0;        // what the chain's clones add (node_flops, step_cost.h)
};

class Planner {
 public:
  Planner(const Graph& g, const Lifetimes& life) : g_(g), uses_(buffer_uses(g)), life_(life) {}

  // The chain that writes buffer b again before node q, or nothing.
  std::optional<Candidate> candidate(int b, int t) const {
    const Buffer& buf = g_.buffers[b];
    if (buf.kind != BufferKind::Internal || uses_.writers[b].size() != 1) return std::nullopt;
    const std::vector<int>& readers = uses_.readers[b];
    auto late = std::upper_bound(readers.begin(), readers.end(), t);
    if (late == readers.end() || *late >= int(g_.nodes.size())) return std::nullopt;  // no late reader, or an output
    if (std::find(readers.begin(), readers.end(), t) != readers.end()) return std::nullopt;
    Candidate c{b, *late, {}, Cost::Cheap};
    std::set<int> chained;
    if (!add_producer(b, c.before, c, chained, 0)) return std::nullopt;
    return c;
  }

 private:
  // Appends the producer of buffer b (and, first, of any input not live at q) to c.chain.
  bool add_producer(int b, int q, Candidate& c, std::set<int>& chained, int depth) const {
    if (depth >= kMaxChain || uses_.writers[b].size() != 1) return false;
    const int p = uses_.writers[b].front();
    if (chained.count(p)) return true;
    const Node& n = g_.nodes[p];
    const Cost cost = clone_cost(n);
    if (cost == Cost::None) return false;
    for (const TensorRef& o : n.outputs)  // the clone writes whole buffers of its own
      if (o.offset != 0 || o.nbytes() != g_.buffers[o.buffer].nbytes || uses_.writers[o.buffer].size() != 1)
        return false;
    for (const auto& r : n.inputs) {
      if (!r) continue;
      const int in = r->buffer;
      // Its value at q must still be the one p read: nothing writes it in between.
      for (int w : uses_.writers[in])
        if (w > p && w < q) return false;
      const Buffer& ib = g_.buffers[in];
      const bool live_at_q = ib.kind != BufferKind::Internal || life_[in].last >= q;
      if (!live_at_q && !add_producer(in, q, c, chained, depth + 1)) return false;
    }
    chained.insert(p);
    c.chain.push_back(p);
    c.flops += node_flops(n);
    if (cost == Cost::Costly) c.cost = Cost::Costly;
    return true;
  }

  const Graph& g_;
  BufferUses uses_;
  const Lifetimes& life_;
};

// g with the candidate applied: the chain's clones before node c.before, late readers of c.buffer
// (and of the chain's other outputs) reading the clones' outputs.
Graph apply(const Graph& g, const Candidate& c) {
  Graph out = g;
  std::vector<int> fresh(g.buffers.size(), -1);  // original buffer -> its clone's buffer
  std::vector<Node> clones;
  for (int p : c.chain) {
    Node n = g.nodes[p];
    for (auto& r : n.inputs)
      if (r && fresh[r->buffer] >= 0) r->buffer = fresh[r->buffer];
    for (TensorRef& o : n.outputs) {
      Buffer b = g.buffers[o.buffer];
      b.id = int(out.buffers.size());
      b.storage.reset();
      b.released_after = -1;
      fresh[o.buffer] = b.id;
      o.buffer = b.id;
      out.buffers.push_back(std::move(b));
    }
    n.recomputed = true;
    clones.push_back(std::move(n));
  }
  // Readers from c.before on read the clones' outputs.
  for (size_t i = size_t(c.before); i < out.nodes.size(); ++i)
    for (auto& r : out.nodes[i].inputs)
      if (r && fresh[r->buffer] >= 0) r->buffer = fresh[r->buffer];
  out.nodes.insert(out.nodes.begin() + c.before, clones.begin(), clones.end());
  return out;
}

}  // namespace

void recompute_to_fit(Graph& g, size_t limit, PassStats& stats) {
  std::vector<Device> devices;
  for (const Buffer& b : g.buffers)
    if (b.kind == BufferKind::Internal &&
        std::none_of(devices.begin(), devices.end(), [&](const Device& d) { return d == b.device; }))
      devices.push_back(b.device);
  for (const Device& device : devices) {
    LiveProfile now = live_profile(g, buffer_lifetimes(g), device);
    stats.recompute_live_before = std::max(stats.recompute_live_before, now.peak);
    for (int round = 0; now.peak > limit && round < 4096; ++round) {
      const Lifetimes life = buffer_lifetimes(g);
      const Planner planner(g, life);
      // The Internal buffers live at the busiest node, largest first.
      std::vector<int> live;
      for (size_t b = 0; b < g.buffers.size(); ++b)
        if (g.buffers[b].kind == BufferKind::Internal && g.buffers[b].device == device && life[b].first >= 0 &&
            life[b].first < now.at && life[b].last > now.at)
          live.push_back(int(b));
      std::stable_sort(live.begin(), live.end(),
                       [&](int a, int b) { return g.buffers[a].nbytes > g.buffers[b].nbytes; });
      std::vector<Candidate> tries;
      for (int b : live)
        if (auto c = planner.candidate(b, now.at)) tries.push_back(*c);
      // Fewest FLOPs per byte the busiest node sheds first: a cast or an elementwise op costs about
      // an operation per element, a GEMM hundreds.
      auto per_byte = [&](const Candidate& c) {
        return c.flops / double(std::max<size_t>(g.buffers[c.buffer].nbytes, 1));
      };
      std::stable_sort(tries.begin(), tries.end(),
                       [&](const Candidate& a, const Candidate& b) { return per_byte(a) < per_byte(b); });
      bool applied = false;
      for (const Candidate& c : tries) {
        Graph next = apply(g, c);
        // Kept when the busiest node holds less and no node holds more than it did (the clones go
        // after the busiest node, so its index is the same in both graphs). Each of the ACCUM
        // micro-batches has its own busiest node of the same size: the peak falls once all have.
        const LiveProfile after = live_profile(next, buffer_lifetimes(next), device);
        if (after.peak > now.peak || after.live[now.at] >= now.live[now.at]) continue;
        for (int p : c.chain) stats.recomputed.push_back(op_name(g.nodes[p].op));
        stats.recompute_flops += c.flops;
        if (log_enabled("memory"))
          log_line("memory", detail::cat("recompute: b", c.buffer, " (", g.buffers[c.buffer].nbytes, " bytes) from ",
                                         c.chain.size(), " node(s) before k", c.before, ": live bytes at k", now.at, " ",
                                         now.live[now.at], " -> ", after.live[now.at], ", peak ", after.peak));
        g = std::move(next);
        now = after;
        applied = true;
        break;
      }
      if (!applied) break;
    }
    stats.recompute_live_after = std::max(stats.recompute_live_after, now.peak);
  }
}

}  // namespace reel::compile
