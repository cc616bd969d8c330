// Nodes on a second stream beside the main one, and where the main stream waits for them (side_stream.h).
#include "compile/passes/side_stream.h"

#include <algorithm>

#include "compile/passes/memory_plan.h"
#include "compile/passes/pattern.h"
#include "compile/passes/step_cost.h"
#include "tensor/log.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "side_stream";
constexpr const char* kLatePass = "side_stream_late";
constexpr const char* kEarlyPass = "input_casts_early";

// Main-stream nodes a side node whose inputs have no later reader may run beside (Node::hold).
constexpr int kMaxHold = 4;

// The most bytes an input of a side node may have. The kernels it runs beside read the same gradient,
// and at gpt-small's sizes those kernels fill the GPU on their own: a side kernel's blocks then delay
// some of their tiles to a second wave. Measured side by side with the pass off (bench/RESULTS.md,
// tenth step): gpt-tiny's step (bias gradients of 3-4 MiB, its embedding's 2 MiB) 4.4-4.5% faster
// with them beside (an H200, an H100); gpt-small's 0.5% (H200) and 2% (H100) slower with its bias
// gradients' sums (12-16 MiB) beside, and 0.4-0.6% slower (H100) with its embedding gradient's
// (8 MiB) alone.
constexpr size_t kMaxBesideBytes = size_t(4) << 20;

// The most work a side node may have (floating-point operations, compile/passes/step_cost.h): the
// weight gradients' GEMMs. Measured side by side with them on the main stream (bench/RESULTS.md,
// eleventh step, an H100): gpt-tiny's (0.27-1.07 GFLOP each) beside, the step 5.4% faster; gpt-small's
// smallest (its output projection's, 2.1 GFLOP; all its inputs within the byte bound) beside, 1.3%
// slower: its GEMMs on the main stream fill the GPU by themselves.
constexpr double kMaxBesideFlops = 1.5e9;

// Under REEL_LOG=fusion, why node i stays on the main stream.
void stays(const Graph& g, size_t i, const char* reason) {
  if (log_enabled("fusion"))
    log_line("fusion",
             detail::cat(kPass, ": ", op_name(g.nodes[i].op), " k", i, " stays on the main stream: ", reason));
}

// What the other streams do after side node i with node i's buffers: the first node of another
// stream (the main one or the other side lane) that touches one of its outputs or writes one of its
// inputs (nodes.size() when none), and the last main-stream node before that which reads one of its
// inputs (i when none). A node of its own lane runs after it anyway.
struct Reach {
  int conflict, last_reader;
};
Reach reach_of(const Graph& g, size_t i) {
  const Node& side = g.nodes[i];
  Reach r{int(g.nodes.size()), int(i)};
  for (size_t k = i + 1; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    if (n.stream == side.stream) continue;
    bool conflict = writes_an_input_of(n, side), reads = false;
    for (const TensorRef& out : side.outputs) conflict = conflict || refers_to(n, out.buffer);
    for (const auto& in : side.inputs) reads = reads || (in && refers_to(n, in->buffer));
    if (conflict) {
      r.conflict = int(k);
      return r;
    }
    if (reads && n.stream == 0) r.last_reader = int(k);
  }
  return r;
}

bool reads_a_graph_output(const Graph& g, const Node& n) {
  for (const auto& in : n.inputs)
    for (const TensorRef& o : g.outputs)
      if (in && o.buffer == in->buffer) return true;
  return false;
}

// Whether every input of n is the step's own memory (its inputs, parameters, state), which lives
// through the whole step whatever reads it.
bool reads_step_memory_only(const Graph& g, const Node& n) {
  for (const auto& in : n.inputs)
    if (in && g.buffers[size_t(in->buffer)].kind == BufferKind::Internal) return false;
  return true;
}

// The join of side node i: its first conflict, and at the latest the node after the main stream's
// last reader of its inputs (so that they live no longer than they would on one stream: a gradient's
// sum is otherwise read by nothing until the optimizer, and holding the gradient till then would hold
// the step's memory); the first conflict alone when it reads a graph output or only the step's own
// memory (which live to the end anyway), and for a forward kernel run ahead on lane 2
// (overlap_micro_batches.h), whose inputs are its micro-batch's activations, which the main stream's
// next forward kernels read after it anyway.
int join_of(const Graph& g, size_t i) {
  const Reach r = reach_of(g, i);
  if (g.nodes[i].stream == kAheadStream || reads_a_graph_output(g, g.nodes[i]) || reads_step_memory_only(g, g.nodes[i]))
    return r.conflict;
  // Past the last reader, `hold` more main-stream nodes run beside it.
  int join = r.last_reader + 1;
  for (int held = 0; held < g.nodes[i].hold && join < r.conflict; ++join) held += g.nodes[join].stream == 0;
  return std::min(r.conflict, join);
}

// The nodes whose CUDA kernels may run beside the main stream's: no device memory shared with the
// main stream's kernels but their operands. A weight gradient's GEMM (matmul_into) may: cuBLAS's
// workspace has a half for each stream (kernels/cuda/cuda_common.cuh's blas_workspace). So may a
// convolution's weight gradient: cuDNN's convolution calls take their workspace as an argument (from
// the caching allocator, whose blocks are the side stream's own), and the stem's own kernel counts its
// blocks, like the column sums, in the side stream's lane of finish counters. The libraries' handles
// are the thread's, bound to the current stream at each call. (A fused elementwise kernel that only
// adds a micro-batch's norm weight gradients into the step's could too; beside, it made gpt-tiny's step
// 1.1% and gpt-small's 0.5% slower on an H100, bench/RESULTS.md, twelfth step.) A layer norm backward's
// parameter sums (layer_norm_param_sums, split off by split_norm_param_sums.h) read only the partial
// sums its backward left.
bool runs_beside(const Node& n) {
  switch (n.op) {
    case OpKind::ColumnSums:
    case OpKind::EmbeddingBackward:
    case OpKind::MultiTensorCast:
    case OpKind::Conv2dBackwardWeight:
    case OpKind::MatmulInto:
    case OpKind::LayerNormParamSums:
      return true;
    default:
      return false;
  }
}

}  // namespace

bool small_enough_to_run_beside(const Node& n) {
  for (const auto& in : n.inputs)
    if (in && in->nbytes() > kMaxBesideBytes) return false;
  return node_flops(n) <= kMaxBesideFlops;
}

std::vector<int> side_joins(const Graph& g) {
  std::vector<int> joins(g.nodes.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].stream != 0) joins[i] = join_of(g, i);
  // A lane runs its nodes in graph order: a lane-2 node is done once a later node of its lane is, so
  // the main stream has waited for it at the earliest of their joins, and its buffers are free from
  // there (a forward's first kernels: one whose result only the next one on the lane reads would
  // otherwise hold it to the end of the step). Lane 1 keeps each node's own join.
  int later = int(g.nodes.size());
  for (size_t i = g.nodes.size(); i-- > 0;)
    if (g.nodes[i].stream == kAheadStream) joins[i] = later = std::min(later, joins[i]);
  return joins;
}

namespace {

// Why node i may not go beside, or nullptr when it went (n.stream = 1, with its hold). `peak` is the
// planned peak of the plan before the pass, computed on first need.
const char* try_beside(Graph& g, size_t i, size_t& peak) {
  Node& n = g.nodes[i];
  if (!g.buffers[size_t(n.outputs[0].buffer)].device.is_cuda())
    return "it is not on a GPU (a CPU plan runs one kernel at a time)";
  if (!small_enough_to_run_beside(n))
    return "an input of more than 4 MiB or more than 1.5 GFLOP of work: the kernels beside it would fill the GPU on "
           "their own";
  n.stream = 1;
  if (join_of(g, i) > int(i) + 1) return nullptr;
  // Nothing reads its inputs after it: it runs beside the next nodes only if its inputs live longer.
  // As long as that leaves the step's planned peak where it was (a micro-batch's last kernels, held
  // into the next one's first, are far from the peak at the end of the last forward).
  const Reach r = reach_of(g, i);
  if (r.conflict == int(i) + 1 || reads_a_graph_output(g, n)) {
    n.stream = 0;
    return "the node right after it reads what it writes or writes what it reads";
  }
  if (peak == 0) {
    n.stream = 0;
    peak = planned_peak(g);
    n.stream = 1;
  }
  // A layer norm's parameter sums (split_norm_param_sums.h) hold only the partial sums its backward
  // left: what that backward took from the caching allocator for them at the same point before the
  // split. The plan's peak may grow by those bytes.
  const size_t allowance = n.op == OpKind::LayerNormParamSums ? n.inputs[0]->nbytes() : 0;
  for (int hold : {kMaxHold, kMaxHold / 2, 1}) {
    n.hold = hold;
    if (planned_peak(g) <= peak + allowance) return nullptr;
  }
  n.hold = 0;
  n.stream = 0;
  return "holding its inputs past their last reader would raise the step's planned peak";
}

}  // namespace

void assign_side_stream(Graph& g, PassStats& stats) {
  size_t peak = 0;  // the planned peak before the pass, once a node needs its inputs held
  // Two sweeps: a node whose next node reads its result may go beside in the second, once that node
  // has gone beside in the first (a weight gradient, then the cast that reads it: both beside, in
  // order on the side stream).
  std::vector<const char*> reasons(g.nodes.size(), nullptr);
  for (int sweep = 0; sweep < 2; ++sweep)
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      Node& n = g.nodes[i];
      if (!runs_beside(n) || n.outputs.empty() || n.stream != 0) continue;
      if (sweep == 1 && reasons[i] == nullptr) continue;  // nothing changed for it
      reasons[i] = try_beside(g, i, peak);
      if (!reasons[i]) ++stats.beside;
    }
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (reasons[i]) stays(g, i, reasons[i]);
}

namespace {

// How many main-stream nodes a cast of a step input may move up, at most (then half as many, down to
// one, where the planned peak would grow): enough to start it under the previous micro-batch's backward,
// few enough that the side nodes before it (graph order is the side stream's order) are long done.
constexpr int kMaxHoist = 32;

// Node i as a copy (a cast, a layout change) of a step input that no node writes, into a buffer that
// only it writes: its input's values are there before the step starts.
bool casts_a_step_input(const Graph& g, const BufferUses& u, size_t i) {
  const Node& n = g.nodes[i];
  if (n.op != OpKind::Copy || n.in_place || n.inputs.size() != 1 || !n.inputs[0] || n.outputs.size() != 1 ||
      n.stream != 0)
    return false;
  const int in = n.inputs[0]->buffer;
  return g.buffers[size_t(in)].kind == BufferKind::Input && u.writers[size_t(in)].empty() &&
         internal_once(g, u, n.outputs[0]) && g.buffers[size_t(n.outputs[0].buffer)].device.is_cuda();
}

}  // namespace

void cast_inputs_early(Graph& g, PassStats& stats) {
  // The candidates, in order: moving one up shifts only the nodes between its new place and its old.
  std::vector<size_t> casts;
  {
    const BufferUses u = buffer_uses(g);
    for (size_t i = 1; i < g.nodes.size(); ++i)
      if (casts_a_step_input(g, u, i)) casts.push_back(i);
  }
  size_t peak = 0;
  size_t last_early = 0;  // just after the last input cast: the side stream runs them in graph order
  for (size_t i : casts) {
    if (peak == 0) peak = planned_peak(g);
    const size_t floor_at = last_early;
    bool moved = false;
    const char* why = "starting it earlier would raise the step's planned peak";
    for (int up = kMaxHoist; up > 0; up /= 2) {
      size_t to = i;  // `up` main-stream nodes up
      int passed = 0;
      for (; to > floor_at && passed < up; --to) passed += g.nodes[to - 1].stream == 0;
      if (passed == 0) {
        why = "no main-stream node since the previous input's cast to run beside";
        break;
      }
      // Node i to place `to` on the side stream, and back where the peak would grow.
      const auto first = g.nodes.begin() + long(to), last = g.nodes.begin() + long(i) + 1;
      std::rotate(first, last - 1, last);
      first->stream = 1;
      if (planned_peak(g) > peak) {
        first->stream = 0;
        std::rotate(first, first + 1, last);
        continue;
      }
      ++stats.beside;
      moved = true;
      last_early = to + 1;
      if (log_enabled("fusion"))
        log_line("fusion", detail::cat(kEarlyPass, ": the cast of a step input k", i, " moved to k", to, ", beside"));
      break;
    }
    if (!moved) last_early = i + 1;
    if (!moved && log_enabled("fusion"))
      log_line("fusion", detail::cat(kEarlyPass, ": the cast of a step input k", i, " stays: ", why));
  }
}

void run_side_nodes_late(Graph& g, PassStats&) {
  // From the last node back, so that a node moved later is not met again.
  for (size_t i = g.nodes.size(); i-- > 0;) {
    if (g.nodes[i].stream == 0 || reads_a_graph_output(g, g.nodes[i])) continue;
    const Reach r = reach_of(g, i);
    // Beside the last reader alone: nothing between it and the node's first conflict touches it.
    if (r.last_reader <= int(i) + 1 || r.last_reader >= r.conflict) continue;
    Node moved = std::move(g.nodes[i]);
    g.nodes.erase(g.nodes.begin() + long(i));
    g.nodes.insert(g.nodes.begin() + (r.last_reader - 1), std::move(moved));
    if (log_enabled("fusion"))
      log_line("fusion", detail::cat(kLatePass, ": ", op_name(g.nodes[size_t(r.last_reader - 1)].op), " k", i,
                                     " moved to k", r.last_reader - 1, ", beside its inputs' last reader"));
  }
}

}  // namespace reel::compile
