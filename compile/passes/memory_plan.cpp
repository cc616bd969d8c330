// Memory planning (see memory_plan.h).
#include "compile/passes/memory_plan.h"

#include <algorithm>

#include "compile/passes/side_stream.h"

namespace reel::compile {

namespace {

size_t align_up(size_t n) { return (n + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

}  // namespace

std::vector<Placement> buffer_lifetimes(const Graph& g) {
  std::vector<Placement> life(g.buffers.size());
  for (size_t b = 0; b < g.buffers.size(); ++b) {
    life[b].buffer = int(b);
    life[b].first = -1;
    life[b].nbytes = align_up(g.buffers[b].nbytes);
  }
  auto touch = [&](int buffer, int at) {
    Placement& p = life[buffer];
    if (p.first < 0) p.first = at;
    p.first = std::min(p.first, at);
    p.last = std::max(p.last, at);
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (const auto& r : g.nodes[i].inputs)
      if (r) touch(r->buffer, int(i));
    for (const auto& r : g.nodes[i].outputs) touch(r.buffer, int(i));
  }
  for (const TensorRef& r : g.outputs) touch(r.buffer, int(g.nodes.size()));
  // A node on the side stream may still run until its join: its buffers live until the node before it.
  const std::vector<int> joins = side_joins(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (joins[i] < 0) continue;
    const int until = std::max(int(i), joins[i] - 1);
    for (const auto& r : g.nodes[i].inputs)
      if (r) touch(r->buffer, until);
    for (const auto& r : g.nodes[i].outputs) touch(r.buffer, until);
  }
  return life;
}

namespace {

bool overlaps(const Placement& a, const Placement& b) { return a.first <= b.last && b.first <= a.last; }

// Lowest offset where `p` fits beside every placed buffer whose lifetime overlaps its own. `placed`
// is kept in order of [offset, offset + nbytes), so the overlapping ones come in that order without a
// sort of their own (the side_stream pass plans a step's memory once per trial placement).
size_t lowest_fit(const Placement& p, const std::vector<Placement>& placed) {
  size_t at = 0;
  for (const Placement& q : placed) {
    if (!overlaps(p, q)) continue;
    if (q.offset >= at + p.nbytes) break;  // the gap before this one fits
    at = std::max(at, q.offset + q.nbytes);
  }
  return at;
}

// Inserts p into `placed` at its place in that order.
void insert_placed(std::vector<Placement>& placed, const Placement& p) {
  const auto key = [](const Placement& q) { return std::pair(q.offset, q.offset + q.nbytes); };
  const auto at = std::upper_bound(placed.begin(), placed.end(), p,
                                   [&](const Placement& a, const Placement& b) { return key(a) < key(b); });
  placed.insert(at, p);
}

}  // namespace

namespace {

// +size at a buffer's first node, -size after its last: the running sum's maximum.
size_t peak_of(std::vector<std::pair<int, int64_t>> events) {
  std::sort(events.begin(), events.end());
  int64_t live = 0, peak = 0;
  for (const auto& [at, delta] : events) {
    // A planned candidate can be absurd (an effective batch of 2^62 items): its sum must not wrap.
    REEL_CHECK(!__builtin_add_overflow(live, delta, &live), "memory plan: more than 2^63 bytes live at once");
    peak = std::max(peak, live);
  }
  return size_t(peak);
}

}  // namespace

BusiestMoment busiest_moment(const Arena& arena) {
  // Sweep the node indices where lifetimes begin: the live sum only rises there.
  BusiestMoment best;
  for (const Placement& start : arena.placements) {
    size_t bytes = 0;
    for (const Placement& p : arena.placements)
      if (p.first <= start.first && start.first <= p.last) bytes += p.nbytes;
    if (bytes > best.bytes || (bytes == best.bytes && start.first < best.node)) {
      best.bytes = bytes;
      best.node = start.first;
    }
  }
  for (size_t i = 0; i < arena.placements.size(); ++i) {
    const Placement& p = arena.placements[i];
    if (best.node >= 0 && p.first <= best.node && best.node <= p.last) best.live.push_back(i);
  }
  return best;
}

size_t eager_peak_bytes(const Graph& g, Device device, const std::function<size_t(size_t)>& block) {
  std::vector<int> first(g.buffers.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    auto see = [&](int id) {
      if (first[id] < 0) first[id] = int(i);
    };
    for (const auto& r : g.nodes[i].inputs)
      if (r) see(r->buffer);
    for (const TensorRef& r : g.nodes[i].outputs) see(r.buffer);
  }
  const int end = int(g.nodes.size());
  std::vector<std::pair<int, int64_t>> events;
  for (const Buffer& b : g.buffers) {
    if (b.kind != BufferKind::Internal || b.device != device || first[b.id] < 0) continue;
    const int64_t bytes = int64_t(block(b.nbytes));
    events.push_back({2 * first[b.id], bytes});
    events.push_back({2 * (b.released_after < 0 ? end : std::max(b.released_after, first[b.id])) + 1, -bytes});
  }
  return peak_of(std::move(events));
}

const Arena* MemoryPlan::arena_for(Device d) const {
  for (const Arena& a : arenas)
    if (a.device == d) return &a;
  return nullptr;
}

MemoryPlan plan_memory(const Graph& g) {
  std::vector<Placement> life = buffer_lifetimes(g);
  MemoryPlan plan;
  for (const Buffer& b : g.buffers) {
    if (b.kind != BufferKind::Internal || life[b.id].first < 0) continue;
    auto it = std::find_if(plan.arenas.begin(), plan.arenas.end(), [&](const Arena& a) { return a.device == b.device; });
    if (it == plan.arenas.end()) {
      plan.arenas.push_back(Arena{b.device, 0, 0, {}});
      it = plan.arenas.end() - 1;
    }
    it->placements.push_back(life[b.id]);
  }
  for (Arena& a : plan.arenas) {
    // Largest first (ties: earlier first), so big activations claim the bottom of the arena.
    std::sort(a.placements.begin(), a.placements.end(), [](const Placement& x, const Placement& y) {
      return x.nbytes != y.nbytes ? x.nbytes > y.nbytes : x.first < y.first;
    });
    std::vector<Placement> placed;
    placed.reserve(a.placements.size());
    for (Placement p : a.placements) {
      p.offset = lowest_fit(p, placed);
      a.bytes = std::max(a.bytes, p.offset + p.nbytes);
      a.unplanned_bytes += p.nbytes;
      insert_placed(placed, p);
    }
    std::sort(placed.begin(), placed.end(), [](const Placement& x, const Placement& y) { return x.buffer < y.buffer; });
    a.placements = std::move(placed);
  }
  return plan;
}

size_t planned_peak(const Graph& g) {
  size_t bytes = 0;
  for (const Arena& a : plan_memory(g).arenas) bytes += a.bytes;
  return bytes;
}

}  // namespace reel::compile
