#include "tensor/tensor.h"

#include <cstring>

#include "tensor/error.h"

namespace reel {

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t s : shape) REEL_CHECK(s >= 0, "empty: negative size in shape ", shape_str(shape));
  const size_t numel = size_t(numel_of(shape)), bytes = numel * dtype_size(dtype);
  REEL_CHECK(numel == 0 || bytes / numel == dtype_size(dtype), "empty: shape ", shape_str(shape), " of ",
             dtype_name(dtype), " needs more bytes than a size_t holds");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(bytes, device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, MemoryFormat format) {
  Tensor t = empty(shape, dtype, device);
  if (format == MemoryFormat::Contiguous) return t;
  t.impl()->strides = strides_for(shape, format);
  return t;
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype) {
  REEL_ASSERT(storage->nbytes() >= size_t(numel_of(shape)) * dtype_size(dtype), "storage too small for ",
              shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  REEL_CHECK(int64_t(values.size()) == numel_of(shape), "from_vector: ", values.size(),
             " values cannot fill shape ", shape_str(shape), " (", numel_of(shape), " elements)");
  Tensor t = empty(shape, DTypeOf<T>::value, Device::cpu());
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(T));
  return t;
}
template Tensor Tensor::from_vector(const std::vector<float>&, const Shape&);
template Tensor Tensor::from_vector(const std::vector<double>&, const Shape&);
template Tensor Tensor::from_vector(const std::vector<Half>&, const Shape&);
template Tensor Tensor::from_vector(const std::vector<BFloat16>&, const Shape&);
template Tensor Tensor::from_vector(const std::vector<int64_t>&, const Shape&);

TensorImpl* Tensor::impl() const {
  REEL_CHECK(impl_ != nullptr, "tensor: use of an undefined tensor");
  return impl_.get();
}

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape().size(); i-- > 0;) {
    if (shape()[i] == 1) continue;
    if (strides()[i] != expected) return false;
    expected *= shape()[i];
  }
  return true;
}

MemoryFormat Tensor::suggested_format() const {
  return !is_contiguous() && is_contiguous(MemoryFormat::ChannelsLast) ? MemoryFormat::ChannelsLast
                                                                        : MemoryFormat::Contiguous;
}

void* Tensor::data_ptr() const {
  REEL_CHECK(!storage()->is_meta(), "data_ptr: meta tensor of shape ", shape_str(shape()), " ", dtype_name(dtype()),
             " on ", device().str(), " has no data (it was made in meta mode, to plan a step without running it)");
  return static_cast<char*>(storage()->data()) + offset() * int64_t(element_size());
}

template <typename T>
T* Tensor::data() const {
  REEL_CHECK(DTypeOf<std::remove_const_t<T>>::value == dtype(), "data<", dtype_name(DTypeOf<std::remove_const_t<T>>::value),
             ">: tensor holds ", dtype_name(dtype()));
  return static_cast<T*>(data_ptr());
}
template float* Tensor::data<float>() const;
template double* Tensor::data<double>() const;
template Half* Tensor::data<Half>() const;
template BFloat16* Tensor::data<BFloat16>() const;
template int64_t* Tensor::data<int64_t>() const;

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  REEL_CHECK(!requires_grad || is_floating(dtype()), "requires_grad: only float tensors can require grad, got ",
             dtype_name(dtype()));
  REEL_CHECK(is_leaf(), "requires_grad: can only be set on a leaf tensor (this one was made by ",
             "an op; use detach() first)");
  impl()->autograd.requires_grad = requires_grad;
  return *this;
}

Tensor Tensor::grad() const {
  const auto& g = impl()->autograd.grad;
  return g ? Tensor(g) : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined())
    REEL_CHECK(g.shape() == shape() && g.dtype() == dtype(), "set_grad: gradient ", shape_str(g.shape()), " ",
               g.dtype(), " does not match tensor ", shape_str(shape()), " ", dtype());
  impl()->autograd.grad = g.impl_;
}

Tensor Tensor::detach() const {
  return make_view(*this, shape(), strides(), offset());
}

}  // namespace reel
