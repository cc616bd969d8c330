// Plan — a traced Graph made executable: buffers bound to memory, nodes to kernels.
//
//   Input buffers     get static copies made at build time; each call copies its arguments in.
//   External buffers  are the traced Storages themselves (parameters, optimizer state, ...).
//   Internal buffers  are views into one arena per device, placed by the memory plan.
// run() reserves the random numbers of the run (Graph::random_sources), copies the arguments in, runs the nodes in order through the kernel table (run_kernel: no
// schema checks, no allocation of activations, no autograd: the tape was recorded once; fused nodes
// are ops like the others), and returns fresh copies of the outputs, so a caller may keep them while
// later calls reuse the arena. Building a plan also prepares each node's kernel (prepare_kernel:
// NVRTC compiles the fused elementwise programs then, not inside a replay or a capture).
//
// Modes (as torch.compile's):
//   Default        nodes launched one by one from the host;
//   ReduceOverhead the nodes captured once into CUDA graphs and replayed: one graph for each maximal
//                  run of nodes whose tensors are all on the GPU (normally the whole step); nodes
//                  touching the host run between them (each reported as a graph break);
//   MaxAutotune    ReduceOverhead, with kernels' autotuning on during the function's calls (kernels/autotune.h:
//                  cuDNN convolution algorithms timed on each shape's first, eager, use; the choice
//                  cached). GEMMs likewise: cuBLASLt's candidates timed against cuBLAS's default.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compile/ir/graph.h"
#include "compile/passes/memory_plan.h"
#include "compile/passes/pipeline.h"
#include "compile/ir/trace.h"
#include "compile/runtime/arena_pool.h"
#include "tensor/cuda.h"

namespace reel::compile {

enum class Mode { Default, ReduceOverhead, MaxAutotune };
const char* mode_name(Mode m);
Mode parse_mode(const std::string& name);  // "default" | "reduce-overhead" | "max-autotune"

// With an ArenaPool (the compiled function's), the plan's arena is the pool's block, shared with the
// function's other plans (arena_pool.h); without one, a block of its own.
class Plan : private ArenaPool::User {
 public:
  Plan(Graph graph, Mode mode, PassOptions passes = {}, std::shared_ptr<ArenaPool> pool = nullptr);
  ~Plan();
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  // One call. `capture` false runs every kernel directly even where reduce-overhead would capture (a
  // plan's first run after a trace that ran nothing: libraries make their handles, workspaces and
  // algorithm choices outside any graph); the next run captures.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs, bool capture = true);

  // One call run kernel by kernel, outside any graph, with the device idle around each kernel so that
  // its time is its own (CUDA events; the host clock on the CPU): what `reel bench --profile` shows of
  // a compiled step. The call's results are discarded; parameters are updated as by run().
  struct KernelTime {
    std::string label;  // op name, or "fused[op+op+...]"
    std::string key;    // label, input shapes and dtype
    double ms;
  };
  std::vector<KernelTime> profile(const std::vector<Tensor>& inputs);

  // One call run kernel by kernel outside any graph, as profile(), but without waiting between
  // kernels, so that what it records is the step as it runs: each kernel's host span (its launch on a
  // GPU; on the CPU, where kernels run on the host, the kernel itself) and, on a GPU, its span on the
  // stream from CUDA events recorded before and after it, placed on the host's clock through a start
  // event whose host time is taken once the device is idle. What a Chrome trace shows
  // (compile/runtime/chrome_trace.h). Times are microseconds of the host's steady clock. The call's
  // results are discarded; parameters are updated as by run().
  struct KernelSpan {
    size_t node;       // its index in graph().nodes (whose phase and fused ops it shows)
    std::string label; // as profile()'s
    Device device;
    double host_begin_us, host_end_us;
    double device_begin_us = -1, device_end_us = -1;  // GPU kernels only
  };
  std::vector<KernelSpan> trace(const std::vector<Tensor>& inputs);

  const Graph& graph() const { return graph_; }
  const MemoryPlan& memory() const { return memory_; }
  const PassStats& stats() const { return stats_; }
  Mode mode() const { return mode_; }
  size_t kernels() const { return graph_.nodes.size(); }
  // REEL_ARENA_OFFSET (bytes, a multiple of 256; default 0), read when the plan is built: every
  // arena's buffers placed that far into a block as much larger. The same plan at other device
  // addresses, for studying how where memory lands moves a step's time (bench/RESULTS.md, seventeenth
  // step); the step's memory grows by it. A bad value is a reel::Error naming the variable.
  size_t arena_offset() const { return arena_offset_; }
  size_t graphs() const;                 // CUDA graphs captured so far
  std::vector<GraphBreak> host_nodes() const;  // nodes that run outside the graphs (ReduceOverhead)

 private:
  struct Step {
    OpKind op;
    const Attrs* attrs;
    std::vector<Tensor> in, out;
    bool on_gpu;    // every tensor it touches is on a GPU: it can be captured
    int join = -1;  // on a side stream: the step before which the main stream waits for it (side_stream.h)
    int lane = 0;   // its stream: 0 the main one, 1 or 2 a side lane (Node::stream)
    int device = 0;
  };
  struct Segment {
    size_t begin, end;  // steps [begin, end)
    bool captured;      // replayed from `graph` (ReduceOverhead)
    std::unique_ptr<cuda::Graph> graph;
  };

  Tensor bind(const TensorRef& r) const;
  // The arenas' blocks (the pool's, or its own), then the steps bound to them; again after the pool
  // made this plan let go (release_arena).
  void bind_arenas();
  void ensure_bound();
  void release_arena(Device device) override;
  void build_steps();
  void build_segments();
  // Steps [begin, end) in order; a side-stream step forked beside the main stream and joined before
  // its join step, or at `end` (every fork of the range joined by then).
  void run_steps(size_t begin, size_t end);
  // Binds if needed, reserves the run's random numbers and copies the arguments in.
  void begin_call(const std::vector<Tensor>& inputs);
  // Reserves each generator's counters for this run and writes {seed, base} into its state buffers
  // (Graph::random_sources), so random nodes draw what an eager call would draw now.
  void reserve_random_numbers();

  PassStats stats_;  // before graph_: the passes fill it while graph_ is initialised
  Graph graph_;
  Mode mode_;
  MemoryPlan memory_;
  std::vector<std::shared_ptr<Storage>> storage_;  // per buffer: where it lives now
  std::vector<size_t> byte_offset_;                // per buffer: its start in that storage
  size_t arena_offset_ = 0;                        // REEL_ARENA_OFFSET: see arena_offset()
  std::vector<Tensor> input_views_;                // per input: its static copy, in the traced geometry
  std::vector<Step> steps_;
  std::map<int, std::unique_ptr<cuda::StreamFork>> forks_;  // per device with side-stream steps
  std::vector<Segment> segments_;
  std::shared_ptr<ArenaPool> pool_;
  bool bound_ = false;  // steps_ and segments_ bound to the arenas' blocks
};

}  // namespace reel::compile
