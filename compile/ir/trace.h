// Tracer — records a step function's ops at the dispatch door into a Graph (compile/ir/graph.h).
//
// Installed as the DispatchObserver while the function runs eagerly (so the traced call also
// produces its real result), it sees every op after its kernel ran: kernel ops become Nodes, view
// ops only become TensorRefs. Buffers are keyed by Storage; the tracer holds a reference to every
// Storage it has seen for as long as the traced program does, and when the program drops one the
// tracer lets it go too (keeping a meta block of its size and forgetting its address, so a later
// Storage there is a new buffer): a traced call holds no more memory than the eager one.
// At the end, an Internal buffer still referenced from outside the step (say a gradient the
// optimizer keeps, or a tensor saved by an autograd graph that was not run backward) is state that
// outlives the step: it becomes External and keeps its memory on every replay.
// It also notes when the traced program dropped its last reference to each Internal block (only the
// tracer's own reference is left): Buffer::released_after, which gives eager execution's own lifetimes
// (autograd holds saved tensors until their backward ran) to the memory budget's planner.
//
// Random ops (dropout, rand_*) are part of the plan: the tracer also watches the thread's Generator
// draws (DrawObserver, tensor/rng.h) and ties each draw to the random op dispatched right after it.
// Such a node gets an extra input, its generator's Philox state (an External buffer per generator
// and device, written by the plan before each run: Graph::random_sources), and its offset attr
// becomes relative to the generator's first draw in the call. A random op with no draw (its seed
// and offset passed by hand) keeps its numbers on every run, as it would eagerly.
//
// Each node also keeps the calling thread's phase label when it was recorded (kernels/phase.h:
// "micro-batch 0", "optimizer", set by optim::train_step), so a trace of a replay can say which part
// of the step each kernel belongs to.
//
// Ops a replay cannot honour are recorded as graph breaks, with the reason:
//   a draw no random op follows: host code using random numbers, which a replay would not redraw;
//   a copy from a GPU to the host: the host reads a device value, which stops a captured graph.
#pragma once
#include <unordered_map>
#include <vector>

#include "compile/ir/graph.h"
#include "kernels/dispatch.h"

namespace reel::compile {

// What a replay could not honour, found while tracing (or a plan's host node, between CUDA graphs).
// `eager`: the traced call's result depends on it, so the signature runs eagerly from then on.
struct GraphBreak {
  std::string op;
  std::string reason;
  bool eager = false;
};

class Tracer : public DispatchObserver, public DrawObserver {
 public:
  // `inputs` are the call's arguments: their buffers become Input buffers.
  explicit Tracer(const std::vector<Tensor>& inputs);
  ~Tracer() override;
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  void start();  // installs the observer
  void stop();   // removes it
  void on_dispatch(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                   const Attrs& attrs, bool into_given) override;
  void on_host_read(const Tensor& t) override;
  void on_draw(Generator& gen, uint64_t offset, uint64_t counters) override;

  // The graph, with `outputs` (what the function returned) as its outputs. Call after stop().
  Graph finish(const std::vector<Tensor>& outputs);
  const std::vector<GraphBreak>& breaks() const { return breaks_; }

 private:
  int buffer_of(const Tensor& t, BufferKind kind_if_new);
  TensorRef ref_of(const Tensor& t, BufferKind kind_if_new);

  void note_releases();
  // Draws not followed by their random op are host code's: each becomes a graph break.
  void flush_host_draws();
  // Binds node n (a random op) to the draw that preceded it, if any.
  void bind_random(Node& n);

  struct Draw {
    Generator* gen;
    uint64_t offset, counters;
  };
  struct Source {
    uint64_t base = 0, end = 0;                 // first counter drawn, one past the last
    std::vector<std::pair<Device, int>> state;  // its state buffer per device
  };
  std::vector<Draw> pending_;  // draws since the last dispatch
  std::vector<std::pair<Generator*, Source>> sources_;

  Graph graph_;
  std::unordered_map<const Storage*, int> ids_;
  std::vector<int> held_;  // Internal buffers the traced program still references
  std::vector<GraphBreak> breaks_;
  DispatchObserver* previous_ = nullptr;
  DrawObserver* previous_draws_ = nullptr;
  bool active_ = false;
};

}  // namespace reel::compile
