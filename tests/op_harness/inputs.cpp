// Input builders and call placement of the op harness (conventions: inputs.h).
#include "tests/op_harness/inputs.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>

#include "autograd/ops.h"

namespace reel::harness {
namespace {

// f64 values on the CPU -> the dtype asked for (i64: rounded toward zero).
Tensor cast_values(const Tensor& f64, DType dtype) {
  NoGradGuard no_grad;
  return dtype == DType::f64 ? f64 : to_dtype(f64, dtype);
}

// A tensor of logical shape `shape` in `layout`, its storage filled by draw(storage shape).
Tensor lay_out(const Shape& shape, Layout layout, const std::function<Tensor(const Shape&)>& draw) {
  NoGradGuard no_grad;
  if (layout == Layout::transposed && shape.size() >= 2) {
    Shape stored = shape;
    std::swap(stored[stored.size() - 1], stored[stored.size() - 2]);
    return transpose(draw(stored), -1, -2);
  }
  if (layout == Layout::strided && !shape.empty()) {
    Shape stored = shape;
    stored[0] = 2 * shape[0] + 1;
    return slice(draw(stored), 0, 1, stored[0], 2);
  }
  if (layout == Layout::channels_last && shape.size() == 4)
    return permute(draw({shape[0], shape[2], shape[3], shape[1]}), {0, 3, 1, 2});
  return draw(shape);
}

}  // namespace

Tensor randn_input(const Shape& shape, DType dtype, uint64_t seed, Layout layout, double scale, double shift) {
  return lay_out(shape, layout, [&](const Shape& s) {
    Generator gen(seed);
    return cast_values(normal(s, shift, scale, TensorOptions{DType::f64}, &gen), dtype);
  });
}

Tensor uniform_input(const Shape& shape, DType dtype, uint64_t seed, double lo, double hi, Layout layout) {
  return lay_out(shape, layout, [&](const Shape& s) {
    Generator gen(seed);
    return cast_values(uniform(s, lo, hi, TensorOptions{DType::f64}, &gen), dtype);
  });
}

Tensor distinct_input(const Shape& shape, DType dtype, uint64_t seed, Layout layout) {
  return lay_out(shape, layout, [&](const Shape& s) {
    const int64_t n = numel_of(s);
    REEL_CHECK(n <= 256, "distinct_input: ", n, " values would not all be exact in bf16");
    Generator gen(seed);
    std::vector<double> keys = uniform({n}, 0.0, 1.0, TensorOptions{DType::f64}, &gen).to_vector<double>();
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
    std::vector<double> v(static_cast<size_t>(n));
    const double step = dtype == DType::i64 ? 1.0 : 0.125;
    for (int64_t k = 0; k < n; ++k) v[size_t(order[k])] = double(k - n / 2) * step;
    return values_input(v, s, dtype);
  });
}

Tensor integer_input(const Shape& shape, DType dtype, uint64_t seed, int64_t lo, int64_t hi, Layout layout) {
  return lay_out(shape, layout, [&](const Shape& s) {
    Generator gen(seed);
    std::vector<double> v = uniform(s, 0.0, 1.0, TensorOptions{DType::f64}, &gen).to_vector<double>();
    for (double& x : v) x = double(lo + std::min<int64_t>(int64_t(x * double(hi - lo + 1)), hi - lo));
    return values_input(v, s, dtype);
  });
}

Tensor index_input(const Shape& shape, int64_t n, uint64_t seed) {
  return integer_input(shape, DType::i64, seed, 0, n - 1);
}

Tensor values_input(const std::vector<double>& values, const Shape& shape, DType dtype) {
  return cast_values(Tensor::from_vector<double>(values, shape), dtype);
}

Tensor scalar_input(double value, DType dtype) { return values_input({value}, {}, dtype); }

Tensor expanded(const Tensor& small, const Shape& shape) {
  NoGradGuard no_grad;
  return expand(small, shape);
}

Attrs with_device(Attrs attrs, Device device) {
  return attrs.set("device_type", int64_t(device.type)).set("device_index", int64_t(device.index));
}

OpCall place(const OpCall& call, Device device) {
  if (device.is_cpu()) return call;
  NoGradGuard no_grad;
  std::map<const Storage*, std::shared_ptr<Storage>> copies;  // CPU storage -> its copy on `device`
  auto moved = [&](const Tensor& t) -> Tensor {
    if (!t.defined()) return t;
    REEL_CHECK(t.device().is_cpu(), "place: a case built a tensor on ", t.device().str(), "; build on the CPU");
    std::shared_ptr<Storage>& copy = copies[t.storage().get()];
    if (!copy) {
      const int64_t n = int64_t(t.storage()->nbytes() / t.element_size());
      Tensor whole = Tensor::make_view(t, {n}, {1}, 0);
      copy = to_device(whole, device).storage();
    }
    Tensor base = Tensor::from_storage(copy, {0}, t.dtype());
    return Tensor::make_view(base, t.shape(), t.strides(), t.offset());
  };
  OpCall out{{}, call.attrs, {}};
  for (const Tensor& t : call.inputs) out.inputs.push_back(moved(t));
  for (const Tensor& t : call.outputs) out.outputs.push_back(moved(t));
  return out;
}

std::vector<double> host_values(const Tensor& t) { return t.to_vector<double>(); }

}  // namespace reel::harness
