// Node — one recorded op of the autograd graph, and the helper that records it.
//
// Running a differentiable op under grad mode creates a Node holding (a) an Edge to the producer of
// each input that needs a gradient and (b) a backward closure written in ops. The graph of Nodes is
// the tape that backward() walks in reverse. Leaves that require grad are reached through an
// AccumulateGrad node, which does `leaf.grad += g` (llm.c's "params +=": what gradient accumulation
// needs). Saved tensors are stored detached, so a node never owns its own output (no cycles).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "tensor/tensor.h"

namespace reel::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> fn;  // null: this input needs no gradient
  uint32_t input_nr = 0;     // which output of fn the input was
};

// Backward closure: gradients w.r.t. the op's outputs -> gradients w.r.t. its inputs. An output
// that received no gradient is passed as an undefined Tensor; an undefined result means "no gradient".
using Grads = std::vector<Tensor>;
using BackwardFn = std::function<Grads(const Grads& grad_outputs)>;

class Node {
 public:
  virtual ~Node() = default;
  virtual Grads apply(const Grads& grad_outputs) = 0;
  virtual std::string name() const = 0;
  // Drops saved tensors once backward has used them (unless retain_graph).
  virtual void release() {}

  std::vector<Edge> next_edges;  // one per input of the op
  std::vector<Shape> input_shapes;   // to check each gradient against its input
  std::vector<DType> input_dtypes;
  uint32_t num_outputs = 1;
  uint64_t sequence_nr = 0;      // creation order: later nodes run first in backward
};

// A node whose backward is a closure (the common case; see autograd/functions/).
class FunctionNode : public Node {
 public:
  FunctionNode(std::string name, BackwardFn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  Grads apply(const Grads& grad_outputs) override;
  std::string name() const override { return name_; }
  void release() override { fn_ = nullptr; }

 private:
  std::string name_;
  BackwardFn fn_;
};

// The sink for a leaf: leaf.grad = g on first arrival (a private copy), leaf.grad += g afterwards.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) { num_outputs = 1; }
  Grads apply(const Grads& grad_outputs) override;
  std::string name() const override { return "AccumulateGrad"; }
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// True when grad mode is on and any input requires grad: the op must record a node.
bool needs_grad(const std::vector<Tensor>& inputs);
// The edge that carries a gradient back to `t` (its grad_fn, its AccumulateGrad, or none).
Edge gradient_edge(const Tensor& t);

// Records a node named `name` linking `outputs` (those that are differentiable) to `inputs`, when
// needs_grad(inputs). The closure receives one gradient per output and returns one per input.
void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            BackwardFn backward);

// A tensor to capture in a backward closure: same data, no grad_fn (so no ownership cycles).
inline Tensor saved(const Tensor& t) { return t.defined() ? t.detach() : Tensor(); }

}  // namespace reel::autograd
