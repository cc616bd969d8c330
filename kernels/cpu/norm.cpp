// CPU kernels of layer norm, group norm, batch norm and dropout.
//
// All three norms normalise a set of values by its own statistics and then apply a per-feature
// affine map:
//   mean = sum(x) / n      var = sum((x - mean)^2) / n  (biased, two passes: stable for large means)
//   rstd = 1 / sqrt(var + eps)     xhat = (x - mean) rstd     y = xhat w + b   (w = 1, b = 0 if absent)
// and share one backward, with gw = g w and means taken over the same set:
//   dx = rstd (gw - mean(gw) - xhat mean(gw xhat))     dw = sum(g xhat)     db = sum(g)
// (dw and db sum over everything except the feature axis). The sets are
//   layer norm: each row of x viewed as (rows, cols);         w, b indexed by column
//   group norm: each (n, group) of x viewed as (N, G, C/G, S); w, b indexed by channel
//   batch norm: each channel of x viewed as (N, C, S), over (N, S); eval mode uses running stats, and
//               then dx = g w rstd (the statistics are constants).
// Statistics accumulate in A = AccType<T> (f32 for f16/bf16, f64 for f64); mean/rstd outputs are A.
// Inputs of any strides are first made contiguous; parallel over rows, (n, group)s or channels.
// Group and batch norm also take a bf16/f16 x with f32 everything else (attr dtype = f32, which the
// compiler sets: schema/norm.cpp): x is widened to f32 through the copy kernel, exactly, and the f32
// kernel runs, so the results are the bits of x.to(f32) through the f32 op.
//
// group_norm_backward and batch_norm_backward with attr dx_dtype (bf16/f16): the f32 kernel into an f32 dx, then the
// copy kernel's rounding into the 16-bit one: the bits of the two ops it stands for.
// Their fused relu: the forward runs the relu (in place) and copy kernels after the plain one
// (norm_fwd); the backward kernels read g through relu_backward's selection (grad_at), a 16-bit g
// widened like a 16-bit x. The bits of the ops they stand for. Group norm's pool (attr pool) runs the
// mean kernel over y afterwards, and its backward's grad_scale the mul_scalar kernel over g first.
//
// dropout: element i (row-major) is kept iff philox_uniform(seed, offset, i) >= float(p) (the Philox
// convention of tensor/rng.h, shared with the CUDA kernel); mask = kept ? 1/(1-p) : 0 rounded to x's
// dtype, y = x * mask. p == 1 drops everything (mask 0, never inf). dropout_mask writes the mask alone.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "kernels/cpu/compose.h"
#include "kernels/cpu/dense_outputs.h"
#include "kernels/cpu/loops.h"
#include "kernels/dispatch.h"
#include "kernels/elementwise_math.h"
#include "kernels/philox_args.h"
#include "tensor/rng.h"

namespace reel {
namespace {

// t itself when contiguous (or undefined), else a contiguous copy.
Tensor dense(const Tensor& t) {
  if (!t.defined() || t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  cpu::copy_strided(c, t);
  return c;
}

// x as the group and batch norm kernels read it: contiguous, in the dtype of their outputs `d` (a
// 16-bit x read as f32 is widened here; the widening is exact).
Tensor dense_as(const Tensor& x, DType d) { return x.dtype() == d ? dense(x) : cpu::converted(x, d); }

template <typename T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// A 1-D tensor of any float dtype and stride (running statistics) as doubles, and back.
std::vector<double> read_1d(const Tensor& t) {
  std::vector<double> v(size_t(t.numel()));
  visit_dtype(t.dtype(), [&]<typename R>() {
    const R* p = static_cast<const R*>(t.data_ptr());
    for (size_t i = 0; i < v.size(); ++i) v[i] = double(load(p[int64_t(i) * t.strides()[0]]));
  });
  return v;
}
void write_1d(const Tensor& t, const std::vector<double>& v) {
  visit_dtype(t.dtype(), [&]<typename R>() {
    R* p = static_cast<R*>(t.data_ptr());
    for (size_t i = 0; i < v.size(); ++i) p[int64_t(i) * t.strides()[0]] = store<R>(AccType<R>(v[i]));
  });
}

template <typename A>
struct Moments {
  A mean, var;
};

// Mean and biased variance of `chunks` runs of `len` contiguous values, `stride` apart.
template <typename T, typename A = AccType<T>>
Moments<A> moments(const T* p, int64_t chunks, int64_t len, int64_t stride) {
  A sum = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const T* q = p + c * stride;
    A part = 0;
#pragma omp simd reduction(+ : part)
    for (int64_t i = 0; i < len; ++i) part += load(q[i]);
    sum += part;
  }
  A n = A(chunks * len), mean = sum / n;
  A sq = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const T* q = p + c * stride;
    A part = 0;
#pragma omp simd reduction(+ : part)
    for (int64_t i = 0; i < len; ++i) part += (load(q[i]) - mean) * (load(q[i]) - mean);
    sq += part;
  }
  return {mean, sq / n};  // n == 0 gives NaN, as PyTorch does
}

// y = x scale + shift over n contiguous values.
template <typename T, typename A>
void affine_run(const T* x, T* y, int64_t n, A scale, A shift) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = store<T>(load(x[i]) * scale + shift);
}

// Shapes of x (N, C, *) as N, C and S = prod(*).
struct NCS {
  int64_t N, C, S;
};
NCS ncs_of(const Tensor& x) {
  int64_t S = 1;
  for (int64_t d = 2; d < x.dim(); ++d) S *= x.shape()[d];
  return {x.shape()[0], x.shape()[1], S};
}

// ---------------------------------------------------------------- layer norm

void layer_norm_fwd_kernel(const KernelCall& c) {
  Tensor x = dense(c.in[0]), w = dense(c.in[1]), b = dense(c.in[2]);
  Tensor y = c.out[0], mean = c.out[1], rstd = c.out[2];
  int64_t rows = mean.numel(), cols = rows ? x.numel() / rows : 0;
  visit_float_dtype(x.dtype(), "layer_norm", [&]<typename T>() {
    using A = AccType<T>;
    const T *px = x.data<T>(), *pw = data_or_null<T>(w), *pb = data_or_null<T>(b);
    T* py = y.data<T>();
    A *pm = mean.data<A>(), *pr = rstd.data<A>();
    const A eps = A(c.attrs.f("eps"));
#pragma omp parallel for if (rows * cols >= cpu::kParallelGrain && rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
      // x: (rows, cols); one row is one set.
      const T* xr = px + r * cols;
      T* yr = py + r * cols;
      Moments<A> m = moments(xr, 1, cols, cols);
      A rs = A(1) / std::sqrt(m.var + eps);
      pm[r] = m.mean;
      pr[r] = rs;
      if (pw && pb) {  // the common case as a loop without branches, so it runs in SIMD lanes
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j) yr[j] = store<T>((load(xr[j]) - m.mean) * rs * load(pw[j]) + load(pb[j]));
        continue;
      }
      for (int64_t j = 0; j < cols; ++j) {
        A v = (load(xr[j]) - m.mean) * rs;
        if (pw) v *= load(pw[j]);
        if (pb) v += load(pb[j]);
        yr[j] = store<T>(v);
      }
    }
  });
}

// dx of one row (see the file comment); adds g xhat and g into this thread's dw, db partial sums.
// The loops run in SIMD lanes (the row sums as per-lane partial sums: a fixed order, so the same bits
// run to run); dw_part and db_part are the block's own slots, apart from every input and dx.
template <bool HasW, typename T, typename A>
void layer_norm_bwd_row(const T* g, const T* x, const T* w, A mean, A rstd, int64_t cols, T* dx, A* dw_part,
                        A* db_part) {
  A sum_gw = 0, sum_gwx = 0;
#pragma omp simd reduction(+ : sum_gw, sum_gwx)
  for (int64_t j = 0; j < cols; ++j) {
    const A gj = load(g[j]), xh = (load(x[j]) - mean) * rstd;
    A gw = gj;
    if constexpr (HasW) gw = gj * load(w[j]);
    sum_gw += gw;
    sum_gwx += gw * xh;
    dw_part[j] += gj * xh;
    db_part[j] += gj;
  }
  const A mean_gw = sum_gw / A(cols), mean_gwx = sum_gwx / A(cols);
#pragma omp simd
  for (int64_t j = 0; j < cols; ++j) {
    const A xh = (load(x[j]) - mean) * rstd;
    A gw = load(g[j]);
    if constexpr (HasW) gw = gw * load(w[j]);
    dx[j] = store<T>(rstd * (gw - mean_gw - xh * mean_gwx));
  }
}

void layer_norm_bwd_kernel(const KernelCall& c) {
  Tensor g = dense(c.in[0]), x = dense(c.in[1]), w = dense(c.in[2]), mean = dense(c.in[3]), rstd = dense(c.in[4]);
  Tensor dx = c.out[0], dw = c.out[1], db = c.out[2];
  int64_t rows = mean.numel(), cols = dw.numel();
  visit_float_dtype(x.dtype(), "layer_norm_backward", [&]<typename T>() {
    using A = AccType<T>;
    const T *pg = g.data<T>(), *px = x.data<T>(), *pw = data_or_null<T>(w);
    const A *pm = mean.data<A>(), *pr = rstd.data<A>();
    T* pdx = dx.data<T>();
    // dw and db sum over the rows. The rows go in blocks of kRowsPerBlock, each block's sums written to a
    // slot of its own and the slots added in block order after: the same order whatever the thread
    // count or the threads' timing, so the sums are the same bits run to run (threads finishing in a
    // varying order and adding into one sum would not be).
    constexpr int64_t kRowsPerBlock = 64;
    const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    std::vector<A> dw_parts(size_t(blocks * cols), A(0)), db_parts(size_t(blocks * cols), A(0));  // (blocks, cols)
#pragma omp parallel for if (rows * cols >= cpu::kParallelGrain && blocks > 1)
    for (int64_t blk = 0; blk < blocks; ++blk)
      for (int64_t r = blk * kRowsPerBlock; r < std::min(rows, (blk + 1) * kRowsPerBlock); ++r)
        (pw ? layer_norm_bwd_row<true, T, A> : layer_norm_bwd_row<false, T, A>)(
            pg + r * cols, px + r * cols, pw, pm[r], pr[r], cols, pdx + r * cols, dw_parts.data() + blk * cols,
            db_parts.data() + blk * cols);
    std::vector<A> dw_sum(size_t(cols), A(0)), db_sum(size_t(cols), A(0));
    for (int64_t blk = 0; blk < blocks; ++blk)
      for (int64_t j = 0; j < cols; ++j) {
        dw_sum[j] += dw_parts[size_t(blk * cols + j)];
        db_sum[j] += db_parts[size_t(blk * cols + j)];
      }
    T *pdw = dw.data<T>(), *pdb = db.data<T>();
    for (int64_t j = 0; j < cols; ++j) {
      pdw[j] = store<T>(dw_sum[j]);
      pdb[j] = store<T>(db_sum[j]);
    }
  });
}

// ---------------------------------------------------------------- group norm

void group_norm_fwd_kernel(const KernelCall& c) {
  Tensor x = dense_as(c.in[0], c.out[0].dtype()), w = dense(c.in[1]), b = dense(c.in[2]);
  Tensor y = c.out[0], mean = c.out[1], rstd = c.out[2];
  auto [N, C, S] = ncs_of(x);
  int64_t G = c.attrs.i("groups"), Cg = C / G, set = Cg * S;  // one set: (C/G, S) contiguous values
  visit_float_dtype(x.dtype(), "group_norm", [&]<typename T>() {
    using A = AccType<T>;
    const T *px = x.data<T>(), *pw = data_or_null<T>(w), *pb = data_or_null<T>(b);
    T* py = y.data<T>();
    A *pm = mean.data<A>(), *pr = rstd.data<A>();
    const A eps = A(c.attrs.f("eps"));
#pragma omp parallel for if (N * C * S >= cpu::kParallelGrain && N * G > 1)
    for (int64_t ng = 0; ng < N * G; ++ng) {
      // x: (N, G, C/G, S); ng indexes (n, group).
      Moments<A> m = moments(px + ng * set, 1, set, set);
      A rs = A(1) / std::sqrt(m.var + eps);
      pm[ng] = m.mean;
      pr[ng] = rs;
      for (int64_t k = 0; k < Cg; ++k) {
        int64_t ch = (ng % G) * Cg + k;
        A scale = rs * (pw ? load(pw[ch]) : A(1)), shift = (pb ? load(pb[ch]) : A(0)) - m.mean * scale;
        affine_run(px + ng * set + k * S, py + ng * set + k * S, S, scale, shift);
      }
    }
  });
}

// A parameter's gradient sum v stored to p, or (attr accumulate) added to what p holds as the add op
// adds a result of T's dtype: the bits of storing it and then adding.
template <typename T, typename A>
void put_param_grad(T* p, A v, bool accumulate) {
  const T r = store<T>(v);
  *p = accumulate ? store<T>(math::binary<OpKind::Add>(load(*p), load(r))) : r;
}

// The gradient at the norm's output: g, or with a fused relu (yr non-null) relu_backward(g, yr).
template <typename T>
AccType<T> grad_at(const T* g, const T* yr, int64_t i) {
  return yr ? math::binary<OpKind::ReluBackward>(load(g[i]), load(yr[i])) : load(g[i]);
}

// dx of one (n, group) set; writes sum_s g xhat and sum_s g of each of its channels to ds, dbias
// (both (C/G) long), from which dw and db are summed over n afterwards.
template <typename T, typename A>
void group_norm_bwd_set(const T* g, const T* yr, const T* x, const T* w, int64_t ch0, int64_t Cg, int64_t S, A mean,
                        A rstd, T* dx, A* ds, A* dbias) {
  // The loops over a channel's S values run in SIMD lanes (its sums as per-lane partials: a fixed
  // order, the same bits run to run).
  A sum_gw = 0, sum_gwx = 0;
  for (int64_t k = 0; k < Cg; ++k) {
    A s_gx = 0, s_g = 0;
#pragma omp simd reduction(+ : s_gx, s_g)
    for (int64_t s = 0; s < S; ++s) {
      A gv = grad_at(g, yr, k * S + s);
      s_gx += gv * (load(x[k * S + s]) - mean) * rstd;
      s_g += gv;
    }
    ds[k] = s_gx;
    dbias[k] = s_g;
    A wk = w ? load(w[ch0 + k]) : A(1);
    sum_gw += wk * s_g;
    sum_gwx += wk * s_gx;
  }
  A n = A(Cg * S), mean_gw = sum_gw / n, mean_gwx = sum_gwx / n;
  for (int64_t k = 0; k < Cg; ++k) {
    A wk = w ? load(w[ch0 + k]) : A(1);
#pragma omp simd
    for (int64_t s = 0; s < S; ++s) {
      int64_t i = k * S + s;
      A xh = (load(x[i]) - mean) * rstd;
      dx[i] = store<T>(rstd * (grad_at(g, yr, i) * wk - mean_gw - xh * mean_gwx));
    }
  }
}

// g (16 bits read as its widening when the outputs are f32; times attr grad_scale, by the mul_scalar
// kernel, when given) and, with a fused relu, the relu's output y (in[5]) as the group and batch norm
// backward kernels read them: contiguous, in the outputs' dtype.
Tensor grad_of(const KernelCall& c) {
  const Tensor g = dense_as(c.in[0], c.out[1].dtype());
  if (!c.attrs.has("grad_scale")) return g;
  Tensor scaled = cpu::scratch(g.shape(), g.dtype());  // g may be the caller's own tensor
  cpu::run_op(OpKind::MulScalar, {g}, {scaled}, Attrs().set("value", c.attrs.f("grad_scale")));
  return scaled;
}
Tensor relu_output_of(const KernelCall& c) { return c.attrs.b("relu", false) ? dense(c.in[5]) : Tensor(); }

void group_norm_bwd_kernel(const KernelCall& c) {
  Tensor g = grad_of(c), yr = relu_output_of(c), x = dense_as(c.in[1], c.out[0].dtype()), w = dense(c.in[2]);
  Tensor mean = dense(c.in[3]), rstd = dense(c.in[4]);
  Tensor dx = c.out[0], dw = c.out[1], db = c.out[2];
  auto [N, C, S] = ncs_of(x);
  int64_t G = c.attrs.i("groups"), Cg = C / G, set = Cg * S;
  visit_float_dtype(x.dtype(), "group_norm_backward", [&]<typename T>() {
    using A = AccType<T>;
    const T *pg = g.data<T>(), *py = data_or_null<T>(yr), *px = x.data<T>(), *pw = data_or_null<T>(w);
    const A *pm = mean.data<A>(), *pr = rstd.data<A>();
    T* pdx = dx.data<T>();
    std::vector<A> ds(size_t(N * C)), dbias(size_t(N * C));  // (N, C): per-sample channel sums
#pragma omp parallel for if (N * C * S >= cpu::kParallelGrain && N * G > 1)
    for (int64_t ng = 0; ng < N * G; ++ng) {
      int64_t ch0 = (ng % G) * Cg, at = ng * set;
      group_norm_bwd_set(pg + at, py ? py + at : nullptr, px + at, pw, ch0, Cg, S, pm[ng], pr[ng], pdx + at,
                         ds.data() + ng * Cg, dbias.data() + ng * Cg);
    }
    T *pdw = dw.data<T>(), *pdb = db.data<T>();
    const bool accumulate = c.attrs.b("accumulate", false);
    for (int64_t ch = 0; ch < C; ++ch) {
      A sw = 0, sb = 0;
      for (int64_t n = 0; n < N; ++n) {
        sw += ds[n * C + ch];
        sb += dbias[n * C + ch];
      }
      put_param_grad(pdw + ch, sw, accumulate);
      put_param_grad(pdb + ch, sb, accumulate);
    }
  });
}

// ---------------------------------------------------------------- batch norm

// Batch statistics per channel into mean/rstd, and the unbiased variance for the running update.
template <typename T, typename A>
void batch_stats(const T* x, int64_t N, int64_t C, int64_t S, A eps, A* mean, A* rstd,
                 std::vector<double>& var_unbiased) {
#pragma omp parallel for if (N * C * S >= cpu::kParallelGrain && C > 1)
  for (int64_t ch = 0; ch < C; ++ch) {
    // x: (N, C, S); channel ch is N runs of S values, C*S apart.
    Moments<A> m = moments(x + ch * S, N, S, C * S);
    mean[ch] = m.mean;
    rstd[ch] = A(1) / std::sqrt(m.var + eps);
    double n = double(N * S);
    var_unbiased[size_t(ch)] = double(m.var) * n / (n - 1);
  }
}

// running = (1 - momentum) running + momentum stat, in place, in the running tensor's own dtype.
void update_running(const Tensor& running, const std::vector<double>& stat, double momentum) {
  std::vector<double> r = read_1d(running);
  for (size_t i = 0; i < r.size(); ++i) r[i] = (1 - momentum) * r[i] + momentum * stat[i];
  write_1d(running, r);
}

void batch_norm_fwd_kernel(const KernelCall& c) {
  Tensor x = dense_as(c.in[0], c.out[0].dtype()), w = dense(c.in[1]), b = dense(c.in[2]);
  const Tensor &running_mean = c.in[3], &running_var = c.in[4];
  Tensor y = c.out[0], mean = c.out[1], rstd = c.out[2];
  auto [N, C, S] = ncs_of(x);
  bool training = c.attrs.b("training");
  double eps = c.attrs.f("eps");
  visit_float_dtype(x.dtype(), "batch_norm", [&]<typename T>() {
    using A = AccType<T>;
    const T *px = x.data<T>(), *pw = data_or_null<T>(w), *pb = data_or_null<T>(b);
    T* py = y.data<T>();
    A *pm = mean.data<A>(), *pr = rstd.data<A>();
    if (training) {
      std::vector<double> var_unbiased(static_cast<size_t>(C));
      batch_stats(px, N, C, S, A(eps), pm, pr, var_unbiased);
      if (running_mean.defined()) {
        double momentum = c.attrs.f("momentum");
        update_running(running_mean, std::vector<double>(pm, pm + C), momentum);
        update_running(running_var, var_unbiased, momentum);
      }
    } else {
      std::vector<double> rm = read_1d(running_mean), rv = read_1d(running_var);
      for (int64_t ch = 0; ch < C; ++ch) {
        pm[ch] = A(rm[ch]);
        pr[ch] = A(1.0 / std::sqrt(rv[ch] + eps));
      }
    }
#pragma omp parallel for collapse(2) if (N * C * S >= cpu::kParallelGrain)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t ch = 0; ch < C; ++ch) {
        A scale = pr[ch] * (pw ? load(pw[ch]) : A(1)), shift = (pb ? load(pb[ch]) : A(0)) - pm[ch] * scale;
        affine_run(px + (n * C + ch) * S, py + (n * C + ch) * S, S, scale, shift);
      }
  });
}

// dx, dw, db of one channel: x, g, dx point at its first value; N runs of S values, C*S apart.
template <typename T, typename A>
void batch_norm_bwd_channel(const T* g, const T* yr, const T* x, A w, A mean, A rstd, int64_t N, int64_t S,
                            int64_t stride, bool training, T* dx, A& dw, A& db) {
  // Each run's sums in SIMD lanes (per-lane partial sums: a fixed order, the same bits run to run),
  // then the runs in order.
  A sum_g = 0, sum_gx = 0;
  for (int64_t n = 0; n < N; ++n) {
    const T *gn = g + n * stride, *yn = yr ? yr + n * stride : nullptr, *xn = x + n * stride;
    A run_g = 0, run_gx = 0;
#pragma omp simd reduction(+ : run_g, run_gx)
    for (int64_t s = 0; s < S; ++s) {
      const A gv = grad_at(gn, yn, s);
      run_g += gv;
      run_gx += gv * (load(xn[s]) - mean) * rstd;
    }
    sum_g += run_g;
    sum_gx += run_gx;
  }
  dw = sum_gx;
  db = sum_g;
  // Training: the statistics depend on x (the full formula, with gw = g w, so the means carry w).
  // Eval: they are constants and dx = g w rstd.
  A count = A(N * S), mean_g = training ? sum_g / count : A(0), mean_gx = training ? sum_gx / count : A(0);
  for (int64_t n = 0; n < N; ++n) {
    const T *gn = g + n * stride, *yn = yr ? yr + n * stride : nullptr, *xn = x + n * stride;
    T* dxn = dx + n * stride;
#pragma omp simd
    for (int64_t s = 0; s < S; ++s) {
      const A xh = (load(xn[s]) - mean) * rstd;
      dxn[s] = store<T>(w * rstd * (grad_at(gn, yn, s) - mean_g - xh * mean_gx));
    }
  }
}

void batch_norm_bwd_kernel(const KernelCall& c) {
  Tensor g = grad_of(c), yr = relu_output_of(c), x = dense_as(c.in[1], c.out[0].dtype()), w = dense(c.in[2]);
  Tensor mean = dense(c.in[3]), rstd = dense(c.in[4]);
  Tensor dx = c.out[0], dw = c.out[1], db = c.out[2];
  auto [N, C, S] = ncs_of(x);
  const bool training = c.attrs.b("training"), accumulate = c.attrs.b("accumulate", false);
  visit_float_dtype(x.dtype(), "batch_norm_backward", [&]<typename T>() {
    using A = AccType<T>;
    const T *pg = g.data<T>(), *py = data_or_null<T>(yr), *px = x.data<T>(), *pw = data_or_null<T>(w);
    const A *pm = mean.data<A>(), *pr = rstd.data<A>();
    T *pdx = dx.data<T>(), *pdw = dw.data<T>(), *pdb = db.data<T>();
#pragma omp parallel for if (N * C * S >= cpu::kParallelGrain && C > 1)
    for (int64_t ch = 0; ch < C; ++ch) {
      A dwc = 0, dbc = 0, wc = pw ? load(pw[ch]) : A(1);
      batch_norm_bwd_channel(pg + ch * S, py ? py + ch * S : nullptr, px + ch * S, wc, pm[ch], pr[ch], N, S, C * S,
                             training, pdx + ch * S, dwc, dbc);
      put_param_grad(pdw + ch, dwc, accumulate);
      put_param_grad(pdb + ch, dbc, accumulate);
    }
  });
}

// A group or batch norm's backward with dx in attr dx_dtype: the f32 kernel, then the cast.
void norm_bwd_16bit_dx(const KernelCall& c, KernelFn f32_kernel) {
  const std::vector<Tensor> out{cpu::scratch(c.out[0].shape(), c.out[1].dtype()), c.out[1], c.out[2]};
  cpu::run_into_contiguous(KernelCall{c.op, c.in, out, c.attrs}, f32_kernel);
  cpu::run_op(OpKind::Copy, {out[0]}, {c.out[0]});
}

// A group or batch norm with its fused relu (attr relu), y's 16-bit copy (attr cast_dtype, out[3]) and
// group norm's pool (attr pool, the last output): the plain kernel, then the relu (in place), copy and
// mean kernels: the bits of the ops it stands for.
void norm_fwd(const KernelCall& c, KernelFn kernel) {
  const std::vector<Tensor> out{c.out[0], c.out[1], c.out[2]};
  cpu::run_into_contiguous(KernelCall{c.op, c.in, out, c.attrs}, kernel);
  if (c.attrs.b("relu", false)) cpu::run_op(OpKind::Relu, {c.out[0]}, {c.out[0]});
  if (c.attrs.has("cast_dtype")) cpu::run_op(OpKind::Copy, {c.out[0]}, {c.out[3]});
  if (c.attrs.b("pool", false)) {
    std::vector<int64_t> spatial;
    for (int64_t d = 2; d < c.out[0].dim(); ++d) spatial.push_back(d);
    cpu::run_op(OpKind::Mean, {c.out[0]}, {c.out.back()}, Attrs().set("dims", spatial).set("keepdim", false));
  }
}

// A group or batch norm's backward (the kernels read a 16-bit g and a fused relu's y themselves; with
// attr accumulate they add dw, db into the outputs, which first hold the last two inputs).
void norm_bwd(const KernelCall& c, KernelFn kernel) {
  if (c.attrs.b("accumulate", false)) prepare_accumulated_outputs(c, 1, c.in.size() - 2, 2, cpu::copy_strided);
  if (c.attrs.has("dx_dtype")) return norm_bwd_16bit_dx(c, kernel);
  cpu::run_into_contiguous(c, kernel);
}

// ---------------------------------------------------------------- dropout

// Writes the mask (and, with x, y = x * mask) of n elements.
void dropout_into(const KernelCall& c, size_t state_input, const Tensor* x, Tensor* y, Tensor& mask) {
  const double p = c.attrs.f("p");
  const PhiloxArgs rng = philox_args(c, state_input);
  const uint64_t seed = rng.key(), offset = rng.start();
  const int64_t n = mask.numel();
  visit_float_dtype(mask.dtype(), "dropout", [&]<typename T>() {
    using A = AccType<T>;
    // The kept value as stored in the mask, so that y = x * mask exactly, as backward assumes.
    const T keep = store<T>(A(dropout_kept_value(mask.dtype(), p)));
    const float threshold = float(p);
    const T* px = x ? x->data<T>() : nullptr;
    T *py = y ? y->data<T>() : nullptr, *pmask = mask.data<T>();
    // A Philox draw costs tens of operations per element, so smaller tensors already pay for the fork.
#pragma omp parallel for if (n >= cpu::kParallelGrain / 8)
    for (int64_t i = 0; i < n; ++i) {
      bool kept = philox_uniform(seed, offset, uint64_t(i)) >= threshold;
      T m = kept ? keep : store<T>(A(0));
      pmask[i] = m;
      if (px) py[i] = store<T>(load(px[i]) * load(m));
    }
  });
}

void dropout_fwd_kernel(const KernelCall& c) {
  Tensor x = dense(c.in[0]);
  Tensor y = c.out[0], mask = c.out[1];
  dropout_into(c, 1, &x, &y, mask);
}

void dropout_mask_kernel(const KernelCall& c) {
  Tensor mask = c.out[0];
  dropout_into(c, 0, nullptr, nullptr, mask);
}

// ---------------------------------------------------------------- fused layer norms (kernels/ops.def)
// The references of the compiler's fused kernels: the composition of the kernels above with the add,
// cast and column-sum kernels, so a CPU plan computes exactly what the unfused ops would.

// `v` times the fused op's dropout mask over v's shape, as dropout_mask and mul compute it.
Tensor with_fused_dropout_mask(const KernelCall& c, const Tensor& v) {
  Tensor mask = cpu::scratch(v.shape(), v.dtype()), out = cpu::scratch(v.shape(), v.dtype());
  std::vector<Tensor> state;
  if (c.attrs.b("dropout_state", false)) state.push_back(c.in.back());
  cpu::run_op(OpKind::DropoutMask, state, {mask}, dropout_mask_attrs_of(c.attrs, v));
  cpu::run_op(OpKind::Mul, {v, mask}, {out});
  return out;
}

// t as f32: a 16-bit t widened (exactly) into a new tensor, an f32 t itself.
Tensor widened(const Tensor& t) {
  if (t.dtype() == DType::f32) return t;
  Tensor w = cpu::scratch(t.shape(), DType::f32);
  cpu::run_op(OpKind::Copy, {t}, {w});
  return w;
}

// [s = x + addend [* mask]]  y = layer_norm(s, w, b)  y16 = y.to(dtype). in: x, w?, b?[, addend[, state]];
// out: y16, mean, rstd[, s]. A 16-bit addend is added as its f32 widening, one of a suffix of x's
// shape broadcast over x's leading dims.
void layer_norm_cast_kernel(const KernelCall& c) {
  Tensor x = c.in[0];
  if (c.in.size() >= 4 && c.in[3].defined()) {
    Tensor addend = has_fused_dropout(c.attrs) ? with_fused_dropout_mask(c, c.in[3]) : widened(c.in[3]);
    if (addend.shape() != x.shape())  // a suffix of x's shape: broadcast over x's leading dims
      addend = Tensor::make_view(addend, x.shape(), broadcast_strides(addend.shape(), addend.strides(), x.shape()),
                                 addend.offset());
    cpu::run_op(OpKind::Add, {c.in[0], addend}, {c.out[3]});
    x = c.out[3];
  }
  Tensor y = cpu::scratch(x.shape(), x.dtype());
  cpu::run_op(OpKind::LayerNorm, {x, c.in[1], c.in[2]}, {y, c.out[1], c.out[2]}, c.attrs);
  cpu::run_op(OpKind::Copy, {y}, {c.out[0]});
}

// out = layer_norm_backward(g, x, w, mean, rstd).dx + residual  [out16 = (out [* mask]).to(dtype)]
// [sums (=|+=) column sums of out16]. in: g, x, w?, mean, rstd, residual[, sums_in][, state];
// out: out, dw, db[, out16][, sums]. A 16-bit g (with an f32 x) is read as its f32 widening.
void layer_norm_backward_add_kernel(const KernelCall& c) {
  const Tensor& x = c.in[1];
  const bool residual = c.in[5].defined();  // without one, out is dx itself
  Tensor dx = residual ? cpu::scratch(x.shape(), x.dtype()) : c.out[0];
  const Tensor g = x.dtype() == DType::f32 ? widened(c.in[0]) : c.in[0];
  cpu::run_op(OpKind::LayerNormBackward, {g, x, c.in[2], c.in[3], c.in[4]}, {dx, c.out[1], c.out[2]});
  if (residual) cpu::run_op(OpKind::Add, {dx, c.in[5]}, {c.out[0]});
  if (!c.attrs.has("dtype")) return;
  cpu::run_op(OpKind::Copy, {has_fused_dropout(c.attrs) ? with_fused_dropout_mask(c, c.out[0]) : c.out[0]}, {c.out[3]});
  if (!c.attrs.b("column_sums", false)) return;
  const bool accumulate = c.attrs.b("accumulate", false);
  const int64_t cols = c.out[4].numel();
  const Tensor rows = Tensor::make_view(c.out[3], {c.out[3].numel() / std::max<int64_t>(cols, 1), cols},
                                        {cols, 1}, c.out[3].offset());
  std::vector<Tensor> in{rows};
  if (accumulate) in.push_back(c.in[6]);
  cpu::run_op(OpKind::ColumnSums, in, {c.out[4]}, Attrs().set("accumulate", accumulate));
}

// layer_norm_backward_add's out (and out16) with its sums left in `parts` partial rows (schema/norm.cpp):
// out, part (parts, S, cols), [out16]. The sums are made as the CUDA kernel makes them: row r goes to
// part (r / 8) % parts and lane r % 8 of it, each lane sums its rows in order (g xhat as one fused
// multiply-add), and a part's lanes are added in lane order.
void layer_norm_backward_partials_kernel(const KernelCall& c) {
  const Tensor &x_in = c.in[1], &part = c.out[1];
  const bool copy16 = c.attrs.has("dtype"), sums16 = c.attrs.b("column_sums", false);
  const int64_t parts = part.shape()[0], S = part.shape()[1], cols = part.shape()[2];
  // out and out16 by layer_norm_backward_add's kernel, dw, db and its own column sums into scratch.
  Tensor dw = cpu::scratch({cols}, DType::f32), db = cpu::scratch({cols}, DType::f32);
  std::vector<Tensor> full{c.out[0], dw, db};
  if (copy16) full.push_back(c.out[2]);
  if (sums16) full.push_back(cpu::scratch({cols}, DType::f32));
  layer_norm_backward_add_kernel(KernelCall{OpKind::LayerNormBackwardAdd, c.in, full, c.attrs});
  const Tensor g = dense(widened(c.in[0])), x = dense(x_in), mean = dense(c.in[3]), rstd = dense(c.in[4]);
  const Tensor y16 = sums16 ? dense(widened(c.out[2])) : Tensor();
  const int64_t rows = cols ? x.numel() / cols : 0;
  const float *pg = g.data<float>(), *px = x.data<float>(), *pm = mean.data<float>(), *pr = rstd.data<float>();
  const float* py = sums16 ? y16.data<float>() : nullptr;
  constexpr int64_t kLanes = 8;
  std::vector<float> lanes(size_t(parts * kLanes * S * cols), 0.0f);  // (parts, lanes, S, cols)
  for (int64_t r = 0; r < rows; ++r) {
    float* l = lanes.data() + (((r / kLanes) % parts) * kLanes + r % kLanes) * S * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const float gj = pg[r * cols + j], e = (px[r * cols + j] - pm[r]) * pr[r];
      l[j] = std::fma(gj, e, l[j]);
      l[cols + j] += gj;
      if (sums16) l[2 * cols + j] += py[r * cols + j];
    }
  }
  Tensor dense_part = dense(part);
  float* out = dense_part.data<float>();
  for (int64_t p = 0; p < parts; ++p)
    for (int64_t k = 0; k < S * cols; ++k) {
      float v = lanes[size_t((p * kLanes) * S * cols + k)];
      for (int64_t w = 1; w < kLanes; ++w) v += lanes[size_t((p * kLanes + w) * S * cols + k)];
      out[p * S * cols + k] = v;
    }
  if (dense_part.data_ptr() != part.data_ptr()) cpu::copy_strided(part, dense_part);
}

// dw, db[, sums] from layer_norm_backward_partials' part (parts, S, cols), in the CUDA finish kernel's
// order: 32 running sums (the t-th adds parts t, t + 32, ...), then those 32 in order.
void layer_norm_param_sums_kernel(const KernelCall& c) {
  const Tensor part = dense(c.in[0]);
  const int64_t parts = part.shape()[0], S = part.shape()[1], cols = part.shape()[2];
  const bool accumulate = c.attrs.b("accumulate", false);
  const float* pp = part.data<float>();
  constexpr int64_t kRunning = 32;
  for (int64_t which = 0; which < S; ++which) {
    const Tensor& o = c.out[size_t(which)];
    std::vector<float> v(static_cast<size_t>(cols));
    for (int64_t j = 0; j < cols; ++j) {
      float running[kRunning] = {};
      for (int64_t p = 0; p < parts; ++p) running[p % kRunning] += pp[(p * S + which) * cols + j];
      float sum = running[0];
      for (int64_t t = 1; t < kRunning; ++t) sum += running[t];
      v[size_t(j)] = sum;
    }
    float* po = static_cast<float*>(o.data_ptr());
    const int64_t stride = o.strides()[0];
    // Added to the sums (the output is sums_in itself) as the finish kernel adds: one f32 add.
    for (int64_t j = 0; j < cols; ++j)
      po[j * stride] = accumulate && which == 2 ? po[j * stride] + v[size_t(j)] : v[size_t(j)];
  }
}

}  // namespace

void register_norm_cpu_kernels() {
  constexpr DeviceType cpu = DeviceType::CPU;
  register_kernel(cpu, OpKind::LayerNorm, [](const KernelCall& c) { cpu::run_into_contiguous(c, layer_norm_fwd_kernel); });
  register_kernel(cpu, OpKind::LayerNormBackward, [](const KernelCall& c) { cpu::run_into_contiguous(c, layer_norm_bwd_kernel); });
  register_kernel(cpu, OpKind::GroupNorm, [](const KernelCall& c) { norm_fwd(c, group_norm_fwd_kernel); });
  register_kernel(cpu, OpKind::GroupNormBackward, [](const KernelCall& c) { norm_bwd(c, group_norm_bwd_kernel); });
  register_kernel(cpu, OpKind::BatchNorm, [](const KernelCall& c) { norm_fwd(c, batch_norm_fwd_kernel); });
  register_kernel(cpu, OpKind::BatchNormBackward, [](const KernelCall& c) { norm_bwd(c, batch_norm_bwd_kernel); });
  register_kernel(cpu, OpKind::Dropout, [](const KernelCall& c) { cpu::run_into_contiguous(c, dropout_fwd_kernel); });
  register_kernel(cpu, OpKind::DropoutMask, [](const KernelCall& c) { cpu::run_into_contiguous(c, dropout_mask_kernel); });
  register_kernel(cpu, OpKind::LayerNormCast, layer_norm_cast_kernel);
  register_kernel(cpu, OpKind::LayerNormBackwardAdd, layer_norm_backward_add_kernel);
  register_kernel(cpu, OpKind::LayerNormBackwardPartials, layer_norm_backward_partials_kernel);
  register_kernel(cpu, OpKind::LayerNormParamSums, layer_norm_param_sums_kernel);
}

}  // namespace reel
