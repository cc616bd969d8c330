// The pass pipeline (see pipeline.h): the list, in order, and the loop that runs it.
#include "compile/passes/pipeline.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

#include "compile/passes/overlap_micro_batches.h"
#include "compile/passes/side_stream.h"
#include "compile/passes/split_norm_param_sums.h"
#include "tensor/log.h"

namespace reel::compile {

const std::vector<Pass>& pipeline() {
  using S = PassStage;
  static const std::vector<Pass> passes = {
      // Before dead code: the arange nodes whose ids it stops reading go there.
      {"identity_gathers", S::Cleanup, read_identity_gathers, "lookups of ids 0..n-1 read the table's rows in place"},
      {"dead_code", S::Cleanup, eliminate_dead_code, "nodes whose results nothing reads"},
      {"constants", S::Cleanup, fold_constants, "nodes of constants only, run once at build time"},
      {"common_subexpressions", S::Cleanup, eliminate_common_subexpressions, "a node repeating an earlier one"},
      // First: the norm passes fold a drawn mask into their kernels, elementwise fusion the others.
      {"dropout_masks", S::Fusion, redraw_dropout_masks, "dropout's mask drawn again where it is read, not stored"},
      // Before any cast is folded: the bias sums read the 16-bit gradient the casts make.
      {"bias_grad_cast", S::Fusion, fuse_bias_grad_cast, "bias gradients summed from the 16-bit gradient"},
      {"sums_into_grads", S::Fusion, write_sums_into_grads,
       "gradients summed over leading dims written or added by the sum"},
      // Before elementwise fusion would take the add after a GEMM.
      {"gemm_epilogue", S::Fusion, fuse_gemm_epilogue, "a GEMM's bias add (and cast) in its epilogue"},
      {"matmul_cast", S::Fusion, fuse_matmul_cast, "a 16-bit GEMM writing its f32 result directly"},
      {"matmul_accumulate", S::Fusion, fuse_matmul_accumulate, "weight gradients written or added by their GEMM"},
      {"masked_softmax", S::Fusion, fuse_masked_softmax, "mask + softmax (+ cast), forward and backward"},
      {"cross_entropy", S::Fusion, fuse_cross_entropy,
       "cross-entropy and its backward (+ the gradient's cast) in one kernel"},
      // After cross_entropy and gemm_epilogue (the two nodes it takes with the matmul after them).
      {"linear_cross_entropy", S::Fusion, fuse_linear_cross_entropy,
       "a small classifier head: its GEMM, loss, gradient and input gradient in one kernel"},
      {"norm_cast", S::Fusion, fuse_norm_cast, "(add +) layer norm writing its GEMM's 16-bit input"},
      {"attention_cast", S::Fusion, fuse_attention_cast, "attention also writing its GEMM's 16-bit input"},
      // After attention_cast: the attention nodes it reads are final.
      {"gemm_16bit", S::Fusion, store_gemm_bias_16bit, "GEMM results that only 16-bit readers read, in 16 bits"},
      {"norm_backward_add", S::Fusion, fuse_norm_backward_add,
       "layer-norm backward + the residual's gradient (+ cast, sums)"},
      // After norm_backward_add (its node) and gemm_16bit.
      {"layer_norm_16bit", S::Fusion, read_layer_norm_16bit,
       "layer norms reading their GEMMs' results (addend, gradient) in 16 bits"},
      // After gemm_16bit: it fuses the 16-bit pre-activation that pass made.
      {"gemm_gelu", S::Fusion, fuse_gemm_gelu, "GELU in the epilogue of the GEMM before it"},
      {"norm_16bit_input", S::Fusion, read_norm_input_16bit, "group/batch norms reading a 16-bit x, not its f32 cast"},
      {"norm_grad_16bit", S::Fusion, write_norm_grad_16bit,
       "batch/group-norm backward writing the 16-bit dx its convolution reads"},
      // After the two above (whose 16-bit x and dx it keeps), before elementwise would take the relus.
      {"norm_relu", S::Fusion, fuse_norm_relu,
       "batch/group norm with the relu after it (and its 16-bit copy); their backward with relu_backward"},
      // After norm_relu (its relu and 16-bit operands), before elementwise would take the pool's scale.
      {"norm_pool", S::Fusion, fuse_norm_pool,
       "group norm writing the global average pool of its output; its backward reading the pool's gradient"},
      // Before elementwise: the counters it gathers at the end are fused there.
      {"sink_updates", S::Fusion, sink_state_updates,
       "in-place updates of step state (counters) moved to the end, to fuse"},
      // After the passes that rewrite the producers, before elementwise takes the copies.
      {"results_into_grads", S::Fusion, write_results_into_grads,
       "a new gradient written by the node that computes it; a norm backward adding into the later ones"},
      {"elementwise", S::Fusion, fuse_elementwise, "runs of elementwise ops as one generated kernel"},
      // After elementwise: it extends the kernels that pass made. Off by default: on the H200 it
      // made gpt-small's step 3-4% slower than the elementwise kernel and the column-sum kernel it
      // replaces (bench/RESULTS.md, "column sums in the elementwise kernel").
      {"elementwise_column_sums", S::Fusion, fuse_elementwise_column_sums,
       "bias gradients summed by the elementwise kernel that writes the gradient", /*on_by_default=*/false},
      // After elementwise (its cast-and-add kernels), before optimizer (whose steps name the gradients).
      {"grad_casts", S::Fusion, fuse_grad_casts,
       "a micro-batch's 16-bit weight gradients cast into (or added to) the f32 gradients in one kernel",
       /*on_by_default=*/true, /*under_memory_limit=*/false},
      {"optimizer", S::Fusion, fuse_optimizer, "a run of per-parameter updates as one multi-tensor kernel"},
      // After optimizer: it folds into the multi-tensor updates that pass writes.
      {"clip_into_optimizer", S::Fusion, fuse_clip_into_optimizer,
       "the clip's scaling of the gradients in the optimizer's update (its inf/NaN check in the norm)"},
      // Last: the casts left after the other passes (the GEMM epilogues' 16-bit biases among them).
      {"weight_casts", S::Fusion, fuse_weight_casts, "the step's casts of its weights as one multi-tensor kernel",
       /*on_by_default=*/true, /*under_memory_limit=*/false},
      // Before side_stream, which takes the sums node it makes. Off by default: on H100s it measured
      // gpt-tiny -2.1%, -0.1%, +0.0% and gpt-small -0.1%, -0.9%, -0.8% in three calls (within the
      // machines' spread), gpt-small's peak 2 MiB higher in two (bench/RESULTS.md, seventeenth step).
      {"split_norm_param_sums", S::Schedule, split_norm_param_sums,
       "a layer-norm backward's parameter sums in a node of their own, which the second stream runs",
       /*on_by_default=*/false, /*under_memory_limit=*/false},
      // After every rewrite: it picks nodes by what runs after them.
      {"side_stream", S::Schedule, assign_side_stream,
       "weight gradients (GEMMs, convolutions), column sums, embedding gradients and gradient casts on a "
       "second stream, beside the next kernels",
       /*on_by_default=*/true, /*under_memory_limit=*/false},
      {"input_casts_early", S::Schedule, cast_inputs_early,
       "casts of the step's inputs started earlier, on the second stream, under the previous micro-batch",
       /*on_by_default=*/true, /*under_memory_limit=*/false},
      {"side_stream_late", S::Schedule, run_side_nodes_late,
       "side-stream nodes moved to just before their inputs' last reader (the weight-gradient GEMM)",
       /*on_by_default=*/true, /*under_memory_limit=*/false},
      // After the side-stream passes: the nodes it passes keep the places those chose.
      {"overlap_micro_batches", S::Schedule, overlap_micro_batches,
       "a micro-batch's first forward kernels on a third stream, under the backward before it",
       /*on_by_default=*/true, /*under_memory_limit=*/false},
  };
  return passes;
}

namespace {

bool is_pass(const std::string& name) {
  const auto& p = pipeline();
  return std::any_of(p.begin(), p.end(), [&](const Pass& x) { return name == x.name; });
}

std::string pass_names() {
  std::string out;
  for (const Pass& p : pipeline())
    out += (out.empty() ? "" : ", ") + std::string(p.name) + (p.on_by_default ? "" : " (off by default)");
  return out;
}

// The names after `sign` in REEL_PASSES ("-a,+b,-c" with '-': {"a", "c"}); every item must be
// -name or +name of a pass.
std::vector<std::string> passes_in_env(char sign) {
  const char* env = std::getenv("REEL_PASSES");
  std::vector<std::string> out;
  std::stringstream ss(env ? env : "");
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    REEL_CHECK(
        (item[0] == '-' || item[0] == '+') && item.size() > 1, "REEL_PASSES: '", item,
        "' must be -name, a pass to turn off, or +name, a pass off by default to turn on (passes: ", pass_names(), ")");
    const std::string name = item.substr(1);
    REEL_CHECK(is_pass(name), "REEL_PASSES: no pass is called '", name, "' (passes: ", pass_names(), ")");
    if (item[0] == sign) out.push_back(name);
  }
  return out;
}

// The phases (Node::phase) of the traced nodes, by the buffers they write: what carry_phases reads.
std::vector<std::set<std::string>> phases_by_buffer(const Graph& traced) {
  std::vector<std::set<std::string>> written_in(traced.buffers.size());
  for (const Node& n : traced.nodes)
    for (const TensorRef& r : n.outputs)
      if (!n.phase.empty()) written_in[size_t(r.buffer)].insert(n.phase);
  return written_in;
}

// A phase for each node a pass built anew (a fused node, a cast it inserted), which the fusion passes
// do not carry over: the phase the traced nodes that wrote its outputs share; where they do not share
// one (a gradient accumulated by every micro-batch) or none wrote them (a buffer a pass made), the phase
// of the nearest node before it that has one (after it, at the start). The fusion passes keep the
// traced order, so a fused node sits among the nodes it replaced. Run before the schedule stage, whose
// passes read the phases (overlap_micro_batches), and at the end for the nodes built after it.
void carry_phases(Graph& g, const std::vector<std::set<std::string>>& written_in) {
  std::vector<bool> had(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) had[i] = !g.nodes[i].phase.empty();
  auto neighbour = [&](size_t i, int step) -> std::string {
    for (long j = long(i) + step; j >= 0 && j < long(g.nodes.size()); j += step)
      if (had[size_t(j)]) return g.nodes[size_t(j)].phase;
    return "";
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    if (had[i]) continue;
    std::set<std::string> writers;
    for (const TensorRef& r : n.outputs)
      if (size_t(r.buffer) < written_in.size()) writers.insert(written_in[r.buffer].begin(), written_in[r.buffer].end());
    if (writers.size() == 1) {
      n.phase = *writers.begin();
    } else {
      const std::string before = neighbour(i, -1);
      n.phase = before.empty() ? neighbour(i, +1) : before;
    }
  }
}

}  // namespace

std::vector<std::string> passes_disabled_by_env() { return passes_in_env('-'); }
std::vector<std::string> passes_enabled_by_env() { return passes_in_env('+'); }

Graph optimize_graph(Graph g, const PassOptions& options, PassStats& stats) {
  stats.traced = g.nodes.size();
  std::vector<std::string> off = options.disabled, on = options.enabled;
  for (const auto* names : {&off, &on})
    for (const std::string& name : *names)
      REEL_CHECK(is_pass(name), "compile: no pass is called '", name, "' (passes: ", pass_names(), ")");
  const std::vector<std::string> env_off = passes_disabled_by_env(), env_on = passes_enabled_by_env();
  off.insert(off.end(), env_off.begin(), env_off.end());
  on.insert(on.end(), env_on.begin(), env_on.end());
  auto named = [](const std::vector<std::string>& names, const char* name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  const std::vector<std::set<std::string>> written_in = phases_by_buffer(g);
  bool phases_carried = false;
  for (const Pass& p : pipeline()) {
    if (p.stage == PassStage::Schedule && !phases_carried) {
      carry_phases(g, written_in);
      phases_carried = true;
    }
    if (p.stage != PassStage::Cleanup && !options.fuse) continue;
    if (options.memory_limit > 0 && !p.under_memory_limit) {
      log_line("passes", std::string(p.name) + ": off under a memory limit");
      continue;
    }
    if (named(off, p.name) || (!p.on_by_default && !named(on, p.name))) {
      log_line("passes", std::string(p.name) + (named(off, p.name) ? ": off" : ": off by default"));
      continue;
    }
    const size_t before = g.nodes.size();
    p.run(g, stats);
    stats.after.emplace_back(p.name, g.nodes.size());
    log_line("passes", detail::cat(p.name, ": ", before, " -> ", g.nodes.size(), " nodes"));
  }
  if (options.memory_limit > 0) {
    const size_t before = g.nodes.size();
    recompute_to_fit(g, options.memory_limit, stats);
    stats.after.emplace_back("recompute", g.nodes.size());
    log_line("passes", detail::cat("recompute: ", before, " -> ", g.nodes.size(), " nodes"));
  }
  carry_phases(g, written_in);
  stats.kernels = g.nodes.size();
  return g;
}

}  // namespace reel::compile
