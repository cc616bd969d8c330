// Tensor's convenience methods that run ops: each forwards to the functional API in autograd/ops.h.
#include <cstring>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"

namespace reel {

void Tensor::backward(const Tensor& grad, bool retain_graph) const { autograd::backward(*this, grad, retain_graph); }
Tensor Tensor::contiguous() const { return reel::contiguous(*this); }
Tensor Tensor::clone() const { return reel::clone(*this); }
Tensor Tensor::to(DType dtype) const { return to_dtype(*this, dtype); }
Tensor Tensor::to(Device device) const { return to_device(*this, device); }
Tensor Tensor::reshape(const Shape& shape) const { return reel::reshape(*this, shape); }
Tensor Tensor::view(const Shape& shape) const { return reel::view(*this, shape); }
Tensor Tensor::permute(const std::vector<int64_t>& dims) const { return reel::permute(*this, dims); }
Tensor Tensor::transpose(int64_t d0, int64_t d1) const { return reel::transpose(*this, d0, d1); }
Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  return reel::slice(*this, dim, start, end, step);
}
Tensor Tensor::expand(const Shape& shape) const { return reel::expand(*this, shape); }
Tensor Tensor::unsqueeze(int64_t dim) const { return reel::unsqueeze(*this, dim); }
Tensor Tensor::squeeze(int64_t dim) const { return reel::squeeze(*this, dim); }
Tensor Tensor::sum(const std::vector<int64_t>& dims, bool keepdim) const { return reel::sum(*this, dims, keepdim); }
Tensor Tensor::mean(const std::vector<int64_t>& dims, bool keepdim) const { return reel::mean(*this, dims, keepdim); }

template <typename T>
std::vector<T> Tensor::to_vector() const {
  if (DispatchObserver* observer = dispatch_observer()) observer->on_host_read(*this);
  Tensor host;
  {
    NoGradGuard no_grad;
    host = reel::contiguous(to_dtype(to_device(*this, Device::cpu()), DTypeOf<T>::value));
  }
  std::vector<T> out(size_t(host.numel()));
  if (!out.empty()) std::memcpy(out.data(), host.data_ptr(), out.size() * sizeof(T));
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<Half> Tensor::to_vector<Half>() const;
template std::vector<BFloat16> Tensor::to_vector<BFloat16>() const;

double Tensor::item() const {
  REEL_CHECK(numel() == 1, "item: only a one-element tensor has an item, got shape ", shape_str(shape()));
  if (dtype() == DType::i64) return double(to_vector<int64_t>()[0]);
  return to_vector<double>()[0];
}

}  // namespace reel
