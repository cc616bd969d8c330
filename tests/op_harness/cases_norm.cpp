// Op-harness cases of layer, group and batch norm and their backward ops (schemas:
// kernels/schema/norm.cpp; dropout's, of the same family: cases_dropout.cpp). Norms run with weight and bias, with one
// of them, with neither, over one and several trailing dims, on non-contiguous x; batch norm in training (running
// statistics updated in place, which the runner compares as inputs after the call) and in eval, and with f32 running
// statistics under 16-bit x. Backward ops get the statistics their forward saved.
// Group and batch norm, forward and backward, also read a bf16/f16 x as f32 (attr dtype = f32, what
// compile/passes/read_norm_input_16bit.cpp writes): their reference is the composition the compiler
// replaced, x cast to f32 and then the f32 op (tests/test_norm_16bit_input.cpp checks the bits).
// Group norm also writes a global average pool of y and reads that pool's broadcast gradient (attrs
// pool, grad_scale: add_pool_cases); group and batch norm backward add dw, db into given gradients
// (attr accumulate: accumulating()).
// Plain-loop references: all three norms are "normalise each set by its own mean and variance, then
// an affine map per feature" (sets: rows; (n, group)s; channels), so one forward and one backward
// formula over a (set, feature) labelling of the elements serves them.
#include <cmath>

#include "tests/op_harness/inputs.h"

namespace reel::harness {
namespace {

using Inputs = std::vector<Tensor>;
constexpr double kEps = 1e-5, kMomentum = 0.1;

// ---- the shared reference ----

// Which set and which feature (index into w, b, dw, db) each element (row-major) belongs to.
struct Sets {
  std::vector<int64_t> set, feature;
  int64_t sets = 0, features = 0;
};

Sets layer_sets(const Shape& x, int64_t k) {
  int64_t cols = 1;
  for (size_t d = x.size() - size_t(k); d < x.size(); ++d) cols *= x[d];
  Sets s{{}, {}, numel_of(x) / cols, cols};
  for (int64_t e = 0; e < numel_of(x); ++e) s.set.push_back(e / cols), s.feature.push_back(e % cols);
  return s;
}

// x (N, C, *): groups of C/G channels per sample (G = C: one set per channel of each sample; batch
// norm's sets are channels across the batch: per_sample false).
Sets channel_sets(const Shape& x, int64_t G, bool per_sample) {
  const int64_t N = x[0], C = x[1], S = numel_of(x) / (N * C);
  Sets s{{}, {}, per_sample ? N * G : C, C};
  for (int64_t e = 0; e < numel_of(x); ++e) {
    const int64_t n = e / (C * S), c = (e / S) % C;
    s.set.push_back(per_sample ? n * G + c / (C / G) : c);
    s.feature.push_back(c);
  }
  return s;
}

std::vector<double> values_or(const Tensor& t, int64_t n, double fallback) {
  return t.defined() ? host_values(t) : std::vector<double>(size_t(n), fallback);
}

// (y, mean, rstd): biased variance, rstd = 1 / sqrt(var + eps), y = (x - mean) rstd w + b.
Expected normalise(const Sets& s, const OpCall& c) {
  std::vector<double> x = host_values(c.inputs[0]), w = values_or(c.inputs[1], s.features, 1.0);
  std::vector<double> b = values_or(c.inputs[2], s.features, 0.0);
  std::vector<double> mean(size_t(s.sets), 0.0), var(size_t(s.sets), 0.0), count(size_t(s.sets), 0.0), y(x.size());
  for (size_t e = 0; e < x.size(); ++e) mean[s.set[e]] += x[e], count[s.set[e]] += 1;
  for (int64_t k = 0; k < s.sets; ++k) mean[k] /= count[k];
  for (size_t e = 0; e < x.size(); ++e) var[s.set[e]] += (x[e] - mean[s.set[e]]) * (x[e] - mean[s.set[e]]);
  std::vector<double> rstd(size_t(s.sets));
  for (int64_t k = 0; k < s.sets; ++k) rstd[k] = 1 / std::sqrt(var[k] / count[k] + kEps);
  for (size_t e = 0; e < x.size(); ++e)
    y[e] = (x[e] - mean[s.set[e]]) * rstd[s.set[e]] * w[s.feature[e]] + b[s.feature[e]];
  return {y, mean, rstd};
}

// (dx, dw, db) from inputs (g, x, w?, mean, rstd): with gw = g w and means over each set,
// dx = rstd (gw - mean(gw) - xhat mean(gw xhat)); dw = sum g xhat, db = sum g per feature.
// frozen (batch norm in eval): the statistics are constants and dx = gw rstd.
// `g_values`, when given, stands for g's values (a fused op's gradient at the norm's output).
Expected normalise_backward(const Sets& s, const OpCall& c, bool frozen = false,
                            const std::vector<double>* g_values = nullptr) {
  std::vector<double> g = g_values ? *g_values : host_values(c.inputs[0]), x = host_values(c.inputs[1]);
  std::vector<double> w = values_or(c.inputs[2], s.features, 1.0), mean = host_values(c.inputs[3]);
  std::vector<double> rstd = host_values(c.inputs[4]), dx(x.size()), dw(size_t(s.features), 0.0), db = dw;
  std::vector<double> sum_gw(size_t(s.sets), 0.0), sum_gwx(size_t(s.sets), 0.0), count(size_t(s.sets), 0.0);
  auto xhat = [&](size_t e) { return (x[e] - mean[s.set[e]]) * rstd[s.set[e]]; };
  for (size_t e = 0; e < x.size(); ++e) {
    const double gw = g[e] * w[s.feature[e]];
    sum_gw[s.set[e]] += gw, sum_gwx[s.set[e]] += gw * xhat(e), count[s.set[e]] += 1;
    dw[s.feature[e]] += g[e] * xhat(e), db[s.feature[e]] += g[e];
  }
  for (size_t e = 0; e < x.size(); ++e) {
    const int64_t k = s.set[e];
    const double gw = g[e] * w[s.feature[e]];
    dx[e] = frozen ? gw * rstd[k] : rstd[k] * (gw - sum_gw[k] / count[k] - xhat(e) * sum_gwx[k] / count[k]);
  }
  return {dx, dw, db};
}

// ---- layer norm and group norm ----

struct Norm {
  const char* name;
  Shape x;
  Layout layout;
  int64_t k_or_groups;  // layer norm: normalized dims; group norm: groups
  bool weight, bias;
  bool gradcheck;
  double shift = 0;  // added to x: a large mean
};

OpCall norm_call(const Norm& n, DType t, bool layer) {
  const Shape features = layer ? Shape(n.x.end() - n.k_or_groups, n.x.end()) : Shape{n.x[1]};
  Tensor w = n.weight ? randn_input(features, t, 111, Layout::contiguous, 0.5, 1.0) : Tensor();
  Tensor b = n.bias ? randn_input(features, t, 112, Layout::contiguous, 0.5) : Tensor();
  Attrs a = Attrs().set("eps", kEps).set(layer ? "normalized_ndim" : "groups", n.k_or_groups);
  return OpCall{{randn_input(n.x, t, 110, n.layout, 1.0, n.shift), w, b}, a};
}

// The backward's inputs: (g, x, w, mean, rstd) with the statistics of a forward on the CPU.
OpCall backward_call(OpKind forward, const OpCall& f, DType t, Attrs attrs) {
  std::vector<Tensor> saved = dispatch(forward, f.inputs, f.attrs);
  // g channels-last beside a channels-last x (a convolution's gradient), else transposed.
  const Tensor& x = f.inputs[0];
  const Layout g_layout = x.dim() == 4 && !x.is_contiguous() && x.is_contiguous(MemoryFormat::ChannelsLast)
                              ? Layout::channels_last
                              : Layout::transposed;
  return OpCall{{randn_input(x.shape(), t, 113, g_layout), f.inputs[0], f.inputs[1], saved[1], saved[2]},
                std::move(attrs)};
}

// Group or batch norm backward case c with attr accumulate: dw and db added to two given (C)
// gradients (a later micro-batch's, compile/passes/write_results_into_grads.cpp). The reference is
// c's, plus those gradients.
OpTestCase accumulating(OpTestCase c) {
  c.name += "_accumulate";
  c.grad = {};
  c.make = [make = c.make, op = c.op](Device d, DType t) {
    OpCall call = make(d, t);
    const TensorMeta dw = infer_outputs(op, call.inputs, call.attrs)[1];
    call.inputs.push_back(randn_input(dw.shape, dw.dtype, 152));
    call.inputs.push_back(randn_input(dw.shape, dw.dtype, 153));
    call.attrs.set("accumulate", true);
    return call;
  };
  c.reference = [reference = c.reference](const OpCall& call) {
    const size_t n = call.inputs.size();
    OpCall plain{std::vector<Tensor>(call.inputs.begin(), call.inputs.end() - 2), Attrs(call.attrs)};
    plain.attrs.set("accumulate", false);
    Expected e = reference(plain);
    for (size_t k : {1, 2}) {
      const std::vector<double> before = host_values(call.inputs[n - 3 + k]);
      for (size_t i = 0; i < before.size(); ++i) e[k][i] += before[i];
    }
    return e;
  };
  return c;
}

void add_norm_pair(std::vector<OpTestCase>& cases, const Norm& n, bool layer, std::vector<DType> dtypes) {
  const OpKind op = layer ? OpKind::LayerNorm : OpKind::GroupNorm;
  const OpKind backward = layer ? OpKind::LayerNormBackward : OpKind::GroupNormBackward;
  auto sets = [n, layer](const Shape& x) { return layer ? layer_sets(x, n.k_or_groups) : channel_sets(x, n.k_or_groups, true); };
  GradcheckFn grad;
  if (n.gradcheck && layer)
    grad = [n](const Inputs& x) { return layer_norm(x[0], Shape(n.x.end() - n.k_or_groups, n.x.end()), x[1], x[2], kEps); };
  if (n.gradcheck && !layer) grad = [n](const Inputs& x) { return group_norm(x[0], n.k_or_groups, x[1], x[2], kEps); };
  cases.push_back({.op = op,
                   .name = std::string(op_name(op)) + "_" + n.name,
                   .dtypes = dtypes,
                   .make = [n, layer](Device, DType t) { return norm_call(n, t, layer); },
                   .grad = grad,
                   .reference = [sets](const OpCall& c) { return normalise(sets(c.inputs[0].shape()), c); }});
  cases.push_back({.op = backward,
                   .name = std::string(op_name(backward)) + "_" + n.name,
                   .dtypes = dtypes,
                   .make =
                       [n, layer, op](Device, DType t) {
                         OpCall f = norm_call(n, t, layer);
                         return backward_call(op, f, t, layer ? Attrs() : Attrs().set("groups", n.k_or_groups));
                       },
                   .reference = [sets](const OpCall& c) { return normalise_backward(sets(c.inputs[1].shape()), c); }});
  if (!layer) cases.push_back(accumulating(cases.back()));
}

void add_layer_and_group_norm_cases(std::vector<OpTestCase>& cases) {
  using L = Layout;
  for (const Norm& n : {Norm{"rows_3x5", {3, 5}, L::contiguous, 1, true, true, true},
                        Norm{"last_2_dims_no_affine_2x3x4", {2, 3, 4}, L::contiguous, 2, false, false, true},
                        Norm{"transposed_weight_only_4x6", {4, 6}, L::transposed, 1, true, false, true},
                        Norm{"strided_bias_only_3x8", {3, 8}, L::strided, 1, false, true, false},
                        Norm{"long_rows_2x512", {2, 512}, L::contiguous, 1, true, true, false}})
    add_norm_pair(cases, n, true, kFloatTypes);
  // x near 100 with spread 0.1: a one-pass variance would cancel; 16-bit types cannot hold the spread.
  add_norm_pair(cases, Norm{"large_mean_3x8", {3, 8}, L::contiguous, 1, true, true, false, 100.0}, true,
                {DType::f32, DType::f64});
  for (const Norm& n :
       {Norm{"2x4x3_groups_2", {2, 4, 3}, L::contiguous, 2, true, true, true},
        Norm{"transposed_no_affine_2x6x2x2_groups_3", {2, 6, 2, 2}, L::transposed, 3, false, false, true},
        Norm{"strided_weight_only_3x4_groups_1", {3, 4}, L::strided, 1, true, false, true},
        Norm{"channels_last_2x4x3x3_groups_4", {2, 4, 3, 3}, L::channels_last, 4, true, true, false},
        // Sets of several channels and positions, read where they lie on the GPU.
        Norm{"channels_last_4x32x8x8_groups_4", {4, 32, 8, 8}, L::channels_last, 4, true, true, false}})
    add_norm_pair(cases, n, false, kFloatTypes);
}

// ---- batch norm ----

struct Batch {
  const char* name;
  Shape x;
  Layout layout;
  bool training, affine, running;
  bool f32_running;  // running statistics in f32 whatever x's dtype
  bool gradcheck;
};

OpCall batch_call(const Batch& b, DType t) {
  const int64_t C = b.x[1];
  const DType rt = b.f32_running ? DType::f32 : t;
  Tensor w = b.affine ? randn_input({C}, t, 121, Layout::contiguous, 0.5, 1.0) : Tensor();
  Tensor bias = b.affine ? randn_input({C}, t, 122, Layout::contiguous, 0.5) : Tensor();
  Tensor rm = b.running ? randn_input({C}, rt, 123, Layout::contiguous, 0.5) : Tensor();
  Tensor rv = b.running ? uniform_input({C}, rt, 124, 0.5, 1.5) : Tensor();
  Attrs a = Attrs().set("training", b.training).set("momentum", kMomentum).set("eps", kEps);
  return OpCall{{randn_input(b.x, t, 120, b.layout, 1.0, 0.5), w, bias, rm, rv}, a};
}

// Eval: (y, running_mean, 1/sqrt(running_var + eps)) with the running statistics as the set statistics.
Expected batch_norm_reference(const Batch& b, const OpCall& c) {
  const Sets s = channel_sets(c.inputs[0].shape(), b.x[1], false);
  if (b.training) return normalise(s, c);
  std::vector<double> x = host_values(c.inputs[0]), w = values_or(c.inputs[1], s.features, 1.0);
  std::vector<double> bias = values_or(c.inputs[2], s.features, 0.0), mean = host_values(c.inputs[3]);
  std::vector<double> rstd = host_values(c.inputs[4]), y(x.size());
  for (double& r : rstd) r = 1 / std::sqrt(r + kEps);
  for (size_t e = 0; e < x.size(); ++e) y[e] = (x[e] - mean[s.set[e]]) * rstd[s.set[e]] * w[s.feature[e]] + bias[s.feature[e]];
  return {y, mean, rstd};
}

void add_batch_pair(std::vector<OpTestCase>& cases, const Batch& b, GradcheckFn grad, std::vector<DType> dtypes) {
  cases.push_back({.op = OpKind::BatchNorm,
                   .name = std::string("batch_norm_") + b.name,
                   .dtypes = dtypes,
                   .make = [b](Device, DType t) { return batch_call(b, t); },
                   .grad = std::move(grad),
                   .grad_inputs = {0, 1, 2},
                   .reference = [b](const OpCall& c) { return batch_norm_reference(b, c); }});
  cases.push_back({.op = OpKind::BatchNormBackward,
                   .name = std::string("batch_norm_backward_") + b.name,
                   .dtypes = dtypes,
                   .make =
                       [b](Device, DType t) {
                         return backward_call(OpKind::BatchNorm, batch_call(b, t), t, Attrs().set("training", b.training));
                       },
                   .reference =
                       [b](const OpCall& c) {
                         return normalise_backward(channel_sets(c.inputs[1].shape(), b.x[1], false), c, !b.training);
                       }});
  cases.push_back(accumulating(cases.back()));
}

void add_batch_norm_cases(std::vector<OpTestCase>& cases) {
  using L = Layout;
  for (const Batch& b : {Batch{"train_running_stats_5x3", {5, 3}, L::contiguous, true, true, true, false, true},
                         Batch{"train_transposed_no_affine_2x3x2x2", {2, 3, 2, 2}, L::transposed, true, false, false, false, true},
                         Batch{"eval_2x3x4", {2, 3, 4}, L::contiguous, false, true, true, false, true},
                         Batch{"eval_strided_no_affine_4x3", {4, 3}, L::strided, false, false, true, false, false},
                         Batch{"train_channels_last_2x4x3x3", {2, 4, 3, 3}, L::channels_last, true, true, true, false, false},
                         // Several 32-channel tiles (the last partial) and pixel chunks on the GPU.
                         Batch{"train_channels_last_4x33x16x17", {4, 33, 16, 17}, L::channels_last, true, true, true, false, false},
                         // 20 chunks per channel tile: more than a block's 8 thread rows, which the last block
                         // deals the chunks to when it combines them.
                         Batch{"train_channels_last_8x36x16x20", {8, 36, 16, 20}, L::channels_last, true, true, true, false, false},
                         Batch{"eval_channels_last_2x40x9x11", {2, 40, 9, 11}, L::channels_last, false, true, true, false, false},
                         // Planes of more chunks than the apply kernel combines (f32 tiles of 128 pixels: 72, 144
                         // and 306 chunks): the statistics kernel's last block does.
                         Batch{"train_channels_last_4x8x48x48", {4, 8, 48, 48}, L::channels_last, true, true, true, false, false},
                         Batch{"train_channels_last_8x4x48x48", {8, 4, 48, 48}, L::channels_last, true, true, true, false, false},
                         Batch{"train_channels_last_17x3x48x48", {17, 3, 48, 48}, L::channels_last, true, true, true, false, false}}) {
    GradcheckFn grad;
    // Fresh running statistics on every evaluation: gradcheck runs the function many times.
    if (b.gradcheck)
      grad = [b](const Inputs& x) {
        Tensor rm = x[3].defined() ? clone(x[3]) : Tensor(), rv = x[4].defined() ? clone(x[4]) : Tensor();
        return batch_norm(x[0], rm, rv, x[1], x[2], b.training, kMomentum, kEps);
      };
    add_batch_pair(cases, b, grad, kFloatTypes);
  }
  add_batch_pair(cases, Batch{"train_f32_running_stats_4x3x2", {4, 3, 2}, L::contiguous, true, true, true, true, false}, {},
                 {DType::f16, DType::bf16});
}

// ---- group and batch norm reading a 16-bit x as f32 ----

// x (the case's dtype, bf16 or f16) read as f32; w, b, running statistics and g are f32.
struct Widened {
  const char* name;
  Shape x;
  Layout layout;
  bool batch;      // batch norm; else group norm with `groups`
  bool training;   // batch norm
  bool affine, running;
  int64_t groups = 1;
};

// The forward's attrs: a 16-bit x read as f32.
Attrs widened_attrs(const Widened& v) {
  Attrs a = Attrs().set("eps", kEps).set("dtype", DType::f32);
  return v.batch ? a.set("training", v.training).set("momentum", kMomentum) : a.set("groups", v.groups);
}
// The backward's.
Attrs widened_backward_attrs(const Widened& v) {
  Attrs a = Attrs().set("dtype", DType::f32);
  return v.batch ? a.set("training", v.training) : a.set("groups", v.groups);
}

// x, w, b[, running_mean, running_var] and attrs of the forward.
OpCall widened_call(const Widened& v, DType t) {
  const int64_t C = v.x[1];
  Tensor w = v.affine ? randn_input({C}, DType::f32, 141, Layout::contiguous, 0.5, 1.0) : Tensor();
  Tensor b = v.affine ? randn_input({C}, DType::f32, 142, Layout::contiguous, 0.5) : Tensor();
  Tensor x = randn_input(v.x, t, 140, v.layout, 1.0, 0.5);
  if (!v.batch) return OpCall{{x, w, b}, widened_attrs(v)};
  Tensor rm = v.running ? randn_input({C}, DType::f32, 143, Layout::contiguous, 0.5) : Tensor();
  Tensor rv = v.running ? uniform_input({C}, DType::f32, 144, 0.5, 1.5) : Tensor();
  return OpCall{{x, w, b, rm, rv}, widened_attrs(v)};
}

// The backward's (g, x, w, mean, rstd), with the statistics of the forward on the CPU.
OpCall widened_backward_call(const Widened& v, DType t) {
  OpCall f = widened_call(v, t);
  std::vector<Tensor> saved = dispatch(v.batch ? OpKind::BatchNorm : OpKind::GroupNorm, f.inputs, f.attrs);
  return OpCall{{randn_input(v.x, DType::f32, 145, Layout::transposed), f.inputs[0], f.inputs[1], saved[1], saved[2]},
                widened_backward_attrs(v)};
}

// The op on the call with input `x_at` cast to f32 first (running statistics updated on copies).
Expected cast_then_f32(OpKind op, const OpCall& c, size_t x_at) {
  std::vector<Tensor> in = c.inputs;
  in[x_at] = dispatch(OpKind::Copy, {in[x_at]}, Attrs().set("dtype", DType::f32))[0];
  for (size_t i = 3; op == OpKind::BatchNorm && i < 5; ++i)
    if (in[i].defined()) in[i] = clone(in[i]);
  Expected e;
  for (const Tensor& t : dispatch(op, in, c.attrs)) e.push_back(host_values(t));
  return e;
}

// Host values as a contiguous f32 tensor of `shape`.
Tensor f32_tensor(const std::vector<double>& v, const Shape& shape) {
  std::vector<float> f(v.begin(), v.end());
  return Tensor::from_vector(f, shape);
}

// Host values rounded to dtype t, as the copy kernel rounds them.
std::vector<double> rounded(const std::vector<double>& v, DType t) {
  const Tensor f = f32_tensor(v, {int64_t(v.size())});
  return host_values(dispatch(OpKind::Copy, {f}, Attrs().set("dtype", t))[0]);
}

// The outputs, with a channels-last 4-D output where `channels_last` says so (as the compiled step
// hands over a convolution's operand).
std::vector<Tensor> given_outputs(OpKind op, const OpCall& c, const std::vector<bool>& channels_last) {
  std::vector<Tensor> out;
  const std::vector<TensorMeta> m = infer_outputs(op, c.inputs, c.attrs);
  for (size_t i = 0; i < m.size(); ++i)
    out.push_back(Tensor::empty(
        m[i].shape, m[i].dtype, Device::cpu(),
        i < channels_last.size() && channels_last[i] ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous));
  return out;
}

// The fused relu of a group or batch norm (attr relu, what compile/passes/fuse_norm_relu.cpp writes):
// forward with y's 16-bit copy (attr cast_dtype), backward from a gradient of x's 16-bit dtype and the
// relu's output y. References: the ops the compiler replaced (relu and the cast after the f32 op;
// relu_backward of the widened gradient before it), in plain loops where they are elementwise. With a
// channels-last x the 16-bit copy and dx are given channels-last: the GPU's kernels write them there.
void add_relu_cases(std::vector<OpTestCase>& cases, const Widened& v) {
  const OpKind op = v.batch ? OpKind::BatchNorm : OpKind::GroupNorm;
  const OpKind backward = v.batch ? OpKind::BatchNormBackward : OpKind::GroupNormBackward;
  const bool cl = v.layout == Layout::channels_last;
  cases.push_back({.op = op,
                   .name = std::string(op_name(op)) + "_relu_16bit_copy_" + v.name,
                   .dtypes = {DType::bf16, DType::f16},
                   .make =
                       [v, op, cl](Device, DType t) {
                         OpCall c = widened_call(v, t);
                         c.attrs.set("relu", true).set("cast_dtype", t);
                         c.outputs = given_outputs(op, c, {false, false, false, cl});
                         return c;
                       },
                   .reference =
                       [v, op](const OpCall& c) {
                         Expected e = cast_then_f32(op, OpCall{c.inputs, widened_attrs(v)}, 0);
                         for (double& y : e[0]) y = y > 0 || y != y ? y : 0;
                         e.push_back(rounded(e[0], c.attrs.dtype("cast_dtype")));
                         return e;
                       }});
  for (bool dx16 : {false, true}) {
    cases.push_back({.op = backward,
                     .name = std::string(op_name(backward)) + "_relu_16bit_g" + (dx16 ? "_and_dx_" : "_") + v.name,
                     .dtypes = {DType::bf16, DType::f16},
                     .make =
                         [v, backward, cl, dx16](Device, DType t) {
                           OpCall c = widened_backward_call(v, t);
                           c.inputs[0] = randn_input(v.x, t, 146, v.layout);  // the convolution's 16-bit gradient
                           c.inputs.push_back(dispatch(OpKind::Relu, {randn_input(v.x, DType::f32, 147)})[0]);
                           c.attrs.set("relu", true);
                           if (dx16) c.attrs.set("dx_dtype", t);
                           c.outputs = given_outputs(backward, c, {dx16 && cl});
                           return c;
                         },
                     .reference =
                         [v, backward](const OpCall& c) {
                           std::vector<double> g = host_values(c.inputs[0]);
                           const std::vector<double> y = host_values(c.inputs[5]);
                           for (size_t i = 0; i < g.size(); ++i) g[i] = y[i] > 0 ? g[i] : 0;
                           std::vector<Tensor> in(c.inputs.begin(), c.inputs.begin() + 5);
                           in[0] = f32_tensor(g, c.inputs[1].shape());
                           Expected e = cast_then_f32(backward, OpCall{in, widened_backward_attrs(v)}, 1);
                           if (c.attrs.has("dx_dtype")) e[0] = rounded(e[0], c.attrs.dtype("dx_dtype"));
                           return e;
                         }});
  }
}

void add_widened_cases(std::vector<OpTestCase>& cases) {
  using L = Layout;
  // The outputs are f32: f32's tolerance, whichever 16-bit dtype x has (the scale is f16's to f32's,
  // so bf16 runs get 6x that).
  const double f32_tol = tolerance(DType::f32) / tolerance(DType::f16);
  for (const Widened& v :
       {Widened{"train_running_stats_4x3x2x2", {4, 3, 2, 2}, L::contiguous, true, true, true, true},
        Widened{"train_channels_last_no_affine_2x4x3x3", {2, 4, 3, 3}, L::channels_last, true, true, false, false},
        // x channels-last, g transposed: the GPU's tiles read each in its own layout.
        Widened{"train_channels_last_4x33x16x17", {4, 33, 16, 17}, L::channels_last, true, true, true, true},
        Widened{"eval_strided_3x5", {3, 5}, L::strided, true, false, true, true},
        Widened{"channels_last_2x4x3x3_groups_2", {2, 4, 3, 3}, L::channels_last, false, true, true, false, 2},
        Widened{"no_affine_3x6x5_groups_3", {3, 6, 5}, L::contiguous, false, true, false, false, 3},
        // cnn-small's group norms: 16 channels of 8 x 8 positions a set.
        Widened{"channels_last_4x128x8x8_groups_8", {4, 128, 8, 8}, L::channels_last, false, true, true, false, 8}}) {
    const OpKind op = v.batch ? OpKind::BatchNorm : OpKind::GroupNorm;
    const OpKind backward = v.batch ? OpKind::BatchNormBackward : OpKind::GroupNormBackward;
    cases.push_back({.op = op,
                     .name = std::string(op_name(op)) + "_16bit_x_" + v.name,
                     .dtypes = {DType::bf16, DType::f16},
                     .make = [v](Device, DType t) { return widened_call(v, t); },
                     .tol_scale = f32_tol,
                     .reference = [op](const OpCall& c) { return cast_then_f32(op, c, 0); }});
    cases.push_back({.op = backward,
                     .name = std::string(op_name(backward)) + "_16bit_x_" + v.name,
                     .dtypes = {DType::bf16, DType::f16},
                     .make = [v](Device, DType t) { return widened_backward_call(v, t); },
                     .tol_scale = f32_tol,
                     .reference = [backward](const OpCall& c) { return cast_then_f32(backward, c, 1); }});
    // dx written in 16 bits (attr dx_dtype, the case's dtype): the f32 dx rounded once. The 16-bit dx
    // gets its dtype's tolerance (one ulp where the backends' f32 values round apart). With a
    // channels-last x, dx is also given channels-last, as the compiled step hands it over (the
    // convolution's gradient): the GPU's kernels write it where it lies.
    for (bool given_dx : {false, true}) {
      if (given_dx && v.layout != L::channels_last) continue;
      cases.push_back(
          {.op = backward,
           .name =
               std::string(op_name(backward)) + "_16bit_x_and_dx_" + (given_dx ? "into_channels_last_" : "") + v.name,
           .dtypes = {DType::bf16, DType::f16},
           .make =
               [v, given_dx, backward](Device, DType t) {
                 OpCall c = widened_backward_call(v, t);
                 c.attrs.set("dx_dtype", t);
                 if (given_dx) c.outputs = given_outputs(backward, c, {true});
                 return c;
               },
           .reference =
               [v, backward](const OpCall& c) {
                 // The f32 call (dx in f32), then dx rounded to the 16-bit dtype.
                 Expected e = cast_then_f32(backward, OpCall{c.inputs, widened_backward_attrs(v)}, 1);
                 e[0] = rounded(e[0], c.attrs.dtype("dx_dtype"));
                 return e;
               }});
    }
    add_relu_cases(cases, v);
    cases.push_back(accumulating(cases.back()));  // the relu backward with a 16-bit g and dx
  }
}

// ---- group norm before a global average pool ----
// attr pool (the forward's last output: each (n, c)'s mean of y over the positions) and attr
// grad_scale (the backward's g multiplied by it first), with the backward's g the (N, C) gradient of
// the pool broadcast over the positions: what compile/passes/fuse_norm_pool.cpp writes. Plain-loop
// references on the normalise formulas above; the 16-bit x variants (cnn-small's last norm) against
// the f32 op on the widened x as above.

// Each (n, c)'s mean of row-major (N, C, S) values v.
std::vector<double> position_means(const std::vector<double>& v, const Shape& x) {
  const int64_t N = x[0], C = x[1], S = numel_of(x) / (N * C);
  std::vector<double> p(size_t(N * C), 0.0);
  for (size_t e = 0; e < v.size(); ++e) p[e / size_t(S)] += v[e];
  for (double& m : p) m /= double(S);
  return p;
}

double one_over_positions(const Shape& x) { return 1.0 / double(numel_of(x) / (x[0] * x[1])); }

// An (N, C) tensor of dtype t broadcast over x's positions: strides (C, 1, 0, ...).
Tensor pool_gradient(const Shape& x, DType t, uint64_t seed) {
  Tensor g = randn_input({x[0], x[1]}, t, seed);
  Shape strides(x.size(), 0);
  strides[0] = x[1], strides[1] = 1;
  return Tensor::make_view(g, x, strides, 0);
}

// g's values at the norm's output: g times the scale, then (with y) relu_backward's selection.
std::vector<double> scaled_relu_grad(const OpCall& c, double scale, bool relu) {
  std::vector<double> g = host_values(c.inputs[0]);
  const std::vector<double> y = relu ? host_values(c.inputs[5]) : std::vector<double>();
  for (size_t i = 0; i < g.size(); ++i) g[i] = relu && !(y[i] > 0) ? 0.0 : g[i] * scale;
  return g;
}

struct Pooled {
  const char* name;
  Shape x;
  Layout layout;
  int64_t groups;
  bool relu;
};

void add_pool_cases(std::vector<OpTestCase>& cases) {
  using L = Layout;
  for (const Pooled& p : {Pooled{"relu_3x4x6x5_groups_2", {3, 4, 6, 5}, L::contiguous, 2, true},
                          Pooled{"channels_last_relu_4x32x8x8_groups_4", {4, 32, 8, 8}, L::channels_last, 4, true},
                          // No relu: sets of two channels (with one, a g constant over its set gives dx = dw = 0).
                          Pooled{"2x4x17_groups_2", {2, 4, 17}, L::transposed, 2, false}}) {
    const Norm n{p.name, p.x, p.layout, p.groups, true, true, false};
    cases.push_back({.op = OpKind::GroupNorm,
                     .name = std::string("group_norm_pool_") + p.name,
                     .dtypes = kFloatTypes,
                     .make =
                         [n, p](Device, DType t) {
                           OpCall c = norm_call(n, t, false);
                           c.attrs.set("relu", p.relu).set("pool", true);
                           return c;
                         },
                     .reference =
                         [p](const OpCall& c) {
                           Expected e = normalise(channel_sets(p.x, p.groups, true), c);
                           if (p.relu)
                             for (double& y : e[0]) y = y > 0 || y != y ? y : 0;
                           e.push_back(position_means(e[0], p.x));
                           return e;
                         }});
    cases.push_back({.op = OpKind::GroupNormBackward,
                     .name = std::string("group_norm_backward_pool_gradient_") + p.name,
                     .dtypes = kFloatTypes,
                     .make =
                         [n, p](Device, DType t) {
                           OpCall c = backward_call(OpKind::GroupNorm, norm_call(n, t, false), t,
                                                    Attrs().set("groups", p.groups));
                           c.inputs[0] = pool_gradient(p.x, t, 148);
                           c.attrs.set("grad_scale", one_over_positions(p.x));
                           if (p.relu) {
                             c.inputs.push_back(dispatch(OpKind::Relu, {randn_input(p.x, t, 149)})[0]);
                             c.attrs.set("relu", true);
                           }
                           return c;
                         },
                     .reference =
                         [p](const OpCall& c) {
                           const std::vector<double> g = scaled_relu_grad(c, c.attrs.f("grad_scale"), p.relu);
                           return normalise_backward(channel_sets(p.x, p.groups, true), c, false, &g);
                         }});
  }
  // cnn-small's last norm: a bf16/f16 x read as f32 (channels-last), relu, the pool, with and without
  // y's 16-bit copy; its backward from the head's 16-bit gradient.
  const Widened v{"channels_last_4x128x8x8_groups_8", {4, 128, 8, 8}, L::channels_last, false, true, true, false, 8};
  const double f32_tol = tolerance(DType::f32) / tolerance(DType::f16);
  for (bool copy : {false, true}) {
    cases.push_back({.op = OpKind::GroupNorm,
                     .name = std::string("group_norm_relu_pool_16bit_x") + (copy ? "_and_copy_" : "_") + v.name,
                     .dtypes = {DType::bf16, DType::f16},
                     .make =
                         [v, copy](Device, DType t) {
                           OpCall c = widened_call(v, t);
                           c.attrs.set("relu", true).set("pool", true);
                           if (copy) c.attrs.set("cast_dtype", t);
                           c.outputs = given_outputs(OpKind::GroupNorm, c, {false, false, false, copy});
                           return c;
                         },
                     .tol_scale = copy ? 1.0 : f32_tol,
                     .reference =
                         [v, copy](const OpCall& c) {
                           Expected e = cast_then_f32(OpKind::GroupNorm, OpCall{c.inputs, widened_attrs(v)}, 0);
                           for (double& y : e[0]) y = y > 0 || y != y ? y : 0;
                           if (copy) e.push_back(rounded(e[0], c.attrs.dtype("cast_dtype")));
                           e.push_back(position_means(e[0], v.x));
                           return e;
                         }});
  }
  cases.push_back(
      {.op = OpKind::GroupNormBackward,
       .name = std::string("group_norm_backward_relu_pool_16bit_g_and_dx_") + v.name,
       .dtypes = {DType::bf16, DType::f16},
       .make =
           [v](Device, DType t) {
             OpCall c = widened_backward_call(v, t);
             c.inputs[0] = pool_gradient(v.x, t, 150);  // the head's 16-bit input gradient
             c.inputs.push_back(dispatch(OpKind::Relu, {randn_input(v.x, DType::f32, 151)})[0]);
             c.attrs.set("relu", true).set("grad_scale", one_over_positions(v.x)).set("dx_dtype", t);
             c.outputs = given_outputs(OpKind::GroupNormBackward, c, {true});
             return c;
           },
       .reference =
           [v](const OpCall& c) {
             const std::vector<double> g = scaled_relu_grad(c, c.attrs.f("grad_scale"), true);
             std::vector<Tensor> in(c.inputs.begin(), c.inputs.begin() + 5);
             in[0] = f32_tensor(g, v.x);
             Expected e = cast_then_f32(OpKind::GroupNormBackward, OpCall{in, widened_backward_attrs(v)}, 1);
             e[0] = rounded(e[0], c.attrs.dtype("dx_dtype"));
             return e;
           }});
}

}  // namespace

std::vector<OpTestCase> norm_cases() {
  std::vector<OpTestCase> cases;
  add_layer_and_group_norm_cases(cases);
  add_batch_norm_cases(cases);
  add_widened_cases(cases);
  add_pool_cases(cases);
  return cases;
}

}  // namespace reel::harness
