// Tensor — a handle to a strided view of refcounted Storage, plus its autograd state.
//
// A tensor is (storage, shape, strides, offset, dtype): element i of a 2-D tensor lives at
// storage[offset + i0*strides[0] + i1*strides[1]]. Views (reshape, permute, slice, expand) make a
// new TensorImpl over the same Storage; contiguous() copies only when the strides are not row-major.
// Copying a Tensor copies the handle, not the data (like torch::Tensor).
//
// Autograd state: requires_grad, the accumulated .grad (params +=), and grad_fn, the Node that made
// this tensor. Methods that run ops (to, contiguous, sum, item, backward, ...) are declared here for
// the user's convenience and defined in autograd/tensor_methods.cpp, since ops live above this layer.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/shape.h"
#include "tensor/storage.h"

namespace reel {

namespace autograd {
class Node;
}

struct TensorImpl;

struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;              // accumulated gradient of a leaf
  std::shared_ptr<autograd::Node> grad_fn;       // the node that produced this tensor (non-leaf)
  uint32_t output_nr = 0;                        // which output of grad_fn this tensor is
  std::weak_ptr<autograd::Node> grad_accumulator;  // a leaf's AccumulateGrad node, shared by all uses
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;       // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  AutogradMeta autograd;
};

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor: a missing optional input or an absent gradient
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Uninitialised contiguous tensor.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  // Uninitialised dense tensor in `format` (ChannelsLast: a 4-D shape stored NHWC).
  static Tensor empty(const Shape& shape, DType dtype, Device device, MemoryFormat format);
  // A contiguous tensor over a given storage (which must hold at least numel * element size bytes).
  static Tensor from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype);
  // A view of `base`'s storage with the given geometry (no autograd state).
  static Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset);
  // A CPU tensor holding a copy of `values` (row-major), e.g. Tensor::from_vector<float>({1,2,3,4}, {2,2}).
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl()->shape; }
  const Shape& strides() const { return impl()->strides; }
  int64_t offset() const { return impl()->offset; }
  int64_t dim() const { return int64_t(impl()->shape.size()); }
  int64_t size(int64_t d) const;
  int64_t numel() const { return numel_of(impl()->shape); }
  DType dtype() const { return impl()->dtype; }
  Device device() const { return impl()->storage->device(); }
  size_t element_size() const { return dtype_size(dtype()); }
  size_t nbytes() const { return size_t(numel()) * element_size(); }
  bool is_contiguous() const;
  // Dense in `format`: is_contiguous() for Contiguous; NHWC strides for ChannelsLast.
  bool is_contiguous(MemoryFormat format) const { return has_format(shape(), strides(), format); }
  // ChannelsLast when the tensor is channels-last and not also contiguous (a size-1 C, H and W make
  // both true), else Contiguous: the layout an op's result or gradient should keep.
  MemoryFormat suggested_format() const;

  // Pointer to element 0 of this view (storage base + offset).
  void* data_ptr() const;
  template <typename T>
  T* data() const;
  const std::shared_ptr<Storage>& storage() const { return impl()->storage; }
  TensorImpl* impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }
  bool shares_storage(const Tensor& o) const { return defined() && o.defined() && storage() == o.storage(); }

  // ---- autograd ----
  bool requires_grad() const { return defined() && impl()->autograd.requires_grad; }
  // Marks a leaf as a parameter to differentiate (float dtypes only). Returns *this for chaining.
  Tensor& set_requires_grad(bool requires_grad = true);
  bool is_leaf() const { return impl()->autograd.grad_fn == nullptr; }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl()->autograd.grad_fn; }
  Tensor grad() const;  // undefined until a backward reaches this leaf
  void set_grad(const Tensor& g) const;
  // A new handle on the same data, cut from the graph (requires_grad false).
  Tensor detach() const;

  // ---- defined in autograd/tensor_methods.cpp (they run ops) ----
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor cpu() const { return to(Device::cpu()); }
  Tensor reshape(const Shape& shape) const;
  Tensor view(const Shape& shape) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const { return transpose(-2, -1); }
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor expand(const Shape& shape) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor sum(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor mean(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  // The single value of a one-element tensor, as double (any dtype, any device).
  double item() const;
  // All values, row-major, converted to T (copies to the host first if needed).
  template <typename T>
  std::vector<T> to_vector() const;
  std::string str() const;  // PyTorch-like printing

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace reel
