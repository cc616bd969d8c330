// Recording nodes and the two node kinds: closures and leaf accumulators.
#include "autograd/node.h"

#include <atomic>

#include "autograd/ops.h"
#include "tensor/error.h"

namespace reel::autograd {
namespace {
// From 1: 0 is AccumulateGrad's, which must run after every function node that is ready with it.
// (Starting at 0 gave the process's first recorded op the same priority as the accumulators, so the
// first backward of a process ran its ops in another order than every later one.)
std::atomic<uint64_t> next_sequence_nr{1};
}

Grads FunctionNode::apply(const Grads& grad_outputs) {
  REEL_CHECK(fn_ != nullptr, "backward: the graph through ", name_,
             " was already freed by an earlier backward; pass retain_graph=true to the first backward "
             "to go through it again");
  return fn_(grad_outputs);
}

Grads AccumulateGrad::apply(const Grads& grad_outputs) {
  const Tensor& g = grad_outputs[0];
  if (!g.defined()) return {};
  REEL_ASSERT(g.shape() == leaf_->shape && g.dtype() == leaf_->dtype, "gradient ", shape_str(g.shape()), " ",
              g.dtype(), " for leaf ", shape_str(leaf_->shape), " ", leaf_->dtype);
  auto& slot = leaf_->autograd.grad;
  if (!slot) {
    // A private copy: g may be shared with another leaf's gradient or be a broadcast view.
    slot = clone(g).impl_ptr();
  } else {
    add_(Tensor(slot), g);  // params +=
  }
  return {};
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  AutogradMeta& meta = t.impl()->autograd;
  if (meta.grad_fn) return {meta.grad_fn, meta.output_nr};
  std::shared_ptr<Node> acc = meta.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    meta.grad_accumulator = acc;
  }
  return {acc, 0};
}

void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            BackwardFn backward) {
  if (!needs_grad(inputs)) return;
  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  node->sequence_nr = next_sequence_nr.fetch_add(1);
  node->num_outputs = uint32_t(outputs.size());
  for (const Tensor& t : inputs) {
    node->next_edges.push_back(gradient_edge(t));
    node->input_shapes.push_back(t.defined() ? t.shape() : Shape{});
    node->input_dtypes.push_back(t.defined() ? t.dtype() : DType::f32);
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    const Tensor& out = outputs[k];
    if (!out.defined() || !is_floating(out.dtype())) continue;
    AutogradMeta& meta = out.impl()->autograd;
    meta.grad_fn = node;
    meta.output_nr = uint32_t(k);
    meta.requires_grad = true;
  }
}

}  // namespace reel::autograd
