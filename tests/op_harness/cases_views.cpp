// Op-harness cases of the view ops (schemas: kernels/schema/views.cpp). A view runs no kernel: the
// runner checks that the output aliases the input's storage, and each case's reference computes the
// elements the view must show by plain index arithmetic on the input's row-major values (so the
// strides the schema chose are checked, on every backend). Inputs come contiguous, transposed and
// strided, since a view's strides are built from its input's.
#include "tests/op_harness/inputs.h"
#include "tests/test_util.h"

namespace reel::harness {
namespace {

using testing_util::unravel;
using Values = std::vector<double>;

int64_t flat_index(const std::vector<int64_t>& idx, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
  return flat;
}

// Element j of the output (row-major over out_shape) is input element source(output index).
Values gather(const Tensor& x, const Shape& out_shape,
              const std::function<std::vector<int64_t>(const std::vector<int64_t>&)>& source) {
  Values in = host_values(x), out;
  for (int64_t j = 0; j < numel_of(out_shape); ++j) out.push_back(in[flat_index(source(unravel(j, out_shape)), x.shape())]);
  return out;
}

Values reshape_reference(const OpCall& call) { return host_values(call.inputs[0]); }

Values permute_reference(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  std::vector<int64_t> dims = call.attrs.ints("dims");
  for (int64_t& d : dims) d = d < 0 ? d + x.dim() : d;
  Shape out_shape;
  for (int64_t d : dims) out_shape.push_back(x.shape()[d]);
  return gather(x, out_shape, [&](const std::vector<int64_t>& o) {
    std::vector<int64_t> i(o.size());
    for (size_t k = 0; k < dims.size(); ++k) i[dims[k]] = o[k];
    return i;
  });
}

Values slice_reference(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  const Attrs& a = call.attrs;
  const int64_t dim = a.i("dim") < 0 ? a.i("dim") + x.dim() : a.i("dim"), size = x.shape()[dim];
  auto clamp = [size](int64_t v) { return std::min(std::max<int64_t>(v < 0 ? v + size : v, 0), size); };
  const int64_t start = clamp(a.i("start")), end = clamp(a.i("end")), step = a.i("step", 1);
  Shape out_shape = x.shape();
  out_shape[dim] = end > start ? (end - start + step - 1) / step : 0;
  return gather(x, out_shape, [&](std::vector<int64_t> o) {
    o[dim] = start + o[dim] * step;
    return o;
  });
}

Values expand_reference(const OpCall& call) {
  const Tensor& x = call.inputs[0];
  Shape out_shape = call.attrs.ints("shape");
  const size_t lead = out_shape.size() - x.shape().size();
  for (size_t d = lead; d < out_shape.size(); ++d)
    if (out_shape[d] == -1) out_shape[d] = x.shape()[d - lead];
  return gather(x, out_shape, [&](const std::vector<int64_t>& o) {
    std::vector<int64_t> i(o.begin() + lead, o.end());
    for (size_t d = 0; d < i.size(); ++d) i[d] = x.shape()[d] == 1 ? 0 : i[d];
    return i;
  });
}

struct ViewCase {
  OpKind op;
  const char* name;
  Shape shape;
  Layout layout;
  Attrs attrs;
};

OpTestCase view_case(const ViewCase& v, Values (*reference)(const OpCall&), GradcheckFn grad) {
  return {
      .op = v.op,
      .name = v.name,
      .dtypes = kAllTypes,
      .make = [v](Device, DType t) { return OpCall{{randn_input(v.shape, t, 20, v.layout, 3.0)}, v.attrs}; },
      .grad = std::move(grad),
      .tol_scale = 0,
      .reference = [reference](const OpCall& call) { return Expected{reference(call)}; },
  };
}

void add_reshape_cases(std::vector<OpTestCase>& cases) {
  auto shape = [](Shape s) { return Attrs().set("shape", s); };
  for (const ViewCase& v : {ViewCase{OpKind::Reshape, "reshape_2x6_to_3x4", {2, 6}, Layout::contiguous, shape({3, 4})},
                            ViewCase{OpKind::Reshape, "reshape_2x3x4_to_4_by_inferred", {2, 3, 4}, Layout::contiguous,
                                     shape({4, -1})},
                            ViewCase{OpKind::Reshape, "reshape_strided_rows_3x4_to_3x2x2", {3, 4}, Layout::strided,
                                     shape({3, 2, 2})},
                            ViewCase{OpKind::Reshape, "reshape_transposed_4x3_to_4x1x3", {4, 3}, Layout::transposed,
                                     shape({4, 1, 3})}}) {
    Shape to = v.attrs.ints("shape");
    cases.push_back(view_case(v, reshape_reference, [to](const std::vector<Tensor>& x) { return reshape(x[0], to); }));
  }
}

void add_permute_cases(std::vector<OpTestCase>& cases) {
  auto dims = [](std::vector<int64_t> d) { return Attrs().set("dims", d); };
  for (const ViewCase& v : {ViewCase{OpKind::Permute, "permute_2x3x4_by_2_0_1", {2, 3, 4}, Layout::contiguous, dims({2, 0, 1})},
                            ViewCase{OpKind::Permute, "permute_transposed_3x5_back", {3, 5}, Layout::transposed, dims({1, 0})},
                            ViewCase{OpKind::Permute, "permute_strided_negative_dims_3x2x2", {3, 2, 2}, Layout::strided,
                                     dims({-1, 0, -2})}}) {
    std::vector<int64_t> d = v.attrs.ints("dims");
    cases.push_back(view_case(v, permute_reference, [d](const std::vector<Tensor>& x) { return permute(x[0], d); }));
  }
}

void add_slice_cases(std::vector<OpTestCase>& cases) {
  auto range = [](int64_t dim, int64_t start, int64_t end, int64_t step) {
    return Attrs().set("dim", dim).set("start", start).set("end", end).set("step", step);
  };
  for (const ViewCase& v : {ViewCase{OpKind::Slice, "slice_3x7_columns_1_to_6_by_2", {3, 7}, Layout::contiguous, range(1, 1, 6, 2)},
                            ViewCase{OpKind::Slice, "slice_5x4_negative_start_clamped_end", {5, 4}, Layout::transposed,
                                     range(0, -3, 100, 1)},
                            ViewCase{OpKind::Slice, "slice_strided_4x3_rows_by_2", {4, 3}, Layout::strided, range(-2, 1, 4, 2)},
                            ViewCase{OpKind::Slice, "slice_empty_4x3", {4, 3}, Layout::contiguous, range(0, 3, 2, 1)}}) {
    const Attrs a = v.attrs;
    cases.push_back(view_case(v, slice_reference, [a](const std::vector<Tensor>& x) {
      return slice(x[0], a.i("dim"), a.i("start"), a.i("end"), a.i("step"));
    }));
  }
}

void add_expand_cases(std::vector<OpTestCase>& cases) {
  auto shape = [](Shape s) { return Attrs().set("shape", s); };
  for (const ViewCase& v : {ViewCase{OpKind::Expand, "expand_3x1_to_2x3x4", {3, 1}, Layout::contiguous, shape({2, 3, 4})},
                            ViewCase{OpKind::Expand, "expand_1x4_keeping_sizes", {1, 4}, Layout::strided, shape({3, -1})},
                            ViewCase{OpKind::Expand, "expand_transposed_1x3_to_2x2x3", {1, 3}, Layout::transposed,
                                     shape({2, 2, 3})}}) {
    Shape to = v.attrs.ints("shape");
    cases.push_back(view_case(v, expand_reference, [to](const std::vector<Tensor>& x) { return expand(x[0], to); }));
  }
}

}  // namespace

std::vector<OpTestCase> views_cases() {
  std::vector<OpTestCase> cases;
  add_reshape_cases(cases);
  add_permute_cases(cases);
  add_slice_cases(cases);
  add_expand_cases(cases);
  return cases;
}

}  // namespace reel::harness
