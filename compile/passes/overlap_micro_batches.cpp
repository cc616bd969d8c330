// A micro-batch's first forward kernels on a third stream, under the backward before it
// (overlap_micro_batches.h).
#include "compile/passes/overlap_micro_batches.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "compile/passes/memory_plan.h"
#include "compile/passes/pattern.h"
#include "compile/passes/side_stream.h"
#include "tensor/log.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "overlap_micro_batches";

// How many of a forward's first main-stream kernels run ahead, and under how many of the backward's
// last main-stream kernels they start. Swept on gpt-tiny (two H100 calls, bench/RESULTS.md, sixteenth
// step; the pass off at 2.235 and 2.226 ms a step): 8 under 16 2.183 and 2.173, 8 under 12 2.173,
// 12 under 16 2.178, 6 under 16 2.197, 8 under 8 2.200, 4 under 16 2.206, 8 under 24 2.211, 16 under
// 16 2.212.
struct Overlap {
  int ahead = 8, under = 16;
};

Overlap overlap_of_env() {
  Overlap o;
  const char* env = std::getenv("REEL_OVERLAP_KERNELS");
  if (env == nullptr) return o;
  int ahead = -1, under = -1, used = 0;
  const bool ok = std::sscanf(env, "%d,%d%n", &ahead, &under, &used) == 2 && env[used] == '\0' && ahead >= 0 &&
                  under >= 0;
  REEL_CHECK(ok, "REEL_OVERLAP_KERNELS: expected 'ahead,under' (two counts of kernels, each 0 or more: a forward's "
             "first kernels run ahead, under the backward's last ones), got '", env, "'");
  o.ahead = ahead;
  o.under = under;
  return o;
}

std::string micro_batch(int k) { return "micro-batch " + std::to_string(k); }

// Forward ops whose CUDA kernels may run beside any other stream's: they share no device memory with
// other kernels but their operands and their stream's own workspaces (the caching allocator's blocks
// are a stream's own), and the ones that count blocks (batch norm's statistics) take their lane's
// finish counters. GEMMs with an epilogue only: they run on cuBLASLt with their algorithm's workspace
// from the allocator, where a plain matmul's cuBLAS handle would want a workspace lane 2 does not have
// (kernels/cuda/cuda_common.cuh). Not the losses (cross-entropy counts in the main stream's lane) nor
// anything of a backward or the optimizer.
bool runs_ahead(OpKind op) {
  switch (op) {
    case OpKind::Copy:
    case OpKind::Embedding:
    case OpKind::LayerNorm:
    case OpKind::LayerNormCast:
    case OpKind::GroupNorm:
    case OpKind::BatchNorm:
    case OpKind::GemmEpilogue:
    case OpKind::Conv2d:
    case OpKind::Attention:
    case OpKind::AttentionCast:
    case OpKind::FusedElementwise:
    case OpKind::Add:
    case OpKind::Mul:
    case OpKind::Relu:
    case OpKind::Gelu:
    case OpKind::GeluErf:
    case OpKind::Silu:
    case OpKind::MaxPool2d:
    case OpKind::AvgPool2d:
      return true;
    default:
      return false;
  }
}

// Why node n may not run ahead, or nullptr.
const char* why_not_ahead(const Graph& g, const Node& n) {
  if (n.outputs.empty() || !g.buffers[size_t(n.outputs[0].buffer)].device.is_cuda())
    return "it is not on a GPU (a CPU plan runs one kernel at a time)";
  if (!runs_ahead(n.op)) return "its op's kernels may not run beside another stream's (not a forward op of runs_ahead)";
  // As for lane 1 (side_stream.h): a larger kernel fills the GPU by itself. gpt-small's forward (GEMMs of
  // 2-9 GFLOP, 8 MiB layer-norm rows) measured 0-0.8% slower ahead in four H100 calls; gpt-tiny's
  // (0.3-1.1 GFLOP, at most 4 MiB) 2.4-3.1% faster.
  if (!small_enough_to_run_beside(n))
    return "an input of more than 4 MiB or more than 1.5 GFLOP of work: it would fill the GPU by itself";
  return nullptr;
}

// Whether `moved` may run before `passed`, which comes before it in graph order: it reads nothing
// `passed` writes and writes nothing `passed` reads or writes.
bool independent(const Node& moved, const Node& passed) {
  for (const TensorRef& out : passed.outputs)
    if (refers_to(moved, out.buffer)) return false;
  return !writes_an_input_of(moved, passed);
}

void note(const std::string& line) {
  if (log_enabled("fusion")) log_line("fusion", detail::cat(kPass, ": ", line));
}

// Moves nodes [a, a + n) to `to` (< a), onto the ahead lane; returns whether the planned peak stayed
// at most `peak` (else puts them back).
bool try_move(Graph& g, size_t to, size_t a, size_t n, size_t peak) {
  const auto first = g.nodes.begin() + long(to), mid = g.nodes.begin() + long(a), last = mid + long(n);
  std::rotate(first, mid, last);
  for (auto it = first; it != first + long(n); ++it) it->stream = kAheadStream;
  if (planned_peak(g) <= peak) return true;
  for (auto it = first; it != first + long(n); ++it) it->stream = 0;
  std::rotate(first, first + long(n), last);
  return false;
}

}  // namespace

void overlap_micro_batches(Graph& g, PassStats& stats) {
  const Overlap o = overlap_of_env();
  overlap_micro_batches(g, stats, o.ahead, o.under);
}

void overlap_micro_batches(Graph& g, PassStats& stats, int ahead, int under) {
  if (ahead <= 0 || under <= 0) return;
  size_t peak = 0;  // the planned peak before the pass, once a move needs it
  for (int k = 1;; ++k) {
    const std::string label = micro_batch(k), before = micro_batch(k - 1);
    // a: micro-batch k's first main-stream node; [a, e): the nodes that may run ahead from it.
    size_t a = 0;
    while (a < g.nodes.size() && !(g.nodes[a].stream == 0 && g.nodes[a].phase == label)) ++a;
    if (a == g.nodes.size()) break;
    size_t e = a;
    const char* why = nullptr;
    while (e < g.nodes.size() && e - a < size_t(ahead)) {
      const Node& n = g.nodes[e];
      if (n.stream != 0 || n.phase != label) break;
      if ((why = why_not_ahead(g, n)) != nullptr) break;
      ++e;
    }
    if (e == a) {
      note(detail::cat(label, ": its first kernel (", op_name(g.nodes[a].op), " k", a, ") stays: ", why));
      continue;
    }
    // p: `under` main-stream nodes of the micro-batch before up from a (passing the side-stream nodes
    // there, micro-batch k's early input casts among them), and no further up than the last node one
    // of [a, e) depends on.
    size_t p = a;
    for (int passed = 0; p > 0 && passed < under; --p) {
      const Node& n = g.nodes[p - 1];
      if (!(n.phase == before || (n.phase == label && n.stream != 0))) break;
      passed += n.stream == 0;
    }
    for (size_t m = a; m-- > p;)
      for (size_t j = a; j < e; ++j)
        if (!independent(g.nodes[j], g.nodes[m])) {
          note(detail::cat(label, ": ", op_name(g.nodes[j].op), " k", j, " reads or writes what ",
                           op_name(g.nodes[m].op), " k", m, " of ", before, " touches: it starts after it"));
          p = m + 1;
          break;
        }
    const bool passes_main = std::any_of(g.nodes.begin() + long(p), g.nodes.begin() + long(a),
                                         [](const Node& n) { return n.stream == 0; });
    if (!passes_main) {
      note(detail::cat(label, ": no main-stream kernel of ", before, " to run its first kernels under"));
      continue;
    }
    if (peak == 0) peak = planned_peak(g);
    bool moved = false;
    for (size_t n = e - a; n > 0 && !moved; n /= 2) {
      moved = try_move(g, p, a, n, peak);
      if (moved) {
        stats.ahead += n;
        note(detail::cat(label, ": its first ", n, " kernels (k", a, "..k", a + n - 1, ") moved to k", p, " on stream ",
                         kAheadStream, ", under ", before, "'s last ", a - p, " nodes"));
      }
    }
    if (!moved) note(detail::cat(label, ": its first kernels stay: running them ahead would raise the planned peak"));
  }
}

}  // namespace reel::compile
