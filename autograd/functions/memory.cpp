// Creation, copies, casts, device moves, concat/split and the in-place updates.
//
// Forward beside backward: a cast's gradient is cast back, a device move's gradient moves back,
// concat's gradient is sliced into pieces and split's is one concat. In-place ops (copy_, fill_, add_,
// mul_) record nothing and refuse tensors that require grad while grad mode is on (their history
// would be lost).
#include <algorithm>
#include <cmath>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"

namespace reel {
namespace {

Attrs device_attrs(Attrs a, Device d) {
  return a.set("device_type", int64_t(d.type)).set("device_index", int64_t(d.index));
}

Attrs creation_attrs(const Shape& shape, const TensorOptions& o) {
  return device_attrs(Attrs().set("shape", shape).set("dtype", o.dtype), o.device);
}

Tensor finish(Tensor t, const TensorOptions& o) {
  if (o.requires_grad) t.set_requires_grad(true);
  return t;
}

void check_inplace(const char* op, const Tensor& t) {
  REEL_CHECK(t.defined(), op, ": tensor is undefined");
  REEL_CHECK(!(grad_enabled() && t.requires_grad()), op, ": in-place update of a tensor of shape ", shape_str(t.shape()),
             " that requires grad; do it under NoGradGuard (as optimizers do)");
}

Generator& pick(Generator* gen) { return gen ? *gen : default_generator(); }

}  // namespace

Tensor full(const Shape& shape, double value, TensorOptions opts) {
  return finish(dispatch1(OpKind::Fill, {}, creation_attrs(shape, opts).set("value", value)), opts);
}
Tensor zeros(const Shape& shape, TensorOptions opts) { return full(shape, 0.0, opts); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1.0, opts); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), TensorOptions{t.dtype(), t.device()}); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), TensorOptions{t.dtype(), t.device()}); }

Tensor arange(int64_t n, TensorOptions opts) { return arange(0.0, double(n), 1.0, opts); }

Tensor arange(double start, double end, double step, TensorOptions opts) {
  REEL_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step) && step != 0, "arange: start ", start,
             ", end ", end, " and step ", step, " must be finite, the step non-zero");
  // As torch.arange: a range the step walks away from is an error, not an empty tensor.
  REEL_CHECK(start == end || (end - start > 0) == (step > 0), "arange: the range [", start, ", ", end,
             ") and step ", step, " point in opposite directions");
  const double count = std::ceil((end - start) / step);
  REEL_CHECK(count < 0x1p62, "arange: [", start, ", ", end, ") in steps of ", step, " has ", count,
             " elements, too many for a tensor");
  int64_t n = std::max<int64_t>(0, int64_t(count));
  Attrs a = device_attrs(Attrs().set("n", n).set("start", start).set("step", step).set("dtype", opts.dtype), opts.device);
  return finish(dispatch1(OpKind::Arange, {}, a), opts);
}

Tensor uniform(const Shape& shape, double low, double high, TensorOptions opts, Generator* gen) {
  REEL_CHECK(std::isfinite(low) && std::isfinite(high) && low <= high, "uniform: the range [", low, ", ", high,
             ") must be finite with low <= high");
  uint64_t offset = pick(gen).advance(philox_uniform_counters(uint64_t(numel_of(shape))));
  Attrs a = creation_attrs(shape, opts).set("low", low).set("high", high);
  a.set("seed", int64_t(pick(gen).seed())).set("offset", int64_t(offset));
  return finish(dispatch1(OpKind::RandUniform, {}, a), opts);
}
Tensor rand(const Shape& shape, TensorOptions opts, Generator* gen) { return uniform(shape, 0.0, 1.0, opts, gen); }

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts, Generator* gen) {
  REEL_CHECK(low < high, "randint: the range [", low, ", ", high, ") is empty");
  constexpr int64_t kExact = int64_t(1) << 53;  // low is added through an f64 fill
  REEL_CHECK(low >= -kExact && high <= kExact, "randint: the bounds [", low, ", ", high, ") must lie within +-2^53");
  REEL_CHECK(uint64_t(high) - uint64_t(low) <= (uint64_t(1) << 24), "randint: the range [", low, ", ", high,
             ") holds more than 2^24 integers, more than the 24 random bits of a draw can reach");
  // u in [0, r) exactly in f64 (r * k / 2^24), truncated to an integer (u >= 0: truncation is floor).
  const double range = double(high - low);
  Tensor offsets = to_dtype(uniform(shape, 0.0, range, TensorOptions{DType::f64, opts.device}, gen), DType::i64);
  Tensor out = low == 0 ? offsets : offsets + full(shape, double(low), TensorOptions{DType::i64, opts.device});
  return opts.dtype == DType::i64 ? out : to_dtype(out, opts.dtype);
}

Tensor normal(const Shape& shape, double mean, double std, TensorOptions opts, Generator* gen) {
  REEL_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0, "normal: mean ", mean, " and std ", std,
             " must be finite, the std >= 0");
  uint64_t offset = pick(gen).advance(philox_normal_counters(uint64_t(numel_of(shape))));
  Attrs a = creation_attrs(shape, opts).set("mean", mean).set("std", std);
  a.set("seed", int64_t(pick(gen).seed())).set("offset", int64_t(offset));
  return finish(dispatch1(OpKind::RandNormal, {}, a), opts);
}
Tensor randn(const Shape& shape, TensorOptions opts, Generator* gen) { return normal(shape, 0.0, 1.0, opts, gen); }

Tensor tensor(const std::vector<double>& values, const Shape& shape, TensorOptions opts) {
  Tensor host = Tensor::from_vector<double>(values, shape);
  Tensor t;
  {
    NoGradGuard no_grad;
    t = to_device(to_dtype(host, opts.dtype), opts.device);
  }
  return finish(t, opts);
}

Tensor tensor_i64(const std::vector<int64_t>& values, const Shape& shape, Device device) {
  return to_device(Tensor::from_vector<int64_t>(values, shape), device);
}

Tensor contiguous(const Tensor& x) { return x.is_contiguous() ? x : clone(x); }

Tensor clone(const Tensor& x) {
  Tensor y = dispatch1(OpKind::Copy, {x});
  autograd::record("clone", {x}, {y}, [](const autograd::Grads& g) -> autograd::Grads { return {g[0]}; });
  return y;
}

Tensor to_dtype(const Tensor& x, DType dtype, MemoryFormat format) {
  if (x.dtype() == dtype && (format == MemoryFormat::Contiguous || x.is_contiguous(format))) return x;
  Tensor y = dispatch1(OpKind::Copy, {x}, Attrs().set("dtype", dtype), format);
  if (is_floating(dtype)) {
    const DType from = x.dtype();
    const MemoryFormat from_format = x.suggested_format();
    autograd::record("to_dtype", {x}, {y}, [from, from_format](const autograd::Grads& g) -> autograd::Grads {
      return {to_dtype(g[0], from, from_format)};
    });
  }
  return y;
}

Tensor to_device(const Tensor& x, Device device) {
  if (x.device() == device) return x;
  Tensor y = dispatch1(OpKind::Copy, {x}, device_attrs(Attrs(), device));
  Device from = x.device();
  autograd::record("to_device", {x}, {y}, [from](const autograd::Grads& g) -> autograd::Grads {
    return {to_device(g[0], from)};
  });
  return y;
}

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  Tensor y = dispatch1(OpKind::Concat, xs, Attrs().set("dim", dim));
  int64_t d = wrap_dim(dim, y.dim(), "concat");
  std::vector<int64_t> lens;
  for (const Tensor& x : xs) lens.push_back(x.shape()[d]);
  autograd::record("concat", xs, {y}, [lens, d](const autograd::Grads& g) {
    autograd::Grads out;
    int64_t at = 0;
    for (int64_t len : lens) {
      out.push_back(slice(g[0], d, at, at + len));
      at += len;
    }
    return out;
  });
  return y;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  int64_t d = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    REEL_CHECK(s >= 0, "split: negative size ", s, " in ", shape_str(sizes));
    total += s;
  }
  REEL_CHECK(total == x.shape()[d], "split: sizes ", shape_str(sizes), " add up to ", total, " but dim ", d,
             " of shape ", shape_str(x.shape()), " has ", x.shape()[d]);
  // The parts are slice views; one node for all of them, whose backward writes each part's gradient
  // into its place with one concat (zeros for parts that got none) rather than a zero-filled
  // input-sized tensor per part and a sum of them.
  std::vector<Tensor> parts;
  {
    NoGradGuard no_grad;
    int64_t at = 0;
    for (int64_t s : sizes) {
      parts.push_back(dispatch1(OpKind::Slice, {x},
                                Attrs().set("dim", d).set("start", at).set("end", at + s).set("step", int64_t(1))));
      at += s;
    }
  }
  std::vector<Shape> part_shapes;
  for (const Tensor& p : parts) part_shapes.push_back(p.shape());
  autograd::record("split", {x}, parts, [part_shapes, d](const autograd::Grads& g) -> autograd::Grads {
    // Backward reaches this node only when at least one part has a gradient; it sets dtype and device.
    const Tensor& ref = *std::find_if(g.begin(), g.end(), [](const Tensor& t) { return t.defined(); });
    std::vector<Tensor> pieces;
    for (size_t i = 0; i < g.size(); ++i)
      pieces.push_back(g[i].defined() ? g[i] : zeros(part_shapes[i], TensorOptions{ref.dtype(), ref.device()}));
    return {pieces.size() == 1 ? pieces[0] : concat(pieces, d)};
  });
  return parts;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  REEL_CHECK(split_size > 0, "split: split_size must be positive, got ", split_size);
  int64_t n = x.shape()[wrap_dim(dim, x.dim(), "split")];
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < n; at += split_size) sizes.push_back(std::min(split_size, n - at));
  return split(x, sizes, dim);
}

void copy_(const Tensor& dst, const Tensor& src) {
  check_inplace("copy_", dst);
  REEL_CHECK(src.defined(), "copy_: source is undefined");
  dispatch_out(OpKind::Copy, {src.shape() == dst.shape() ? src : expand(src, dst.shape())}, {dst});
}

void fill_(const Tensor& t, double value) {
  check_inplace("fill_", t);
  Attrs a = device_attrs(Attrs().set("shape", t.shape()).set("dtype", t.dtype()), t.device());
  dispatch_out(OpKind::Fill, {}, {t}, a.set("value", value));
}

void zero_(const Tensor& t) { fill_(t, 0.0); }

void add_(const Tensor& dst, const Tensor& src) {
  check_inplace("add_", dst);
  dispatch_out(OpKind::Add, {dst, src}, {dst});
}

void add_(const Tensor& dst, double value) {
  check_inplace("add_", dst);
  dispatch_out(OpKind::AddScalar, {dst}, {dst}, Attrs().set("value", value));
}

void mul_(const Tensor& dst, double value) {
  check_inplace("mul_", dst);
  dispatch_out(OpKind::MulScalar, {dst}, {dst}, Attrs().set("value", value));
}

}  // namespace reel
