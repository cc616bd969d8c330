// Phase labels — which part of a training step the calling thread is in ("micro-batch 0", ...,
// "optimizer"), for whoever watches ops at the dispatch door.
//
//   { PhaseScope phase("micro-batch 0"); ... loss.backward(); }   // ops dispatched here carry the label
//
// The label is per thread, like the dispatch observer: the compiler's tracer stores it on each node
// it records (compile/ir/graph.h: Node::phase), so a plan replayed long after the scope closed still
// knows where each kernel came from, and an eager op observer reads it as each op passes. It lives
// here, below autograd and optim, so that optim::train_step can set it and compile/ read it without
// either knowing the other. Scopes nest: the innermost label is the current one, and the outer one is
// back when it closes. Outside any scope the label is "".
#pragma once
#include <string>

namespace reel {

class PhaseScope {
 public:
  explicit PhaseScope(std::string label);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  std::string previous_;
};

// The calling thread's innermost label ("" outside any scope).
const std::string& current_phase();

}  // namespace reel
