// Lowering for elementwise fusion: a group of consecutive elementwise nodes that the pass formed
// (compile/passes/fuse_elementwise.cpp) becomes one fused_elementwise node, whose attrs hold the
// group's program (kernels/fused_expr.h): a load of every ref the group reads from memory (once), the
// ops in graph order on registers (a ref the group wrote earlier is its register), a cast for each
// copy, and a store of every written ref that someone after the group still needs (a later reader,
// a graph output, External memory). The fused op's kernels then interpret it (CPU) or compile it
// through NVRTC (CUDA, kernels/jit/): the generation of device code belongs to the op's kernel.
#pragma once
#include <cstddef>
#include <vector>

#include "compile/ir/graph.h"

namespace reel::compile {

// Who reads each buffer, so that a group knows which of its values anyone after it needs.
struct BufferReaders {
  std::vector<int> count;         // reading refs per buffer, over the whole graph
  std::vector<bool> graph_output;
  explicit BufferReaders(const Graph& g);
};

// Nodes [i, j) of g as one fused_elementwise node: fused lists their ops, in_place is any of theirs.
Node lower_elementwise_group(const Graph& g, size_t i, size_t j, const BufferReaders& readers);

}  // namespace reel::compile
