// Op-harness cases of the layer norm's fused ops (kernels/ops.def's "fused:" lines in the norm family):
// the residual add + norm + cast (layer_norm_cast), the backward + the residual's gradient (+ its
// 16-bit copy and column sums: layer_norm_backward_add), both with a residual branch's dropout drawn in
// the kernel, and the backward with its sums left as partials and the node that adds them up
// (layer_norm_backward_partials, layer_norm_param_sums). As in cases_fused.cpp, each reference is the
// unfused chain run op by op on the CPU (fused_references.h), or plain loops; on the GPU the same
// cases compare the CUDA kernels against the CPU. 40- and 48-column rows take the generic CUDA
// kernels, rows of 128 and 256 the row-in-registers ones.
#include <string>
#include <vector>

#include "tests/op_harness/fused_references.h"
#include "tests/op_harness/inputs.h"

namespace reel::harness {
namespace {

constexpr double kEps = 1e-5;

// ---- layer norm: the residual add + norm + cast, and the backward + add (+ cast, column sums) ----

void add_layer_norm_cases(std::vector<OpTestCase>& cases) {
  for (bool add : {false, true}) {
    cases.push_back({.op = OpKind::LayerNormCast,
                     .name = std::string("layer_norm_cast_") + (add ? "residual_add_" : "") + "6x40",
                     .dtypes = k16Bit,
                     .make =
                         [add](Device, DType t) {
                           Inputs in{randn_input({6, 40}, DType::f32, 201), randn_input({40}, DType::f32, 202, Layout::contiguous, 0.5, 1.0),
                                     randn_input({40}, DType::f32, 203, Layout::contiguous, 0.5)};
                           if (add) in.push_back(randn_input({6, 40}, DType::f32, 204));
                           return OpCall{in, Attrs().set("eps", kEps).set("normalized_ndim", int64_t(1)).set("dtype", t)};
                         },
                     .reference =
                         [](const OpCall& c) {
                           const bool add = c.inputs.size() == 4;
                           Tensor x = add ? run1(OpKind::Add, {c.inputs[0], c.inputs[3]}) : c.inputs[0];
                           std::vector<Tensor> y = dispatch(OpKind::LayerNorm, {x, c.inputs[1], c.inputs[2]}, c.attrs);
                           Expected e = values_of({cast(y[0], c.attrs.dtype("dtype")), y[1], y[2]});
                           if (add) e.push_back(host_values(x));
                           return e;
                         }});
  }
  // The addend in 16 bits (a GEMM's result, compile/passes/read_layer_norm_16bit.cpp), added as its f32
  // widening, and broadcast over x's leading dims (compile/passes/fuse_norm_cast.cpp: a position table,
  // (T, C) or (1, T, C), added over the batch), f32 or 16-bit. 40 columns take the generic kernels on
  // CUDA (a 16-bit addend widened first), 256 the row-in-registers ones (widened as they load it).
  struct Addend {
    const char* name;
    Shape shape;  // without the columns
    bool sixteen;
  };
  for (int64_t cols : {40, 256}) {
    for (const Addend& v : {Addend{"16bit_addend_", {3, 5}, true}, Addend{"broadcast_tc_", {5}, false},
                            Addend{"broadcast_1tc_", {1, 5}, false}, Addend{"broadcast_tc_16bit_", {5}, true}}) {
      Shape addend = v.shape;
      addend.push_back(cols);
      cases.push_back(
          {.op = OpKind::LayerNormCast,
           .name = std::string("layer_norm_cast_residual_add_") + v.name + "3x5x" + std::to_string(cols),
           .dtypes = k16Bit,
           .make =
               [v, addend, cols](Device, DType t) {
                 Inputs in{randn_input({3, 5, cols}, DType::f32, 205),
                           randn_input({cols}, DType::f32, 206, Layout::contiguous, 0.5, 1.0),
                           randn_input({cols}, DType::f32, 207, Layout::contiguous, 0.5),
                           randn_input(addend, v.sixteen ? t : DType::f32, 208)};
                 return OpCall{in, Attrs().set("eps", kEps).set("normalized_ndim", int64_t(1)).set("dtype", t)};
               },
           .reference =
               [](const OpCall& c) {
                 Tensor x = run1(OpKind::Add, {c.inputs[0], cast(c.inputs[3], DType::f32)});
                 std::vector<Tensor> y = dispatch(OpKind::LayerNorm, {x, c.inputs[1], c.inputs[2]}, c.attrs);
                 return values_of({cast(y[0], c.attrs.dtype("dtype")), y[1], y[2], x});
               }});
    }
  }
  // The backward: plain (any float dtype), with the 16-bit copy, with its column sums, and added to.
  struct Variant {
    const char* name;
    bool copy, sums, accumulate;
    bool residual = true;  // absent: a stack's last norm, its dx's copy and sums in the kernel all the same
    int64_t cols = 48;     // 128: the row-in-registers kernels on CUDA
    bool g16 = false;      // g in the case's 16-bit dtype (a GEMM's input gradient), read as its widening
  };
  for (Variant v :
       {Variant{"", false, false, false}, Variant{"copy_", true, false, false},
        Variant{"copy_column_sums_", true, true, false}, Variant{"copy_column_sums_accumulate_", true, true, true},
        Variant{"no_residual_copy_", true, false, false, false},
        Variant{"no_residual_copy_column_sums_accumulate_", true, true, true, false},
        Variant{"no_residual_copy_column_sums_", true, true, false, false, 128},
        Variant{"16bit_grad_copy_column_sums_", true, true, false, true, 48, true},
        Variant{"16bit_grad_copy_column_sums_accumulate_", true, true, true, true, 128, true},
        Variant{"16bit_grad_no_residual_copy_", true, false, false, false, 128, true}}) {
    const int64_t C = v.cols;
    cases.push_back(
        {.op = OpKind::LayerNormBackwardAdd,
         .name = std::string("layer_norm_backward_add_") + v.name + "5x" + std::to_string(C),
         .dtypes = v.copy ? std::vector<DType>(k16Bit) : std::vector<DType>{DType::f32, DType::f64},
         .make =
             [v, C](Device, DType t) {
               const DType x_dtype = v.copy ? DType::f32 : t;
               Tensor x = randn_input({5, C}, x_dtype, 211),
                      w = randn_input({C}, x_dtype, 212, Layout::contiguous, 0.5, 1.0);
               std::vector<Tensor> f = dispatch(OpKind::LayerNorm, {x, w, Tensor()},
                                                Attrs().set("eps", kEps).set("normalized_ndim", int64_t(1)));
               Inputs in{randn_input({5, C}, v.g16 ? t : x_dtype, 213),
                         x,
                         w,
                         f[1],
                         f[2],
                         v.residual ? randn_input({5, C}, x_dtype, 214) : Tensor()};
               Attrs a;
               if (v.copy) a.set("dtype", t);
               if (v.sums) a.set("column_sums", true).set("accumulate", v.accumulate);
               if (!v.accumulate) return OpCall{in, a};
               // Added to: the sums' tensor is an input and the same tensor as the output (params +=).
               Tensor sums = randn_input({C}, DType::f32, 215);
               in.push_back(sums);
               return adding_into_sums(in, a, sums);
             },
         .reference =
             [v](const OpCall& c) {
               const Tensor g = v.g16 ? cast(c.inputs[0], DType::f32) : c.inputs[0];
               std::vector<Tensor> b =
                   dispatch(OpKind::LayerNormBackward, {g, c.inputs[1], c.inputs[2], c.inputs[3], c.inputs[4]});
               Tensor out = v.residual ? run1(OpKind::Add, {b[0], c.inputs[5]}) : b[0];
               Expected e = values_of({out, b[1], b[2]});
               if (!v.copy) return e;
               Tensor out16 = cast(out, c.attrs.dtype("dtype"));
               e.push_back(host_values(out16));
               if (!v.sums) return e;
               Tensor s = run1(OpKind::Sum, {cast(out16, DType::f32)}, Attrs().set("dims", std::vector<int64_t>{0}));
               if (v.accumulate) s = run1(OpKind::Add, {copy_of(c.inputs[6]), s});
               e.push_back(host_values(s));
               return e;
             }});
  }
}

// ---- layer norm with a residual branch's dropout: the mask drawn in the kernel ----
// The Philox state {99, 1000} with dropout_offset 5: the mask dropout(key 99, offset 1005) makes.
// Rows of 40 and 48 columns take the generic rows kernels on CUDA, rows of 256 and 128 the
// row-in-registers ones.

Tensor dropout_state() { return values_input({99, 1000}, {2}, DType::i64); }
Attrs with_test_dropout(Attrs a) {
  return a.set("dropout_p", 0.25).set("dropout_seed", int64_t(7)).set("dropout_offset", int64_t(5)).set("dropout_state", true);
}
// v times the mask the cases' dropout draws over v's shape.
Tensor dropped(const Tensor& v) {
  return dispatch(OpKind::Dropout, {v}, Attrs().set("p", 0.25).set("seed", int64_t(99)).set("offset", int64_t(1005)))[0];
}

void add_layer_norm_dropout_cases(std::vector<OpTestCase>& cases) {
  for (int64_t cols : {40, 256}) {
    cases.push_back({.op = OpKind::LayerNormCast,
                     .name = "layer_norm_cast_residual_add_dropout_6x" + std::to_string(cols),
                     .dtypes = k16Bit,
                     .make =
                         [cols](Device, DType t) {
                           Inputs in{randn_input({6, cols}, DType::f32, 221), randn_input({cols}, DType::f32, 222, Layout::contiguous, 0.5, 1.0),
                                     randn_input({cols}, DType::f32, 223, Layout::contiguous, 0.5),
                                     randn_input({6, cols}, DType::f32, 224), dropout_state()};
                           return OpCall{in, with_test_dropout(Attrs().set("eps", kEps).set("normalized_ndim", int64_t(1)).set("dtype", t))};
                         },
                     .reference =
                         [](const OpCall& c) {
                           Tensor x = run1(OpKind::Add, {c.inputs[0], dropped(c.inputs[3])});
                           std::vector<Tensor> y = dispatch(OpKind::LayerNorm, {x, c.inputs[1], c.inputs[2]},
                                                            Attrs().set("eps", kEps).set("normalized_ndim", int64_t(1)));
                           return Expected{host_values(cast(y[0], c.attrs.dtype("dtype"))), host_values(y[1]), host_values(y[2]),
                                           host_values(x)};
                         }});
  }
  for (int64_t cols : {48, 128}) {
    cases.push_back(
        {.op = OpKind::LayerNormBackwardAdd,
         .name = "layer_norm_backward_add_dropout_copy_column_sums_accumulate_5x" + std::to_string(cols),
         .dtypes = k16Bit,
         .make =
             [cols](Device, DType t) {
               Tensor x = randn_input({5, cols}, DType::f32, 231), w = randn_input({cols}, DType::f32, 232, Layout::contiguous, 0.5, 1.0);
               std::vector<Tensor> f = dispatch(OpKind::LayerNorm, {x, w, Tensor()},
                                                Attrs().set("eps", kEps).set("normalized_ndim", int64_t(1)));
               Tensor sums = randn_input({cols}, DType::f32, 235);
               Inputs in{randn_input({5, cols}, DType::f32, 233), x, w, f[1], f[2], randn_input({5, cols}, DType::f32, 234), sums,
                         dropout_state()};
               return adding_into_sums(in, with_test_dropout(Attrs().set("dtype", t).set("column_sums", true).set("accumulate", true)),
                                       sums);
             },
         .reference =
             [](const OpCall& c) {
               std::vector<Tensor> b = dispatch(OpKind::LayerNormBackward, {c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], c.inputs[4]});
               Tensor out = run1(OpKind::Add, {b[0], c.inputs[5]});
               Tensor out16 = cast(dropped(out), c.attrs.dtype("dtype"));
               Tensor s = run1(OpKind::Sum, {cast(out16, DType::f32)}, Attrs().set("dims", std::vector<int64_t>{0}));
               s = run1(OpKind::Add, {copy_of(c.inputs[6]), s});
               return values_of({out, b[1], b[2], out16, s});
             }});
  }
}

// ---- layer norm's backward with its sums left as partials, and the node that adds them up ----
// (compile/passes/split_norm_param_sums.h). Rows of 128 columns take the GPU's row-in-registers
// kernel, the only one that leaves partials; 43 rows in 3 parts deal six 8-row groups (and three rows)
// as the kernel's blocks take them: parts 0, 1, 2, 0, 1, 2.

// part (parts, S, cols) as the schema states it, in plain loops: part p sums g xhat, g (and out16)
// over the rows r with (r / 8) % parts == p.
std::vector<double> reference_partials(const std::vector<double>& g, const std::vector<double>& x,
                                       const std::vector<double>& mean, const std::vector<double>& rstd,
                                       const std::vector<double>* out16, int64_t parts, int64_t cols) {
  const int64_t rows = int64_t(mean.size()), S = out16 ? 3 : 2;
  std::vector<double> part(size_t(parts * S * cols), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const size_t at = size_t((r / 8) % parts * S * cols + j), e = size_t(r * cols + j);
      part[at] += g[e] * (x[e] - mean[size_t(r)]) * rstd[size_t(r)];
      part[at + size_t(cols)] += g[e];
      if (out16) part[at + size_t(2 * cols)] += (*out16)[e];
    }
  return part;
}

void add_layer_norm_partials_cases(std::vector<OpTestCase>& cases) {
  constexpr int64_t kRows = 43, kCols = 128, kParts = 3;
  struct Variant {
    const char* name;
    bool copy, sums, residual, g16;
  };
  for (Variant v : {Variant{"", false, false, true, false}, Variant{"copy_column_sums_", true, true, true, true},
                    Variant{"no_residual_copy_", true, false, false, false}}) {
    cases.push_back(
        {.op = OpKind::LayerNormBackwardPartials,
         .name = std::string("layer_norm_backward_partials_") + v.name + "43x128",
         .dtypes = v.copy ? std::vector<DType>(k16Bit) : std::vector<DType>{DType::f32},
         .make =
             [v](Device, DType t) {
               Tensor x = randn_input({kRows, kCols}, DType::f32, 241),
                      w = randn_input({kCols}, DType::f32, 242, Layout::contiguous, 0.5, 1.0);
               std::vector<Tensor> f = dispatch(OpKind::LayerNorm, {x, w, Tensor()},
                                                Attrs().set("eps", kEps).set("normalized_ndim", int64_t(1)));
               Inputs in{randn_input({kRows, kCols}, v.g16 ? t : DType::f32, 243),
                         x,
                         w,
                         f[1],
                         f[2],
                         v.residual ? randn_input({kRows, kCols}, DType::f32, 244) : Tensor()};
               Attrs a = Attrs().set("parts", kParts);
               if (v.copy) a.set("dtype", t);
               if (v.sums) a.set("column_sums", true);
               return OpCall{in, a};
             },
         .reference =
             [v](const OpCall& c) {
               const Tensor g = cast(c.inputs[0], DType::f32);
               std::vector<Tensor> b =
                   dispatch(OpKind::LayerNormBackward, {g, c.inputs[1], c.inputs[2], c.inputs[3], c.inputs[4]});
               Tensor out = v.residual ? run1(OpKind::Add, {b[0], c.inputs[5]}) : b[0];
               Tensor out16 = v.copy ? cast(out, c.attrs.dtype("dtype")) : Tensor();
               const std::vector<double> y16 = v.copy ? host_values(out16) : std::vector<double>();
               Expected e{host_values(out),
                          reference_partials(host_values(g), host_values(c.inputs[1]), host_values(c.inputs[3]),
                                             host_values(c.inputs[4]), v.sums ? &y16 : nullptr, kParts, kCols)};
               if (v.copy) e.push_back(y16);
               return e;
             }});
  }
  // The sums: 2 or 3 rows a part, over 70 parts (more than the finish kernel's 32 running sums).
  for (bool sums : {false, true})
    for (bool accumulate : {false, true}) {
      if (accumulate && !sums) continue;
      const int64_t S = sums ? 3 : 2, parts = 70, cols = 40;
      cases.push_back(
          {.op = OpKind::LayerNormParamSums,
           .name = std::string("layer_norm_param_sums_") + (sums ? "column_sums_" : "") +
                   (accumulate ? "accumulate_" : "") + "70x" + std::to_string(S) + "x40",
           .dtypes = {DType::f32},
           .make =
               [=](Device, DType) {
                 Inputs in{randn_input({parts, S, cols}, DType::f32, 251)};
                 const Attrs a = Attrs().set("accumulate", accumulate);
                 if (!accumulate) return OpCall{in, a};
                 Tensor into = randn_input({cols}, DType::f32, 252);
                 in.push_back(into);
                 return adding_into_sums(in, a, into, OpKind::LayerNormParamSums);
               },
           .reference =
               [=](const OpCall& c) {
                 const std::vector<double> part = host_values(c.inputs[0]);
                 Expected e(size_t(S), std::vector<double>(size_t(cols), 0.0));
                 if (accumulate) e[2] = host_values(c.inputs[1]);
                 for (int64_t p = 0; p < parts; ++p)
                   for (int64_t k = 0; k < S; ++k)
                     for (int64_t j = 0; j < cols; ++j) e[size_t(k)][size_t(j)] += part[size_t((p * S + k) * cols + j)];
                 return e;
               }});
    }
}

}  // namespace

std::vector<OpTestCase> fused_norm_cases() {
  std::vector<OpTestCase> cases;
  add_layer_norm_cases(cases);
  add_layer_norm_dropout_cases(cases);
  add_layer_norm_partials_cases(cases);
  return cases;
}

}  // namespace reel::harness
