// Schemas of the creation and memory ops.
//
//   fill ()           attrs shape, dtype, device_type, device_index, value    every element = value
//   arange ()         attrs n, start, step, dtype, device_*                  (n,): start + i*step
//   rand_uniform ([state])  attrs shape, dtype, device_*, low, high, seed, offset  see tensor/rng.h
//   rand_normal ([state])   attrs shape, dtype, device_*, mean, std, seed, offset
//                     state: a compiled plan's Philox state (PhiloxArgs); offset is then relative to it
//   copy (x)          attr dtype (optional: cast)   a contiguous copy; with dispatch_out, a copy into
//                                                   any view, across dtypes and (CUDA) devices
//   concat (x0..xk)   attr dim                      shapes agree except along dim
//   multi_tensor_cast (x0..xk)   attr dtype   -> y0..yk, y_i = copy(x_i) to dtype: every x one float
//                     dtype and device; fused: a compiled step's weight casts in one kernel
//                     (compile/passes/fuse_weight_casts.cpp), each y as its copy writes it
//                     attr accumulate: inputs (x0..xk, y0..yk), y_i += copy(x_i) to dtype in place (the
//                     cast, then the add in dtype: the bits of an add of the copy), y_i of x_i's shape in
//                     dtype: a micro-batch's convolution weight gradients added to the parameters'
//                     gradients (compile/passes/fuse_grad_casts.cpp)
#include "kernels/schema/schema_util.h"

namespace reel {
namespace {

std::vector<TensorMeta> infer_creation(const std::vector<Tensor>& in, const Attrs& a) {
  REEL_ASSERT(in.empty(), "creation ops take no inputs");
  Shape shape = a.ints("shape");
  for (int64_t s : shape) REEL_CHECK(s >= 0, "fill: negative size in shape ", shape_str(shape));
  return {{shape, a.dtype("dtype"), schema::attr_device(a)}};
}

template <OpKind Op>
std::vector<TensorMeta> infer_random(const std::vector<Tensor>& in, const Attrs& a) {
  REEL_ASSERT(in.size() <= 1, "random ops take at most one input (the Philox state), got ", in.size());
  auto metas = infer_creation({}, a);
  schema::expect_philox_state(Op, in, 0, metas[0].device);
  REEL_CHECK(is_floating(metas[0].dtype), "random: dtype must be a float type, got ", dtype_name(metas[0].dtype));
  return metas;
}

std::vector<TensorMeta> infer_arange(const std::vector<Tensor>& in, const Attrs& a) {
  REEL_ASSERT(in.empty(), "arange takes no inputs");
  REEL_CHECK(a.i("n") >= 0, "arange: negative length ", a.i("n"));
  return {{{a.i("n")}, a.dtype("dtype"), schema::attr_device(a)}};
}

std::vector<TensorMeta> infer_copy(const std::vector<Tensor>& in, const Attrs& a) {
  schema::expect_inputs(OpKind::Copy, in, 1);
  schema::expect_defined(OpKind::Copy, in[0], "input");
  DType dt = a.has("dtype") ? a.dtype("dtype") : in[0].dtype();
  Device dev = a.has("device_type") ? schema::attr_device(a) : in[0].device();
  return {{in[0].shape(), dt, dev}};
}

std::vector<TensorMeta> infer_concat(const std::vector<Tensor>& in, const Attrs& a) {
  REEL_CHECK(!in.empty(), "concat: needs at least one tensor");
  const Tensor& first = in[0];
  schema::expect_defined(OpKind::Concat, first, "input 0");
  int64_t dim = wrap_dim(a.i("dim"), first.dim(), "concat");
  Shape shape = first.shape();
  shape[dim] = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    const Tensor& t = in[k];
    schema::expect_defined(OpKind::Concat, t, "input");
    schema::expect_same_dtype(OpKind::Concat, first, t);
    bool ok = t.dim() == first.dim();
    for (int64_t d = 0; ok && d < t.dim(); ++d) ok = d == dim || t.shape()[d] == first.shape()[d];
    REEL_CHECK(ok, "concat: tensor ", k, " has shape ", shape_str(t.shape()), " but tensor 0 has shape ",
               shape_str(first.shape()), "; they must agree except along dim ", dim);
    shape[dim] += t.shape()[dim];
  }
  return {{shape, first.dtype(), first.device()}};
}

}  // namespace

std::vector<TensorMeta> infer_multi_tensor_cast(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::MultiTensorCast;
  REEL_CHECK(!in.empty(), "multi_tensor_cast: needs at least one tensor");
  const DType to = a.dtype("dtype");
  REEL_CHECK(is_floating(to), "multi_tensor_cast: dtype ", dtype_name(to), " is not a float dtype");
  const bool accumulate = a.b("accumulate", false);
  REEL_CHECK(!accumulate || in.size() % 2 == 0, "multi_tensor_cast: accumulate takes (x0..xk, y0..yk), got ", in.size(),
             " inputs");
  const size_t pairs = accumulate ? in.size() / 2 : in.size();
  std::vector<TensorMeta> out;
  for (size_t k = 0; k < pairs; ++k) {
    schema::expect_defined(op, in[k], "input");
    schema::expect_float(op, in[k]);
    REEL_CHECK(in[k].dtype() == in[0].dtype() && in[k].device() == in[0].device(), "multi_tensor_cast: input ", k,
               " is ", schema::desc(in[k]), " on ", in[k].device().str(), " but input 0 is ", schema::desc(in[0]),
               " on ", in[0].device().str(), " (one dtype and device for all)");
    out.push_back({in[k].shape(), to, in[k].device()});
    if (!accumulate) continue;
    const Tensor& y = in[pairs + k];
    schema::expect_defined(op, y, "accumulated tensor");
    REEL_CHECK(y.shape() == in[k].shape() && y.dtype() == to && y.device() == in[k].device(),
               "multi_tensor_cast: accumulated tensor ", k, " is ", schema::desc(y), " on ", y.device().str(),
               " but input ", k, " is ", schema::desc(in[k]), " cast to ", dtype_name(to), " on ",
               in[k].device().str());
  }
  return out;
}

void register_memory_schemas() {
  register_schema(OpKind::Fill, infer_creation);
  register_schema(OpKind::Arange, infer_arange);
  register_schema(OpKind::RandUniform, infer_random<OpKind::RandUniform>);
  register_schema(OpKind::RandNormal, infer_random<OpKind::RandNormal>);
  register_schema(OpKind::Copy, infer_copy);
  register_schema(OpKind::Concat, infer_concat);
  register_schema(OpKind::MultiTensorCast, infer_multi_tensor_cast);
}

}  // namespace reel
