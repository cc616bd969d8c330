// Graph passes, run on a trace before its memory is planned (compile/plan.h):
//   dead-code elimination  a node whose every output is an Internal buffer that nothing later reads
//                          (and that is not a graph output) is dropped, iterated to a fixed point;
//   constant folding       a node with no inputs, or only constant ones, whose outputs are Internal
//                          buffers written by no other node (position ids, causal masks, their casts)
//                          runs once at build time; its outputs become External constants;
//   common subexpressions  a node that repeats an earlier one — same op, attrs and input refs, none
//                          of whose inputs was written in between (autocast's cast of each weight,
//                          once per micro-batch) — is dropped and its outputs read from the first's;
//   elementwise fusion     (compile/fuse_elementwise.h) chains of elementwise nodes become one kernel.
#pragma once
#include <optional>
#include <cstddef>
#include <vector>

#include "compile/graph.h"

namespace reel::compile {

struct PassStats {
  size_t traced = 0;  // nodes as traced
  size_t dead = 0;    // removed by dead-code elimination
  size_t folded = 0;  // run once at build time
  size_t deduplicated = 0;  // common subexpressions removed
  size_t fused = 0;   // nodes merged into fused kernels (a chain of k nodes counts k - 1)
  size_t kernels = 0; // nodes left: kernels per replay
};

// Who touches each buffer, in graph order (node indices), for the fusion passes' safety checks. A
// graph output counts as a reader at index nodes.size().
struct BufferUses {
  std::vector<std::vector<int>> readers, writers, touches;
  int producer(int buffer) const { return writers[buffer].empty() ? -1 : writers[buffer].back(); }
  // Whether a node strictly between i and j reads or writes the buffer.
  bool touched_between(int buffer, int i, int j) const;
};
BufferUses buffer_uses(const Graph& g);
// Drops the nodes marked in `drop`, keeping the others in order.
void drop_nodes(Graph& g, const std::vector<bool>& drop);
// The loop of a pass that merges nodes into earlier ones: visit(i, drop) for each node i not yet
// marked, in graph order (it may rewrite node i and mark later or earlier nodes in `drop`); then the
// marked nodes go.
template <typename Visit>
void fuse_each(Graph& g, Visit visit) {
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!drop[i]) visit(i, drop);
  drop_nodes(g, drop);
}
// An Internal buffer written by exactly one node.
bool internal_once(const Graph& g, const BufferUses& u, const TensorRef& r);
// bf16 or f16: the compute dtypes of autocast.
inline bool is_16bit(DType d) { return d == DType::bf16 || d == DType::f16; }
// Node k as a plain cast (a copy no pass has given a kernel) of all of src into a contiguous Internal
// buffer of src's shape written only there. Which dtype it casts to is for the caller to check.
bool is_plain_cast_of(const Graph& g, const BufferUses& u, int k, const TensorRef& src);
// The node that alone reads z's buffer, reading it once (not a graph output): its index, or -1.
int sole_reader(const Graph& g, const BufferUses& u, const TensorRef& z);
// A ref with its leading dims folded into rows, (..., C) -> (rows, C), when its strides allow: how
// a GEMM node's batched operand or result is handed to a 2-D GEMM kernel.
std::optional<TensorRef> as_matrix(const TensorRef& r);
// The tensor r is in the traced step's memory, or a meta stand-in of its geometry where a pass made
// the buffer: what a pass hands a kernel's support query, which looks at shapes, layouts and
// alignment only, never at values.
Tensor traced(const Graph& g, const TensorRef& r);
// A later cast of `out` to 16 bits (autocast's cast for a GEMM), with out's own geometry, into a
// contiguous Internal buffer that nothing touches before it: the cast's node index, or -1. The fusion
// passes fold such a cast into the kernel that produces `out`.
int later_16bit_cast(const Graph& g, const BufferUses& u, const TensorRef& out);

// Node c as AccumulateGrad's write into a parameter's gradient: the copy that creates it (the first
// micro-batch) or the in-place add (params +=, the later ones), neither given a kernel yet. `source`
// is what it puts there; nullopt otherwise.
struct GradientWrite {
  const TensorRef* source;
  bool add;
};
std::optional<GradientWrite> gradient_write(const Node& c);
// Whether the producer at node i may write (or add to) the gradient z that node j writes, so that j
// can go: nothing touches z between them, and a copy j creates z.
bool may_write_gradient_early(const BufferUses& u, const TensorRef& z, int i, int j, bool add);

void eliminate_dead_code(Graph& g, PassStats& stats);
void fold_constants(Graph& g, PassStats& stats);
void eliminate_common_subexpressions(Graph& g, PassStats& stats);

}  // namespace reel::compile
