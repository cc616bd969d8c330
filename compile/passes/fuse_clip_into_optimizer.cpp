// The clip folded into the optimizer's update. A step that clips its gradients by their global norm
// (optim/clip.h) reads and writes every gradient once more between the norm and the update:
//
//   n: total = global_norm(g0 .. gk)                                   reads every g
//      coef  = min(1, max_norm / (total + eps))                        a scalar kernel
//   c: g0 .. gk (, found_inf) = unscale_check(g0 .. gk, coef (, found_inf))   g *= coef in place
//   d: p, m, v ... = multi_tensor_adamw(p0 g0 m0 v0 ..., found_inf?, lr, step)   reads every g
//
// Node c goes: d takes coef as one more step-wide input (attr clip) and reads each g as g * coef,
// rounded to g's dtype as unscale_check stores it, so the update sees the same bits; it also stores
// that value back into g (attr clip_writes_grad) unless nothing reads the gradients after it (a step
// that drops them, as zero_grad(set_to_none) does). Where c also raises found_inf (a gradient inf or
// NaN: the GradScaler's step, whose unscaled gradients may overflow), that check moves into the norm
// node n, which reads the same gradients (attr check_finite: a block whose sum of squares is not
// finite walks its elements again): found_inf then holds at n what it held after c, as nothing
// between them touches it. Unscaled steps pass no flag to the clip (optim/optimizer.cpp says why).
//
// Applies when the first nodes after c to read the gradients are multi-tensor updates (the optimizer
// pass's) that read exactly c's gradients between them, nothing else touches a gradient before the
// last of them, nothing writes coef before it, and the flag, if c checks one that is read later, can
// move into a norm of the same gradients before c. One kernel fewer per step and a read and a write
// of every gradient (gpt-small: 25.6 M f32, 0.2 GB a step).
//
// The same bits as the unfused step on the CPU and the GPU (kernels/optim_math.h writes the update's
// multiply-adds explicitly, so the fused kernel rounds as the per-tensor one does). Measured on an
// H100 beside the step without it (bench/RESULTS.md, fifteenth step): gpt-small 1.2%, gpt-tiny 0.6%,
// cnn-small 0.8% faster (bf16).
#include <algorithm>
#include <set>

#include "compile/passes/passes.h"
#include "kernels/multi_tensor.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "clip_into_optimizer";

bool is_multi_tensor_update(const Node& n) {
  return (n.op == OpKind::MultiTensorAdamW || n.op == OpKind::MultiTensorSgd) && !n.attrs.b("clip", false);
}

// The gradient inputs of a multi-tensor update, in its tensors' order.
std::vector<TensorRef> update_grads(const Node& n) {
  const MultiTensorLayout& l = multi_tensor_layout(n.op);
  std::vector<TensorRef> grads;
  for (int64_t t = 0; t < n.attrs.i("tensors"); ++t) grads.push_back(*n.inputs[size_t(t) * l.per_tensor + 1]);
  return grads;
}

bool contains(const std::vector<TensorRef>& set, const TensorRef& r) {
  return std::any_of(set.begin(), set.end(), [&](const TensorRef& s) { return same_ref(s, r); });
}

bool same_set(const std::vector<TensorRef>& a, const std::vector<TensorRef>& b) {
  return a.size() == b.size() && std::all_of(a.begin(), a.end(), [&](const TensorRef& r) { return contains(b, r); });
}

// Whether a node after `after` reads or writes the buffer, or the step returns it or keeps it
// (not an Internal buffer): whether a value stored there is seen again.
bool seen_after(const Graph& g, const BufferUses& u, int buffer, int after) {
  if (g.buffers[size_t(buffer)].kind != BufferKind::Internal) return true;
  const std::vector<int>& t = u.touches[size_t(buffer)];
  const bool returned = !u.readers[size_t(buffer)].empty() && u.readers[size_t(buffer)].back() >= int(g.nodes.size());
  return returned || (!t.empty() && t.back() > after);
}

struct Match {
  std::vector<int> updates;  // the multi-tensor updates that read c's gradients, in order
  int norm = -1;             // the norm that takes c's inf/NaN check, or -1 (no flag to keep)
  bool writes_grad = false;  // whether the updates store the clipped gradients
};

// The updates that read node c's gradients, and where its flag goes; nullopt with the reason in `why`.
std::optional<Match> match(const Graph& g, const BufferUses& u, int c, Why& why) {
  const Node& n = g.nodes[size_t(c)];
  const bool check = n.attrs.b("check_finite", true);
  const size_t k = n.inputs.size() - (check ? 2 : 1);
  if (!why(k >= 1 && n.outputs.size() == k + (check ? 1 : 0), "it scales no gradient")) return std::nullopt;
  std::vector<TensorRef> grads;
  for (size_t i = 0; i < k; ++i) {
    if (!why(n.inputs[i] && same_ref(*n.inputs[i], n.outputs[i]), "a gradient is not updated in place"))
      return std::nullopt;
    grads.push_back(n.outputs[i]);
  }
  const TensorRef& coef = *n.inputs[k];
  Match m;
  // The first node after c to touch each gradient must be a multi-tensor update reading it.
  std::set<int> updates;
  for (const TensorRef& r : grads) {
    const std::vector<int>& t = u.touches[size_t(r.buffer)];
    const auto next = std::upper_bound(t.begin(), t.end(), c);
    if (!why(next != t.end() && *next < int(g.nodes.size()), "a gradient is not read after it")) return std::nullopt;
    const Node& d = g.nodes[size_t(*next)];
    if (!why(is_multi_tensor_update(d), "the next node to touch a gradient is not a multi-tensor optimizer update"))
      return std::nullopt;
    updates.insert(*next);
  }
  m.updates.assign(updates.begin(), updates.end());
  std::vector<TensorRef> updated;
  for (int d : m.updates) {
    const std::vector<TensorRef> dg = update_grads(g.nodes[size_t(d)]);
    updated.insert(updated.end(), dg.begin(), dg.end());
  }
  if (!why(same_set(updated, grads), "the updates read other gradients than it scales")) return std::nullopt;
  const int last = m.updates.back();
  for (const TensorRef& r : grads)
    for (int t : u.touches[size_t(r.buffer)])
      if (t > c && t < last && !updates.count(t)) {
        why(false, "a node between it and the update touches a gradient");
        return std::nullopt;
      }
  if (!why(!u.written_between(coef.buffer, c, last), "the coefficient is written before the update"))
    return std::nullopt;
  for (const TensorRef& r : grads) m.writes_grad = m.writes_grad || seen_after(g, u, r.buffer, last);
  if (!check || !seen_after(g, u, n.outputs[k].buffer, c)) return m;
  // The flag: the norm of the same gradients before c takes the check, if nothing between them
  // writes a gradient (the norm sees what c would) or touches the flag (nothing sees it early).
  const int flag = n.outputs[k].buffer;
  for (int i = c - 1; i >= 0; --i) {
    const Node& x = g.nodes[size_t(i)];
    if (!why(!refers_to(x, flag), "found_inf is touched between the gradients' norm and it")) return std::nullopt;
    if (x.op != OpKind::GlobalNorm || x.attrs.b("check_finite", false)) {
      for (const TensorRef& r : grads)
        if (std::any_of(x.outputs.begin(), x.outputs.end(), [&](const TensorRef& o) { return o.buffer == r.buffer; })) {
          why(false, "a gradient is written between their norm and it");
          return std::nullopt;
        }
      continue;
    }
    std::vector<TensorRef> normed;
    for (const auto& r : x.inputs)
      if (r) normed.push_back(*r);
    if (!why(same_set(normed, grads), "the norm before it is of other tensors than it scales")) return std::nullopt;
    m.norm = i;
    return m;
  }
  why(false, "it checks found_inf and no norm of its gradients comes before it");
  return std::nullopt;
}

// Update d with the clip: coef after its step-wide inputs, and each tensor's gradient as one more
// output after its own when the clipped values are kept.
Node with_clip(const Node& d, const TensorRef& coef, bool writes_grad) {
  Node m = d;
  m.attrs.set("clip", true).set("clip_writes_grad", writes_grad);
  m.inputs.push_back(coef);
  if (writes_grad) {
    const size_t tensors = size_t(d.attrs.i("tensors")), per = d.outputs.size() / tensors;
    const std::vector<TensorRef> grads = update_grads(d);
    m.outputs.clear();
    for (size_t t = 0; t < tensors; ++t) {
      m.outputs.insert(m.outputs.end(), d.outputs.begin() + long(t * per), d.outputs.begin() + long((t + 1) * per));
      m.outputs.push_back(grads[t]);
    }
  }
  m.fused.push_back("unscale_check");
  return m;
}

}  // namespace

void fuse_clip_into_optimizer(Graph& g, PassStats& stats) {
  const BufferUses u = buffer_uses(g);
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t c = 0; c < g.nodes.size(); ++c) {
    if (g.nodes[c].op != OpKind::UnscaleCheck) continue;
    Why why;
    const std::optional<Match> m = match(g, u, int(c), why);
    if (!m) {
      why_not(kPass, g, c, "the optimizer update after it", why.reason());
      continue;
    }
    const Node& clip = g.nodes[c];
    const bool check = clip.attrs.b("check_finite", true);
    const size_t k = clip.inputs.size() - (check ? 2 : 1);
    std::vector<Node> rewritten;
    for (int d : m->updates) rewritten.push_back(with_clip(g.nodes[size_t(d)], *clip.inputs[k], m->writes_grad));
    std::optional<Node> norm;
    if (m->norm >= 0) {
      norm = g.nodes[size_t(m->norm)];
      norm->attrs.set("check_finite", true);
      norm->inputs.push_back(clip.outputs[k]);
      norm->outputs.push_back(clip.outputs[k]);
      norm->in_place = true;  // found_inf existed before it
      if (norm->fused.empty()) norm->fused.push_back(op_name(norm->op));
      norm->fused.push_back("unscale_check");
    }
    const bool supported =
        std::all_of(rewritten.begin(), rewritten.end(), [&](const Node& n) { return call_supported(g, n); }) &&
        (!norm || call_supported(g, *norm));
    if (!supported) {
      why_not(kPass, g, c, "the optimizer update after it", "the device's kernel does not take the call");
      continue;
    }
    for (size_t i = 0; i < m->updates.size(); ++i) g.nodes[size_t(m->updates[i])] = std::move(rewritten[i]);
    if (norm) g.nodes[size_t(m->norm)] = std::move(*norm);
    drop[c] = true;
    ++stats.fused;
  }
  drop_nodes(g, drop);
}

}  // namespace reel::compile
