// The graph passes, one file each in this folder; passes/pipeline.cpp runs them in order. Every pass
// takes the graph and the statistics it adds to; each file opens with the pattern it rewrites, the
// fused op it writes (kernels/ops.def) and what the result equals (to the bit, or within tolerance).
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "compile/ir/graph.h"
#include "compile/passes/pattern.h"

namespace reel::compile {

struct PassStats {
  size_t traced = 0;        // nodes as traced
  size_t dead = 0;          // removed by dead-code elimination
  size_t folded = 0;        // run once at build time
  size_t deduplicated = 0;  // common subexpressions removed
  size_t in_place = 0;      // identity gathers whose readers read the rows where they lie
  size_t fused = 0;         // nodes merged into fused ops (a chain of k nodes counts k - 1)
  size_t kernels = 0;       // nodes left: kernels per replay
  size_t beside = 0;        // nodes run on a second stream (side_stream.h)
  size_t ahead = 0;         // forward nodes run on a third stream, under the backward before them (overlap_micro_batches.h)
  // Each pass that ran, in pipeline order, and the nodes it left (`reel plan` prints them).
  std::vector<std::pair<std::string, size_t>> after;
  // Recomputation for a memory limit (recompute.cpp): the ops cloned, in the order chosen, the FLOPs
  // they add (roughly: 2MNK a GEMM, one per output element otherwise) and the busiest node's live
  // bytes before and after.
  std::vector<std::string> recomputed;
  double recompute_flops = 0;
  size_t recompute_live_before = 0, recompute_live_after = 0;
};

// ---- cleanup ----
void read_identity_gathers(Graph& g, PassStats& stats);           // identity_gathers.cpp
void eliminate_dead_code(Graph& g, PassStats& stats);             // eliminate_dead_code.cpp
void fold_constants(Graph& g, PassStats& stats);                  // fold_constants.cpp
void eliminate_common_subexpressions(Graph& g, PassStats& stats); // eliminate_common_subexpressions.cpp

// ---- fusion: each rewrites node chains into a fused op of kernels/ops.def ----
void fuse_bias_grad_cast(Graph& g, PassStats& stats);     // column_sums
void write_sums_into_grads(Graph& g, PassStats& stats);   // column_sums (into a gradient)
void fuse_gemm_epilogue(Graph& g, PassStats& stats);      // gemm_epilogue
void fuse_matmul_cast(Graph& g, PassStats& stats);        // matmul_into (f32 result)
void fuse_matmul_accumulate(Graph& g, PassStats& stats);  // matmul_into (into a gradient)
void fuse_masked_softmax(Graph& g, PassStats& stats);     // masked_softmax(_backward)
void fuse_cross_entropy(Graph& g, PassStats& stats);      // cross_entropy_with_grad
void fuse_linear_cross_entropy(Graph& g, PassStats& stats);  // linear_cross_entropy_with_grad
void fuse_norm_cast(Graph& g, PassStats& stats);          // layer_norm_cast
void fuse_attention_cast(Graph& g, PassStats& stats);     // attention(_backward)_cast
void store_gemm_bias_16bit(Graph& g, PassStats& stats);   // gemm_epilogue in 16 bits (store_gemm_16bit.cpp)
void fuse_norm_backward_add(Graph& g, PassStats& stats);  // layer_norm_backward_add
void read_layer_norm_16bit(Graph& g, PassStats& stats);   // layer norms reading a GEMM's 16-bit result
void fuse_gemm_gelu(Graph& g, PassStats& stats);          // gemm_epilogue with GELU
void read_norm_input_16bit(Graph& g, PassStats& stats);   // group/batch norms reading a 16-bit x (attr dtype)
void write_norm_grad_16bit(Graph& g, PassStats& stats);   // group/batch norm backward writing a 16-bit dx (dx_dtype)
void fuse_norm_relu(Graph& g, PassStats& stats);          // group/batch norm (backward) with the relu (attr relu)
void fuse_norm_pool(Graph& g, PassStats& stats);          // group norm (backward) with the pool (pool, grad_scale)
void redraw_dropout_masks(Graph& g, PassStats& stats);    // dropout_mask where the mask is read
void sink_state_updates(Graph& g, PassStats& stats);      // none: moves counters' updates together
void write_results_into_grads(Graph& g, PassStats& stats);  // none: a producer writes the new gradient
void fuse_grad_casts(Graph& g, PassStats& stats);           // multi_tensor_cast (into / added to gradients)
void fuse_elementwise(Graph& g, PassStats& stats);        // fused_elementwise
void fuse_elementwise_column_sums(Graph& g, PassStats& stats);  // fused_elementwise with column sums
void fuse_optimizer(Graph& g, PassStats& stats);          // multi_tensor_adamw / multi_tensor_sgd
void fuse_clip_into_optimizer(Graph& g, PassStats& stats);  // multi_tensor_* with clip (global_norm check_finite)
void fuse_weight_casts(Graph& g, PassStats& stats);       // multi_tensor_cast

// ---- memory ----
// Clones of pure nodes placed before the backward's readers of their outputs, until the live bytes
// at the busiest node are at most `limit` (per device) or nothing more helps (recompute.cpp).
void recompute_to_fit(Graph& g, size_t limit, PassStats& stats);

}  // namespace reel::compile
