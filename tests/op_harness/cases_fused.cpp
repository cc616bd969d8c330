// Op-harness cases of the fused ops (kernels/ops.def's "fused:" lines): the ops the compiler's passes
// rewrite node chains into; the reduce family's fused ops are in cases_fused_reduce.cpp, the layer
// norm's in cases_fused_norm.cpp. Each case's reference is the unfused chain itself, run op by op through
// dispatch on the CPU (a layer norm then a cast, a matmul then the bias add and GELU, ...): what a
// pass assumes when it swaps the chain for the fused op. On the GPU the same cases compare the fused
// CUDA kernels (cuBLASLt epilogues, the attention and norm kernels with their 16-bit copies, the
// NVRTC-compiled elementwise programs, the multi-tensor optimizer) against the CPU.
// Shapes are the ones those kernels take in a training step: 16-bit copies of f32 results, GEMMs
// whose N is a multiple of 8 (cuBLASLt's rule for the GELU epilogue), attention with head size 16.
// The case's dtype is the 16-bit dtype of the copy where the op writes one (the f32 inputs stay f32).
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "kernels/fused_expr.h"
#include "tests/op_harness/fused_references.h"
#include "tests/op_harness/inputs.h"

namespace reel::harness {
namespace {

// ---- GEMMs: into a given result (f32, transposed, added to) and with the bias (+ GELU) epilogue ----

void add_gemm_cases(std::vector<OpTestCase>& cases) {
  struct Into {
    const char* name;
    bool f32_result, transpose, accumulate;
  };
  for (Into v : {Into{"", false, false, false}, Into{"f32_result_", true, false, false},
                 Into{"transposed_", true, true, false}, Into{"transposed_accumulate_", true, true, true}}) {
    cases.push_back(
        {.op = OpKind::MatmulInto,
         .name = std::string("matmul_into_") + v.name + "24x40x16",
         .dtypes = v.f32_result ? std::vector<DType>(k16Bit) : std::vector<DType>(kFloatTypes),
         .make =
             [v](Device, DType t) {
               Inputs in{randn_input({24, 40}, t, 221, Layout::transposed), randn_input({40, 16}, t, 222)};
               Attrs a = Attrs().set("transpose", v.transpose).set("accumulate", v.accumulate);
               if (v.f32_result) a.set("dtype", DType::f32);
               if (!v.accumulate) return OpCall{in, a};
               Tensor grad = randn_input(v.transpose ? Shape{16, 24} : Shape{24, 16}, DType::f32, 223);
               in.push_back(grad);
               return OpCall{in, a, {grad}};
             },
         .reference =
             [v](const OpCall& c) {
               const DType acc = c.inputs[0].dtype() == DType::f64 ? DType::f64 : DType::f32;
               Tensor p = run1(OpKind::Matmul, {cast(c.inputs[0], acc), cast(c.inputs[1], acc)});
               if (v.transpose) p = copy_of(p.transpose(0, 1));
               if (v.accumulate) p = run1(OpKind::Add, {copy_of(c.inputs[2]), p});
               return Expected{host_values(p)};
             }});
  }
  struct Epilogue {
    const char* name;
    DType result;  // f32, or the operands' dtype (f32 here: the case's dtype)
    bool gelu;
  };
  for (Epilogue v : {Epilogue{"bias_", DType::f32, false}, Epilogue{"bias_16bit_", DType::bf16, false},
                     Epilogue{"bias_gelu_16bit_", DType::bf16, true}}) {
    const bool sixteen = v.result != DType::f32 || std::string(v.name) == "bias_16bit_";
    cases.push_back(
        {.op = OpKind::GemmEpilogue,
         .name = std::string("gemm_epilogue_") + v.name + "2x12x32x24",
         .dtypes = sixteen ? std::vector<DType>(k16Bit) : std::vector<DType>{DType::f32, DType::bf16, DType::f16},
         .make =
             [v, sixteen](Device, DType t) {
               const DType y = sixteen ? t : DType::f32;  // f32 case: a's dtype t, an f32 result
               Inputs in{randn_input({2, 12, 32}, t, 231), randn_input({32, 24}, t, 232, Layout::transposed),
                         randn_input({24}, y, 233)};
               return OpCall{in, Attrs().set("dtype", y).set("gelu", v.gelu)};
             },
         .reference =
             [v](const OpCall& c) {
               Tensor p = run1(OpKind::Matmul, {cast(c.inputs[0], DType::f32), cast(c.inputs[1], DType::f32)});
               p = run1(OpKind::Add, {p, cast(c.inputs[2], DType::f32)});
               const DType y = c.attrs.dtype("dtype");
               if (!v.gelu) return Expected{host_values(cast(p, y))};
               return Expected{host_values(cast(run1(OpKind::Gelu, {p}), y)), host_values(cast(p, y))};
             }});
  }
}

// ---- attention writing its 16-bit copy, forward and backward ----

void add_fused_attention_cases(std::vector<OpTestCase>& cases) {
  struct Variant {
    const char* name;
    bool keep_f32, qkv_16bit, masked;  // masked: not causal, with a key padding (its mask the last input)
  };
  for (Variant v : {Variant{"", true, false, false}, Variant{"copy_only_", false, false, false},
                    Variant{"qkv_16bit_", true, true, false}, Variant{"masked_full_", true, false, true},
                    Variant{"masked_full_copy_only_", false, true, true}}) {
    auto forward = [v](DType t) {
      Tensor qkv = randn_input({2, 16, 96}, DType::f32, 261);
      if (v.qkv_16bit) qkv = cast(qkv, t);
      Attrs a = Attrs().set("heads", int64_t(2)).set("compute", t).set("keep_f32", v.keep_f32).set("causal", !v.masked);
      if (!v.masked) return OpCall{{qkv}, a};
      std::vector<double> m(32, 0.0);  // (2, 1, 1, 16): batch 0 ignores keys 13..15, batch 1 key 0
      for (int s = 13; s < 16; ++s) m[size_t(s)] = -std::numeric_limits<double>::infinity();
      m[16] = -std::numeric_limits<double>::infinity();
      return OpCall{{qkv, values_input(m, {2, 1, 1, 16}, DType::f32)}, a};
    };
    cases.push_back({.op = OpKind::AttentionCast,
                     .name = std::string("attention_cast_") + v.name + "2x16x96_heads_2",
                     .dtypes = k16Bit,
                     .make = [forward](Device, DType t) { return forward(t); },
                     .reference =
                         [v](const OpCall& c) {
                           std::vector<Tensor> f = dispatch(OpKind::Attention, c.inputs, Attrs(c.attrs).set("dtype", DType::f32));
                           Expected e;
                           if (v.keep_f32) e.push_back(host_values(f[0]));
                           e.push_back(host_values(f[1]));
                           e.push_back(host_values(cast(f[0], c.attrs.dtype("compute"))));
                           return e;
                         }});
    cases.push_back({.op = OpKind::AttentionBackwardCast,
                     .name = std::string("attention_backward_cast_") + v.name + "2x16x96_heads_2",
                     .dtypes = k16Bit,
                     .make =
                         [forward](Device, DType t) {
                           OpCall f = forward(t);
                           std::vector<Tensor> saved =
                               dispatch(OpKind::Attention, f.inputs, Attrs(f.attrs).set("dtype", DType::f32));
                           Tensor dy = randn_input({2, 16, 32}, DType::f32, 262, Layout::transposed);
                           std::vector<Tensor> in{dy, f.inputs[0], saved[0], saved[1]};
                           if (f.inputs.size() > 1) in.push_back(f.inputs[1]);  // the mask
                           return OpCall{in, f.attrs};
                         },
                     .reference =
                         [v](const OpCall& c) {
                           Tensor d = run1(OpKind::AttentionBackward, c.inputs, Attrs(c.attrs).set("dtype", DType::f32));
                           Expected e;
                           if (v.keep_f32) e.push_back(host_values(d));
                           e.push_back(host_values(cast(d, c.attrs.dtype("compute"))));
                           return e;
                         }});
  }
}

// ---- the multi-tensor optimizer: every tensor's update as its own adamw_step / sgd_step ----

const Shape kParamShapes[] = {{4, 5}, {7}, {3, 2}};

void add_fused_optimizer_cases(std::vector<OpTestCase>& cases) {
  for (std::optional<double> found : {std::optional<double>(), std::optional<double>(0.0), std::optional<double>(1.0)}) {
    const std::string flag = !found ? "" : *found != 0 ? "skipped_on_inf_" : "flag_clear_";
    cases.push_back(
        {.op = OpKind::MultiTensorAdamW,
         .name = "multi_tensor_adamw_" + flag + "3_tensors",
         .dtypes = kFloatTypes,
         .make =
             [found](Device, DType t) {
               OpCall c{{}, Attrs().set("beta1", 0.9).set("beta2", 0.999).set("eps", 1e-8).set("weight_decay", 0.01).set("tensors", int64_t(3))};
               uint64_t seed = 270;
               for (const Shape& s : kParamShapes) {
                 Tensor p = randn_input(s, t, seed++), m = randn_input(s, t, seed++, Layout::contiguous, 0.1);
                 Tensor v = uniform_input(s, t, seed++, 0.01, 0.1);
                 c.inputs.insert(c.inputs.end(), {p, randn_input(s, t, seed++), m, v});
                 c.outputs.insert(c.outputs.end(), {p, m, v});
               }
               c.inputs.insert(c.inputs.end(), {found ? scalar_input(*found, DType::f32) : Tensor(), scalar_input(1e-2, DType::f64),
                                                scalar_input(3.0, DType::f64)});
               return c;
             },
         .reference =
             [](const OpCall& c) {
               Expected e;
               for (size_t i = 0; i < 3; ++i) {
                 std::vector<Tensor> pmv{copy_of(c.inputs[4 * i]), copy_of(c.inputs[4 * i + 2]), copy_of(c.inputs[4 * i + 3])};
                 dispatch_out(OpKind::AdamWStep, {pmv[0], c.inputs[4 * i + 1], pmv[1], pmv[2], c.inputs[12], c.inputs[13], c.inputs[14]},
                              pmv, c.attrs);
                 for (const Tensor& t : pmv) e.push_back(host_values(t));
               }
               return e;
             }});
  }
  for (bool momentum : {false, true})
    cases.push_back(
        {.op = OpKind::MultiTensorSgd,
         .name = std::string("multi_tensor_sgd_") + (momentum ? "momentum_" : "") + "3_tensors",
         .dtypes = kFloatTypes,
         .make =
             [momentum](Device, DType t) {
               OpCall c{{}, Attrs().set("momentum", momentum ? 0.9 : 0.0).set("dampening", 0.0).set("weight_decay", 0.01)
                                .set("nesterov", false).set("first_step", false).set("tensors", int64_t(3))};
               uint64_t seed = 290;
               for (const Shape& s : kParamShapes) {
                 Tensor p = randn_input(s, t, seed++), b = momentum ? randn_input(s, t, seed++, Layout::contiguous, 0.1) : Tensor();
                 c.inputs.insert(c.inputs.end(), {p, randn_input(s, t, seed++), b});
                 c.outputs.push_back(p);
                 if (momentum) c.outputs.push_back(b);
               }
               c.inputs.insert(c.inputs.end(), {Tensor(), scalar_input(0.1, DType::f64)});
               return c;
             },
         .reference =
             [momentum](const OpCall& c) {
               Expected e;
               for (size_t i = 0; i < 3; ++i) {
                 std::vector<Tensor> out{copy_of(c.inputs[3 * i])};
                 Tensor b = momentum ? copy_of(c.inputs[3 * i + 2]) : Tensor();
                 if (momentum) out.push_back(b);
                 dispatch_out(OpKind::SgdStep, {out[0], c.inputs[3 * i + 1], b, c.inputs[9], c.inputs[10]}, out, c.attrs);
                 for (const Tensor& t : out) e.push_back(host_values(t));
               }
               return e;
             }});
}

// ---- fused elementwise programs: each op of the chain as its own op ----

// gelu(x + bias) * 0.5, stored in x's dtype and in f32: x (4, 6) transposed, bias (6) broadcast.
Attrs gelu_chain_attrs(DType t) {
  FusedExpr e;
  const int x = e.load(0, t), b = e.load(1, t);
  const int y = e.op(OpKind::MulScalar, {e.op(OpKind::Gelu, {e.op(OpKind::Add, {x, b}, t)}, t)}, t, 0.5);
  e.store(0, y, t);
  e.store(1, e.cast(y, DType::f32), DType::f32);
  return fused_elementwise_attrs(e, {4, 6}, Device::cpu());
}

// acc += 2 g, written into acc itself (a gradient accumulation the pass fuses in place).
Attrs accumulate_attrs(DType t) {
  FusedExpr e;
  const int acc = e.load(0, t), g = e.load(1, t);
  e.store(0, e.op(OpKind::Add, {acc, e.op(OpKind::MulScalar, {g}, t, 2.0)}, t), t);
  return fused_elementwise_attrs(e, {3, 8}, Device::cpu());
}

// silu(x) + gelu_erf(x) and silu_backward(g, x) + gelu_erf_backward(g, x): the activations of the
// seed's models (YOLOv8's SiLU, ViT's exact GELU) and their gradients inside one program.
Attrs silu_gelu_erf_attrs(DType t) {
  FusedExpr e;
  const int x = e.load(0, t), g = e.load(1, t);
  e.store(0, e.op(OpKind::Add, {e.op(OpKind::Silu, {x}, t), e.op(OpKind::GeluErf, {x}, t)}, t), t);
  e.store(1, e.op(OpKind::Add, {e.op(OpKind::SiluBackward, {g, x}, t), e.op(OpKind::GeluErfBackward, {g, x}, t)}, t), t);
  return fused_elementwise_attrs(e, {4, 6}, Device::cpu());
}

// Dropout inside a kernel: y = x * mask + r with the mask drawn from a Philox state input {1234, 50}
// (offset 3 past its base), and a second mask from the seed and offset in the program alone. 4 x 37
// elements: the vector loop's packs and the scalar loop's tail both draw.
Attrs dropout_add_attrs(DType t) {
  FusedExpr e;
  const int x = e.load(0, t), r = e.load(1, t);
  const int m = e.random(0, t, 0.2, 0, 3);
  e.store(0, e.op(OpKind::Add, {e.op(OpKind::Mul, {x, m}, t), r}, t), t);
  e.store(1, e.random(-1, t, 0.5, 77, 9), t);
  return fused_elementwise_attrs(e, {4, 37}, Device::cpu());
}

// GELU's backward as a GPT's MLP has it, with the column sums of its 16-bit result (fc's bias
// gradient): dx = t(gelu_backward(f32(g), f32(z))) for g, z of dtype t; sums (C) [+]= sum over the
// rows of dx.
Attrs gelu_backward_sums_attrs(DType t, const Shape& shape, bool accumulate) {
  FusedExpr e;
  const int g = e.cast(e.load(0, t), DType::f32), z = e.cast(e.load(1, t), DType::f32);
  e.store(0, e.cast(e.op(OpKind::GeluBackward, {g, z}, DType::f32), t), t);
  Attrs a = fused_elementwise_attrs(e, shape, Device::cpu());
  set_fused_column_sums(a, {0, accumulate});
  return a;
}

void add_fused_elementwise_column_sums_cases(std::vector<OpTestCase>& cases) {
  struct Variant {
    Shape shape;
    bool accumulate;
    const char* what;  // which CUDA build the shape takes
  };
  // (70, 520): the column-sums kernel, three column tiles (the last of 8 columns), chunks of rows;
  // (3, 4, 64) the same with the rows in two dims; (5, 36): rows of 36 columns, not a multiple of 8,
  // so the elementwise kernel and then the column_sums op's.
  for (const Variant& v : {Variant{{70, 520}, false, "tiles_"}, Variant{{70, 520}, true, "tiles_accumulate_"},
                           Variant{{3, 4, 64}, true, "batched_accumulate_"}, Variant{{5, 36}, false, "rows_of_36_"},
                           Variant{{5, 36}, true, "rows_of_36_accumulate_"}}) {
    std::string dims;
    for (int64_t d : v.shape) dims += (dims.empty() ? "" : "x") + std::to_string(d);
    cases.push_back(
        {.op = OpKind::FusedElementwise,
         .name = std::string("fused_elementwise_gelu_backward_column_sums_") + v.what + dims,
         .dtypes = k16Bit,
         .make =
             [v](Device, DType t) {
               Inputs in{randn_input(v.shape, t, 311), randn_input(v.shape, t, 312)};
               const Attrs a = gelu_backward_sums_attrs(t, v.shape, v.accumulate);
               if (!v.accumulate) return OpCall{in, a};
               Tensor sums = randn_input({v.shape.back()}, DType::f32, 313);
               in.push_back(sums);
               return adding_into_sums(in, a, sums, OpKind::FusedElementwise);
             },
         .reference =
             [v](const OpCall& c) {
               const DType t = c.inputs[0].dtype();
               const Tensor dx =
                   cast(run1(OpKind::GeluBackward, {cast(c.inputs[0], DType::f32), cast(c.inputs[1], DType::f32)}), t);
               std::vector<int64_t> rows;
               for (size_t d = 0; d + 1 < v.shape.size(); ++d) rows.push_back(int64_t(d));
               Tensor s = run1(OpKind::Sum, {cast(dx, DType::f32)}, Attrs().set("dims", rows));
               if (v.accumulate) s = run1(OpKind::Add, {copy_of(c.inputs[2]), s});
               return Expected{host_values(dx), host_values(s)};
             }});
  }
}

void add_fused_elementwise_cases(std::vector<OpTestCase>& cases) {
  add_fused_elementwise_column_sums_cases(cases);
  cases.push_back({.op = OpKind::FusedElementwise,
                   .name = "fused_elementwise_dropout_masks_drawn_in_the_kernel_4x37",
                   .dtypes = kFloatTypes,
                   .make =
                       [](Device, DType t) {
                         return OpCall{{randn_input({4, 37}, t, 307), randn_input({4, 37}, t, 308),
                                        values_input({1234, 50}, {2}, DType::i64)},
                                       dropout_add_attrs(t)};
                       },
                   .tol_scale = 1,
                   .reference =
                       [](const OpCall& c) {
                         // dropout's own kernel draws the same masks from the same key and counter.
                         const Attrs first = Attrs().set("p", 0.2).set("seed", int64_t(1234)).set("offset", int64_t(53));
                         const std::vector<Tensor> d = dispatch(OpKind::Dropout, {c.inputs[0]}, first);
                         const Tensor second = dispatch(OpKind::Dropout, {c.inputs[0]},
                                                        Attrs().set("p", 0.5).set("seed", int64_t(77)).set("offset", int64_t(9)))[1];
                         return Expected{host_values(run1(OpKind::Add, {d[0], c.inputs[1]})), host_values(second)};
                       }});
  cases.push_back({.op = OpKind::FusedElementwise,
                   .name = "fused_elementwise_silu_gelu_erf_and_backwards_4x6",
                   .dtypes = kFloatTypes,
                   .make =
                       [](Device, DType t) {
                         return OpCall{{randn_input({4, 6}, t, 305), randn_input({4, 6}, t, 306, Layout::transposed)},
                                       silu_gelu_erf_attrs(t)};
                       },
                   .reference =
                       [](const OpCall& c) {
                         const Tensor& x = c.inputs[0];
                         const Tensor& g = c.inputs[1];
                         Tensor y = run1(OpKind::Add, {run1(OpKind::Silu, {x}), run1(OpKind::GeluErf, {x})});
                         Tensor dx = run1(OpKind::Add, {run1(OpKind::SiluBackward, {g, x}), run1(OpKind::GeluErfBackward, {g, x})});
                         return Expected{host_values(y), host_values(dx)};
                       }});
  cases.push_back({.op = OpKind::FusedElementwise,
                   .name = "fused_elementwise_add_gelu_mul_scalar_copy_4x6",
                   .dtypes = kFloatTypes,
                   .make =
                       [](Device, DType t) {
                         return OpCall{{randn_input({4, 6}, t, 301, Layout::transposed), randn_input({6}, t, 302)}, gelu_chain_attrs(t)};
                       },
                   .reference =
                       [](const OpCall& c) {
                         Tensor y = run1(OpKind::Add, {c.inputs[0], c.inputs[1]});
                         y = run1(OpKind::MulScalar, {run1(OpKind::Gelu, {y})}, Attrs().set("value", 0.5));
                         return Expected{host_values(y), host_values(cast(y, DType::f32))};
                       }});
  cases.push_back({.op = OpKind::FusedElementwise,
                   .name = "fused_elementwise_in_place_accumulate_3x8",
                   .dtypes = kFloatTypes,
                   .make =
                       [](Device, DType t) {
                         Tensor acc = randn_input({3, 8}, t, 303);
                         return OpCall{{acc, randn_input({3, 8}, t, 304, Layout::strided)}, accumulate_attrs(t), {acc}};
                       },
                   .reference =
                       [](const OpCall& c) {
                         Tensor g2 = run1(OpKind::MulScalar, {c.inputs[1]}, Attrs().set("value", 2.0));
                         return Expected{host_values(run1(OpKind::Add, {c.inputs[0], g2}))};
                       }});
}

// ---- multi_tensor_cast: the weight casts of a step in one launch ----

// Pairs of every kind the CUDA kernel takes: a Linear's W^T (a tiled transpose), a bias (flat), a
// convolution's weight written channels-last (a batch of transposes), and a strided view, which takes
// the copy's own kernel. Reference: one copy per pair.
void add_multi_tensor_cast_cases(std::vector<OpTestCase>& cases) {
  cases.push_back({.op = OpKind::MultiTensorCast,
                   .name = "multi_tensor_cast_transposed_flat_channels_last_strided",
                   .dtypes = {DType::bf16, DType::f16, DType::f64},
                   .make =
                       [](Device, DType t) {
                         Inputs in{randn_input({40, 70}, DType::f32, 241, Layout::transposed),
                                   randn_input({1037}, DType::f32, 242), randn_input({6, 5, 3, 3}, DType::f32, 243),
                                   randn_input({3, 5, 7}, DType::f32, 244, Layout::strided)};
                         std::vector<Tensor> out{Tensor::empty({40, 70}, t), Tensor::empty({1037}, t),
                                                 randn_input({6, 5, 3, 3}, t, 245, Layout::channels_last),
                                                 Tensor::empty({3, 5, 7}, t)};
                         return OpCall{in, Attrs().set("dtype", t), out};
                       },
                   .reference =
                       [](const OpCall& c) {
                         Expected e;
                         for (const Tensor& x : c.inputs) e.push_back(host_values(cast(x, c.attrs.dtype("dtype"))));
                         return e;
                       }});
  // Accumulating (compile/passes/fuse_grad_casts.cpp): 16-bit weight gradients added to f32 gradients
  // in place, a convolution's written channels-last (a batch of transposes on the GPU) and a flat one.
  // Reference: the cast, then the add, per pair.
  cases.push_back(
      {.op = OpKind::MultiTensorCast,
       .name = "multi_tensor_cast_accumulate_channels_last_flat",
       .dtypes = {DType::bf16, DType::f16},
       .make =
           [](Device, DType t) {
             Tensor g0 = randn_input({6, 5, 3, 3}, DType::f32, 246), g1 = randn_input({1037}, DType::f32, 247),
                    g2 = randn_input({33, 4, 3, 3}, DType::f32, 248);
             Inputs in{randn_input({6, 5, 3, 3}, t, 249, Layout::channels_last),
                       randn_input({1037}, t, 250),
                       randn_input({33, 4, 3, 3}, t, 251, Layout::channels_last),
                       g0,
                       g1,
                       g2};
             return OpCall{in, Attrs().set("dtype", DType::f32).set("accumulate", true), {g0, g1, g2}};
           },
       .reference =
           [](const OpCall& c) {
             Expected e;
             for (size_t k = 0; k < 3; ++k)
               e.push_back(host_values(run1(OpKind::Add, {copy_of(c.inputs[3 + k]), cast(c.inputs[k], DType::f32)})));
             return e;
           }});
}

}  // namespace

std::vector<OpTestCase> fused_cases() {
  std::vector<OpTestCase> cases;
  add_gemm_cases(cases);
  add_multi_tensor_cast_cases(cases);
  add_fused_attention_cases(cases);
  add_fused_optimizer_cases(cases);
  add_fused_elementwise_cases(cases);
  return cases;
}

}  // namespace reel::harness
