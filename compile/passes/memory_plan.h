// Memory planning: every Internal buffer of a graph gets an offset in one arena per device, chosen
// so that two buffers share bytes only when their lifetimes do not overlap.
//
// Lifetime of a buffer: [first node that touches it, last node that touches it] in graph order; the
// graph's outputs live to the end (they are copied out after the step); the buffers of a node on the
// side stream, to the node before the main stream waits for it (side_stream.h). Placement is greedy, largest
// buffer first: each takes the lowest 256-byte-aligned offset free over its whole lifetime (the
// classic offset assignment of static memory planners). The arena's size is the planned peak of
// the step's own memory; kernels' scratch (cuBLAS/cuDNN workspaces, contiguous copies) comes on top
// from the caching allocator.
#pragma once
#include <functional>
#include <vector>

#include "compile/ir/graph.h"

namespace reel::compile {

struct Placement {
  int buffer = -1;
  size_t offset = 0, nbytes = 0;
  int first = 0, last = 0;  // node indices, inclusive
};

struct Arena {
  Device device;
  size_t bytes = 0;          // planned peak: the arena's size
  size_t unplanned_bytes = 0;  // the sum of its buffers' sizes: what no reuse would take
  std::vector<Placement> placements;
};

struct MemoryPlan {
  std::vector<Arena> arenas;  // one per device that has Internal buffers
  const Arena* arena_for(Device d) const;
};

constexpr size_t kArenaAlignment = 256;

// Every buffer's lifetime, indexed by buffer id: [first, last] node index of the nodes that read or
// write it (a graph output lives to nodes.size()); first = -1 for a buffer no node touches. nbytes is
// rounded up to kArenaAlignment; offsets are not set.
std::vector<Placement> buffer_lifetimes(const Graph& g);

MemoryPlan plan_memory(const Graph& g);
// The planned peak of the step's own memory: the arenas' bytes, summed over devices. The scheduling
// passes keep it where it was when they move nodes.
size_t planned_peak(const Graph& g);

// The node at which an arena's buffers hold the most bytes at once, and which buffers those are
// (indices into arena.placements). The arena is at least `bytes` big; the difference is fragmentation.
// What `reel plan` breaks down, to show what a step's peak is made of.
struct BusiestMoment {
  int node = -1;
  size_t bytes = 0;
  std::vector<size_t> live;
};
BusiestMoment busiest_moment(const Arena& arena);

// The most bytes the step's buffers hold at once when it runs eagerly: each Internal buffer on `device`
// is its own allocation of block(nbytes) bytes (the allocator's rounding) from its first node to
// Buffer::released_after (the tracer saw the program drop it; -1: to the end), so buffers the
// program holds past their last use (tensors autograd saved for a backward that comes later, a
// caller's variables) count as long as eager execution holds them.
size_t eager_peak_bytes(const Graph& g, Device device, const std::function<size_t(size_t)>& block);

}  // namespace reel::compile
