#include "autograd/engine.h"

#include <queue>
#include <unordered_map>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/error.h"

namespace reel::autograd {
namespace {

// Number of edges into each node reachable from `root`: a node runs once all of them delivered.
std::unordered_map<Node*, int> count_dependencies(const std::shared_ptr<Node>& root,
                                                  std::unordered_map<Node*, std::shared_ptr<Node>>& alive) {
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack{root.get()};
  alive[root.get()] = root;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.fn) continue;
      if (deps[e.fn.get()]++ == 0 && !alive.count(e.fn.get())) {
        alive[e.fn.get()] = e.fn;
        stack.push_back(e.fn.get());
      }
    }
  }
  return deps;
}

void accumulate(Tensor& slot, const Tensor& g) { slot = slot.defined() ? add(slot, g) : g; }

}  // namespace

void backward(const Tensor& root, const Tensor& grad, bool retain_graph) {
  REEL_CHECK(root.defined(), "backward: called on an undefined tensor");
  REEL_CHECK(root.requires_grad(), "backward: the tensor of shape ", shape_str(root.shape()),
             " does not require grad (no input on its path has requires_grad set)");
  Tensor g = grad;
  if (!g.defined()) {
    REEL_CHECK(root.numel() == 1, "backward: a gradient can be created implicitly only for a one-element output, "
               "but the output has shape ", shape_str(root.shape()), "; pass a gradient of that shape");
    g = ones_like(root);
  } else {
    REEL_CHECK(g.shape() == root.shape() && g.dtype() == root.dtype() && g.device() == root.device(),
               "backward: gradient ", shape_str(g.shape()), " ", g.dtype(), " on ", g.device().str(),
               " does not match the output ", shape_str(root.shape()), " ", root.dtype(), " on ", root.device().str());
  }
  Edge start = gradient_edge(root);
  NoGradGuard no_grad;

  std::unordered_map<Node*, std::shared_ptr<Node>> alive;
  std::unordered_map<Node*, int> deps = count_dependencies(start.fn, alive);
  std::unordered_map<Node*, Grads> buffers;
  buffers[start.fn.get()].resize(start.fn->num_outputs);
  buffers[start.fn.get()][start.input_nr] = g;

  // Later-created nodes first: a valid reverse topological order for a graph built by running ops.
  auto later_first = [](Node* a, Node* b) { return a->sequence_nr < b->sequence_nr; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(later_first)> ready(later_first);
  ready.push(start.fn.get());
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    Grads in = std::move(buffers[node]);
    buffers.erase(node);
    in.resize(node->num_outputs);
    Grads out = node->apply(in);
    if (!retain_graph) node->release();
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.fn) continue;
      if (i < out.size() && out[i].defined()) {
        REEL_ASSERT(out[i].shape() == node->input_shapes[i] && out[i].dtype() == node->input_dtypes[i],
                    node->name(), " returned gradient ", shape_str(out[i].shape()), " ", out[i].dtype(),
                    " for input ", i, " of shape ", shape_str(node->input_shapes[i]), " ", node->input_dtypes[i]);
        Grads& buf = buffers[e.fn.get()];
        buf.resize(e.fn->num_outputs);
        accumulate(buf[e.input_nr], out[i]);
      }
      if (--deps[e.fn.get()] == 0) ready.push(e.fn.get());
    }
  }
}

}  // namespace reel::autograd
