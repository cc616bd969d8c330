// Module — the base of every layer and model (like torch::nn::Module, held by std::shared_ptr).
//
// A module owns named parameters (leaf tensors that require grad), named buffers (state that is
// saved but not trained: BatchNorm's running statistics) and named child modules. Names are
// recursive and dotted in registration order ("blocks.0.qkv.weight"), the same order
// state_dict files use. Registry slots live in std::deque, so the Tensor& a layer keeps from
// register_parameter stays valid; to(Device)/to(DType) replace the tensor inside the slot with the
// moved one (a fresh leaf, requires_grad kept), so layers and parameters() both see the moved
// tensors. Handles taken earlier (an optimizer built before to()) still point at the old tensors:
// move the model first, then build the optimizer, as in PyTorch.
//
// Conventions: register_* refuse empty names, names with '.', and duplicates (reel::Error naming
// the module and the name). forward(x) is the single-input entry point; modules with other
// signatures (CrossEntropyLoss) add overloads.
#pragma once
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops.h"
#include "tensor/tensor.h"

namespace reel::nn {

class Module;
using ModulePtr = std::shared_ptr<Module>;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;             // slots are referenced by layers: no copies
  Module& operator=(const Module&) = delete;

  // The single-input forward; the default refuses (a module without one, e.g. a container of parts).
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  // ---- registration (returns the registered thing; the Tensor& stays valid for the module's life) ----
  Tensor& register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  Tensor& register_buffer(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

  // ---- inspection (recursive, dotted names, registration order) ----
  NamedTensors named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  // Parameters and buffers together, module by module (own parameters, own buffers, then children):
  // the contents and order of a state_dict file.
  NamedTensors named_state() const;
  std::vector<std::pair<std::string, ModulePtr>> named_children() const;
  std::vector<ModulePtr> children() const;
  // Every module below this one (not itself), depth first, with dotted names.
  std::vector<std::pair<std::string, ModulePtr>> named_modules() const;
  int64_t num_parameters() const;  // total elements of all parameters
  const std::string& type_name() const { return type_name_; }

  // ---- modes and placement ----
  void train(bool on = true);  // recursive
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves parameters (and their gradients) and all buffers. Returns *this for chaining.
  Module& to(Device device);
  // Casts parameters (and gradients) and floating buffers; dtype must be a float type.
  Module& to(DType dtype);
  // Frees every parameter's .grad (set_to_none), or zeroes the existing ones in place.
  void zero_grad(bool set_to_none = true);

 protected:
  struct Slot {
    std::string name;
    Tensor tensor;
  };

 private:
  void add_child(const std::string& name, ModulePtr m);
  void check_new_name(const std::string& name, const char* what) const;
  void collect(const std::string& prefix, bool params, bool buffers, bool recurse, NamedTensors& out) const;
  template <typename Fn>
  void convert_all(Fn&& fn);

  std::string type_name_;
  bool training_ = true;
  std::deque<Slot> params_;
  std::deque<Slot> buffers_;
  std::vector<std::pair<std::string, ModulePtr>> children_;
};

}  // namespace reel::nn
