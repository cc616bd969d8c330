// Module: the registry of parameters, buffers and children, and the recursive walks over it.
// See module.h for the naming and to() conventions.
#include "nn/module.h"

#include "autograd/grad_mode.h"

namespace reel::nn {

Tensor Module::forward(const Tensor& x) {
  REEL_CHECK(false, type_name_, ".forward: this module has no single-input forward (input ", shape_str(x.shape()),
             ")");
  return Tensor();
}

void Module::check_new_name(const std::string& name, const char* what) const {
  REEL_CHECK(!name.empty(), type_name_, ".", what, ": name must not be empty");
  REEL_CHECK(name.find('.') == std::string::npos, type_name_, ".", what, ": name '", name,
             "' must not contain '.' (dots join the names of nested modules)");
  auto taken = [&](const std::deque<Slot>& slots) {
    for (const auto& s : slots)
      if (s.name == name) return true;
    return false;
  };
  bool child = false;
  for (const auto& c : children_) child = child || c.first == name;
  REEL_CHECK(!taken(params_) && !taken(buffers_) && !child, type_name_, ".", what, ": name '", name,
             "' is already registered");
}

Tensor& Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name, "register_parameter");
  REEL_CHECK(t.defined(), type_name_, ".register_parameter: tensor '", name, "' is undefined");
  REEL_CHECK(is_floating(t.dtype()), type_name_, ".register_parameter: '", name, "' has dtype ",
             dtype_name(t.dtype()), ", parameters must be float");
  if (!t.is_leaf()) t = t.detach();  // a parameter is a leaf of every graph it enters
  t.set_requires_grad(requires_grad);
  params_.push_back({name, t});
  return params_.back().tensor;
}

Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name, "register_buffer");
  REEL_CHECK(t.defined(), type_name_, ".register_buffer: tensor '", name, "' is undefined");
  buffers_.push_back({name, t.detach()});
  return buffers_.back().tensor;
}

void Module::add_child(const std::string& name, ModulePtr m) {
  check_new_name(name, "register_module");
  REEL_CHECK(m != nullptr, type_name_, ".register_module: module '", name, "' is null");
  REEL_CHECK(m.get() != this, type_name_, ".register_module: a module cannot be its own child ('", name, "')");
  children_.emplace_back(name, std::move(m));
}

void Module::collect(const std::string& prefix, bool params, bool buffers, bool recurse, NamedTensors& out) const {
  if (params)
    for (const auto& s : params_) out.emplace_back(prefix + s.name, s.tensor);
  if (buffers)
    for (const auto& s : buffers_) out.emplace_back(prefix + s.name, s.tensor);
  if (!recurse) return;
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", params, buffers, true, out);
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out;
  collect("", true, false, recurse, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  collect("", false, true, recurse, out);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

NamedTensors Module::named_state() const {
  NamedTensors out;
  collect("", true, true, true, out);
  return out;
}

std::vector<std::pair<std::string, ModulePtr>> Module::named_children() const { return children_; }

std::vector<ModulePtr> Module::children() const {
  std::vector<ModulePtr> out;
  for (const auto& c : children_) out.push_back(c.second);
  return out;
}

std::vector<std::pair<std::string, ModulePtr>> Module::named_modules() const {
  std::vector<std::pair<std::string, ModulePtr>> out;
  for (const auto& [name, child] : children_) {
    out.emplace_back(name, child);
    for (auto& [sub, m] : child->named_modules()) out.emplace_back(name + "." + sub, m);
  }
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& c : children_) c.second->train(on);
}

// Applies fn (Tensor -> Tensor, or the same handle for "unchanged") to every parameter, gradient and
// buffer of this module and its children, re-making parameters as leaves.
template <typename Fn>
void Module::convert_all(Fn&& fn) {
  NoGradGuard guard;
  for (auto& s : params_) {
    Tensor moved = fn(s.tensor);
    if (moved.is_same(s.tensor)) continue;
    Tensor leaf = moved.detach();
    leaf.set_requires_grad(s.tensor.requires_grad());
    Tensor g = s.tensor.grad();
    if (g.defined()) leaf.set_grad(fn(g).detach());
    s.tensor = leaf;
  }
  for (auto& s : buffers_) {
    Tensor moved = fn(s.tensor);
    if (!moved.is_same(s.tensor)) s.tensor = moved.detach();
  }
  for (auto& c : children_) c.second->convert_all(fn);
}

Module& Module::to(Device device) {
  convert_all([&](const Tensor& t) { return t.device() == device ? t : t.to(device); });
  return *this;
}

Module& Module::to(DType dtype) {
  REEL_CHECK(is_floating(dtype), type_name_, ".to: dtype ", dtype_name(dtype),
             " is not a float type (parameters must be f32, f64, f16 or bf16)");
  convert_all([&](const Tensor& t) { return (t.dtype() == dtype || !is_floating(t.dtype())) ? t : t.to(dtype); });
  return *this;
}

void Module::zero_grad(bool set_to_none) {
  for (auto& p : parameters()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      NoGradGuard guard;
      zero_(g);
    }
  }
}

}  // namespace reel::nn
