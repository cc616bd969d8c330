// Op-harness cases of the creation and memory ops (schemas: kernels/schema/memory.cpp): fill,
// arange, the Philox draws, copy (layouts, broadcasts, casts, into a strided view) and concat.
// Creation ops take their device from attrs (with_device); every value they make is exact, and the
// Philox draws are the same numbers on every backend, so all of these compare exactly. The
// plain-loop references: fill, arange, the draws (element i from its Philox counter) and concat.
#include <cmath>

#include "tensor/rng.h"
#include "tests/op_harness/inputs.h"

namespace reel::harness {
namespace {

Attrs creation(const Shape& shape, DType dtype, Device device) {
  return with_device(Attrs().set("shape", shape).set("dtype", dtype), device);
}

void add_fill_cases(std::vector<OpTestCase>& cases) {
  struct Fill {
    const char* name;
    Shape shape;
    double value;
    std::vector<DType> dtypes;
  };
  for (const Fill& f : {Fill{"fill_3x4", {3, 4}, 2.5, kAllTypes}, Fill{"fill_0d", {}, -1.75, kFloatTypes},
                        Fill{"fill_empty_0x5", {0, 5}, 3.0, kFloatTypes}}) {
    cases.push_back({
        .op = OpKind::Fill,
        .name = f.name,
        .dtypes = f.dtypes,
        .make = [f](Device d, DType t) { return OpCall{{}, creation(f.shape, t, d).set("value", f.value)}; },
        .tol_scale = 0,
        .reference = [f](const OpCall&) { return Expected{std::vector<double>(numel_of(f.shape), f.value)}; },
    });
  }
}

void add_arange_cases(std::vector<OpTestCase>& cases) {
  struct Range {
    const char* name;
    int64_t n;
    double start, step;
    std::vector<DType> dtypes;
  };
  for (const Range& r : {Range{"arange_7_from_minus2_by_half", 7, -2.0, 0.5, kFloatTypes},
                         Range{"arange_5_from_3_by_minus2", 5, 3.0, -2.0, kAllTypes}}) {
    cases.push_back({
        .op = OpKind::Arange,
        .name = r.name,
        .dtypes = r.dtypes,
        .make =
            [r](Device d, DType t) {
              Attrs a = Attrs().set("n", r.n).set("start", r.start).set("step", r.step).set("dtype", t);
              return OpCall{{}, with_device(a, d)};
            },
        .tol_scale = 0,
        .reference =
            [r](const OpCall&) {
              std::vector<double> v;
              for (int64_t i = 0; i < r.n; ++i) v.push_back(r.start + double(i) * r.step);
              return Expected{v};
            },
    });
  }
}

// Draws of n values: element i from word i % 4 of counter offset + i / 4 (uniform), or from the
// Box-Muller pair of counter offset + i / 2 (normal): tensor/rng.h's convention.
void add_random_cases(std::vector<OpTestCase>& cases) {
  struct Draw {
    const char* name;
    OpKind op;
    Shape shape;
    double a, b;  // low, high or mean, std
    int64_t seed, offset;
  };
  for (const Draw& r : {Draw{"rand_uniform_5x7", OpKind::RandUniform, {5, 7}, -1.0, 2.0, 1234, 3},
                        Draw{"rand_uniform_9_high_offset", OpKind::RandUniform, {9}, 0.0, 1.0, int64_t(1) << 40,
                             (int64_t(1) << 33) + 5},
                        Draw{"rand_normal_3x5", OpKind::RandNormal, {3, 5}, 1.0, 2.0, 77, 5},
                        Draw{"rand_normal_2x2x2", OpKind::RandNormal, {2, 2, 2}, 0.0, 1.0, 9, 0}}) {
    const bool uniform = r.op == OpKind::RandUniform;
    cases.push_back({
        .op = r.op,
        .name = r.name,
        .dtypes = kFloatTypes,
        .make =
            [r, uniform](Device d, DType t) {
              Attrs a = creation(r.shape, t, d).set("seed", r.seed).set("offset", r.offset);
              if (uniform) a.set("low", r.a).set("high", r.b);
              else a.set("mean", r.a).set("std", r.b);
              return OpCall{{}, a};
            },
        .tol_scale = 0,
        .reference =
            [r, uniform](const OpCall&) {
              const uint64_t seed = uint64_t(r.seed), offset = uint64_t(r.offset);
              std::vector<double> v;
              for (uint64_t i = 0; i < uint64_t(numel_of(r.shape)); ++i)
                v.push_back(uniform ? r.a + (r.b - r.a) * double(philox_uniform(seed, offset, i))
                                    : r.a + r.b * double(philox_normal(seed, offset, i)));
              return Expected{v};
            },
    });
  }
}

void add_copy_cases(std::vector<OpTestCase>& cases) {
  auto copy_of = [](std::function<Tensor(DType)> input) {
    return [input](Device, DType t) { return OpCall{{input(t)}, {}}; };
  };
  auto identity_grad = [](const std::vector<Tensor>& x) { return clone(x[0]); };
  cases.push_back({.op = OpKind::Copy,
                   .name = "copy_transposed_4x3",
                   .dtypes = kAllTypes,
                   .make = copy_of([](DType t) { return randn_input({4, 3}, t, 1, Layout::transposed, 3.0); }),
                   .grad = identity_grad,
                   .tol_scale = 0});
  cases.push_back({.op = OpKind::Copy,
                   .name = "copy_strided_5x2",
                   .dtypes = kAllTypes,
                   .make = copy_of([](DType t) { return randn_input({5, 2}, t, 2, Layout::strided, 3.0); }),
                   .tol_scale = 0});
  cases.push_back({.op = OpKind::Copy,
                   .name = "copy_broadcast_1x4_to_3x4",
                   .dtypes = kAllTypes,
                   .make = copy_of([](DType t) { return expanded(randn_input({1, 4}, t, 3, Layout::contiguous, 3.0), {3, 4}); }),
                   .tol_scale = 0});
  cases.push_back({.op = OpKind::Copy,
                   .name = "copy_cast_from_f32_4x3",
                   .dtypes = kAllTypes,
                   .make =
                       [](Device, DType t) {
                         return OpCall{{randn_input({4, 3}, DType::f32, 4, Layout::transposed, 3.0)},
                                       Attrs().set("dtype", t)};
                       },
                   .tol_scale = 0});
  cases.push_back({.op = OpKind::Copy,
                   .name = "copy_cast_to_f32_3x5",
                   .dtypes = kAllTypes,
                   .make =
                       [](Device, DType t) {
                         return OpCall{{randn_input({3, 5}, t, 5, Layout::strided, 3.0)}, Attrs().set("dtype", DType::f32)};
                       },
                   .tol_scale = 0});
  // dispatch_out: a row-major source written into a transposed view of a zeroed buffer.
  cases.push_back({.op = OpKind::Copy,
                   .name = "copy_into_transposed_view_3x4",
                   .dtypes = kAllTypes,
                   .make =
                       [](Device, DType t) {
                         Tensor target = randn_input({3, 4}, t, 6, Layout::transposed, 0.0);
                         return OpCall{{randn_input({3, 4}, t, 7, Layout::contiguous, 3.0)}, {}, {target}};
                       },
                   .tol_scale = 0});
}

// Row-major concatenation of the inputs along `dim`, by plain index arithmetic.
std::vector<double> concat_reference(const OpCall& call) {
  const Shape& first = call.inputs[0].shape();
  const int64_t dim = call.attrs.i("dim") < 0 ? call.attrs.i("dim") + int64_t(first.size()) : call.attrs.i("dim");
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= first[d];
  for (size_t d = size_t(dim) + 1; d < first.size(); ++d) inner *= first[d];
  std::vector<double> out;
  for (int64_t o = 0; o < outer; ++o)
    for (const Tensor& t : call.inputs) {
      std::vector<double> v = host_values(t);
      const int64_t run = t.shape()[dim] * inner;
      out.insert(out.end(), v.begin() + o * run, v.begin() + (o + 1) * run);
    }
  return out;
}

void add_concat_cases(std::vector<OpTestCase>& cases) {
  struct Concat {
    const char* name;
    std::vector<Shape> shapes;
    std::vector<Layout> layouts;
    int64_t dim;
  };
  for (const Concat& k : {Concat{"concat_dim0_2x3_1x3_4x3", {{2, 3}, {1, 3}, {4, 3}},
                                 {Layout::contiguous, Layout::transposed, Layout::strided}, 0},
                          Concat{"concat_last_dim_2x1x3_2x1x2", {{2, 1, 3}, {2, 1, 2}},
                                 {Layout::transposed, Layout::contiguous}, -1},
                          Concat{"concat_one_input_3x2", {{3, 2}}, {Layout::strided}, 1}}) {
    cases.push_back({
        .op = OpKind::Concat,
        .name = k.name,
        .dtypes = kAllTypes,
        .make =
            [k](Device, DType t) {
              OpCall call{{}, Attrs().set("dim", k.dim)};
              for (size_t i = 0; i < k.shapes.size(); ++i)
                call.inputs.push_back(randn_input(k.shapes[i], t, 10 + i, k.layouts[i], 3.0));
              return call;
            },
        .grad = [k](const std::vector<Tensor>& x) { return concat(x, k.dim); },
        .tol_scale = 0,
        .reference = [](const OpCall& call) { return Expected{concat_reference(call)}; },
    });
  }
}

}  // namespace

std::vector<OpTestCase> memory_cases() {
  std::vector<OpTestCase> cases;
  add_fill_cases(cases);
  add_arange_cases(cases);
  add_random_cases(cases);
  add_copy_cases(cases);
  add_concat_cases(cases);
  return cases;
}

}  // namespace reel::harness
