// CPU kernels of the reductions (sum, mean, max), softmax and log-softmax with their backward ops,
// fused cross-entropy and the global norm. Schemas and formulas: kernels/schema/reduce.cpp.
//
// Reductions. Every reduction is brought to one layout over a contiguous buffer,
//   x: (outer, reduced, inner)   ->   out: (outer, inner),   out[o, i] = op over r of x[o, r, i]
// When x is contiguous and its reduced dims (ignoring size-1 dims) form one run, x is used as it is
// (reducing trailing dims gives inner = 1, leading dims outer = 1: a bias gradient's column sums).
// Otherwise the reduced dims are permuted innermost and, if that view is not already contiguous,
// copied, giving inner = 1. Rows (inner = 1) are reduced with several independent accumulators per
// block of kBlock elements, so the loop vectorises and rounding error grows with the block, not the
// row; rows run in parallel, and a single long row is split into per-thread partial results.
// Columns (inner > 1) are reduced kColumns at a time so the inner loop runs along memory.
// Everything accumulates in AccType (f64 for f64, f32 for f32/f16/bf16, i64 for i64).
//
// Softmax-like ops and cross-entropy see x as (outer, C, inner) along their dim and compute on
// Eigen arrays (vectorised exp): contiguous rows when inner = 1, else panels of C x kColumns
// (see "softmax, log-softmax and their backward ops" below). Cross-entropy sums its per-row losses
// in double; global_norm adds per-input sums of squares in double.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "kernels/cpu/compose.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/vector_math.h"
#include "kernels/reduce_layout.h"
#include "kernels/dispatch.h"

namespace reel {
namespace {

constexpr int64_t kBlock = 2048;  // elements summed before folding into the running total
constexpr int kLanes = 8;         // independent accumulators in a row reduction
constexpr int64_t kColumns = 256; // columns processed together (column reductions, softmax panels)

using cpu::max_threads;

// ---- helpers: dense inputs, dense outputs ----

// t itself when contiguous, else a contiguous copy.
Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  cpu::copy_strided(c, t);
  return c;
}

// A contiguous buffer to write an output into: the output itself, or (when dispatch_out gave a
// strided view) a temporary that commit() copies back.
struct DenseOut {
  Tensor target, buf;
  explicit DenseOut(const Tensor& out)
      : target(out), buf(out.is_contiguous() ? out : Tensor::empty(out.shape(), out.dtype(), out.device())) {}
  void commit() const {
    if (!buf.is_same(target)) cpu::copy_strided(target, buf);
  }
};

// ---- reduction operators: init, step (also combines two partial results), finish ----

template <typename A>
struct SumOp {
  static A init() { return A(0); }
  static A step(A acc, A v) { return acc + v; }
  static A finish(A acc, int64_t) { return acc; }
};

template <typename A>
struct MeanOp : SumOp<A> {
  // n == 0 gives 0/0 = NaN: the mean of nothing.
  static A finish(A acc, int64_t n) {
    if constexpr (std::is_floating_point_v<A>) return acc / A(n);
    return n ? acc / A(n) : A(0);  // unreachable: the schema refuses integer means
  }
};

template <typename A>
struct MaxOp {
  static A init() {
    if constexpr (std::is_floating_point_v<A>) return -std::numeric_limits<A>::infinity();
    return std::numeric_limits<A>::lowest();
  }
  // NaN wins, as in PyTorch: once acc is NaN neither test replaces it.
  static A step(A acc, A v) {
    if constexpr (std::is_floating_point_v<A>) return (v > acc || std::isnan(v)) ? v : acc;
    return v > acc ? v : acc;
  }
  static A finish(A acc, int64_t) { return acc; }
};

template <typename A>
struct SumSquaresOp : SumOp<A> {};  // marker: step squares the loaded value (see load_for)

template <typename Op, typename T>
AccType<T> load_for(T v) {
  AccType<T> a = load(v);
  if constexpr (std::is_same_v<Op, SumSquaresOp<AccType<T>>>) return a * a;
  return a;
}

// op over x[0 .. n) (contiguous), in blocks of kBlock with kLanes accumulators each.
template <typename Op, typename T>
AccType<T> reduce_contiguous(const T* x, int64_t n) {
  using A = AccType<T>;
  A total = Op::init();
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const T* p = x + b0;
    const int64_t m = std::min(kBlock, n - b0);
    A lane[kLanes];
    for (int j = 0; j < kLanes; ++j) lane[j] = Op::init();
    int64_t i = 0;
    for (; i + kLanes <= m; i += kLanes)
      for (int j = 0; j < kLanes; ++j) lane[j] = Op::step(lane[j], load_for<Op>(p[i + j]));
    for (; i < m; ++i) lane[0] = Op::step(lane[0], load_for<Op>(p[i]));
    A block = lane[0];
    for (int j = 1; j < kLanes; ++j) block = Op::step(block, lane[j]);
    total = Op::step(total, block);
  }
  return total;
}

// op over one long contiguous row, split into per-thread chunks combined in thread order.
template <typename Op, typename T>
AccType<T> reduce_contiguous_parallel(const T* x, int64_t n) {
  using A = AccType<T>;
  const int nt = n >= cpu::kParallelGrain ? max_threads() : 1;
  if (nt == 1) return reduce_contiguous<Op>(x, n);
  std::vector<A> part(size_t(nt), Op::init());
#pragma omp parallel num_threads(nt)
  {
    const cpu::ThreadShare share = cpu::thread_share(n);
    part[size_t(share.tid)] = reduce_contiguous<Op>(x + share.lo, share.hi - share.lo);
  }
  A total = Op::init();
  for (A p : part) total = Op::step(total, p);
  return total;
}

// acc[j] = op over rows [r0, r1) of column block x[r, 0 .. nb) (row stride `stride`), with the
// same blocking as reduce_contiguous so that long columns do not lose precision.
template <typename Op, typename T>
void reduce_columns(const T* x, int64_t r0, int64_t r1, int64_t stride, int64_t nb, AccType<T>* acc) {
  using A = AccType<T>;
  A block[kColumns];
  for (int64_t j = 0; j < nb; ++j) acc[j] = Op::init();
  for (int64_t b0 = r0; b0 < r1; b0 += kBlock) {
    for (int64_t j = 0; j < nb; ++j) block[j] = Op::init();
    for (int64_t r = b0; r < std::min(r1, b0 + kBlock); ++r) {
      const T* row = x + r * stride;
#pragma omp simd
      for (int64_t j = 0; j < nb; ++j) block[j] = Op::step(block[j], load_for<Op>(row[j]));
    }
    for (int64_t j = 0; j < nb; ++j) acc[j] = Op::step(acc[j], block[j]);
  }
}

// ---- the (outer, reduced, inner) layout ----

ReduceLayout reduce_layout(const Tensor& x, const std::vector<int64_t>& dims_attr) {
  return reel::reduce_layout(x, dims_attr, dense);
}

template <template <typename> class OpT, typename T>
void reduce_layout_into(const ReduceLayout& L, T* out) {
  using A = AccType<T>;
  using Op = OpT<A>;
  const T* x = L.src.numel() ? L.src.data<T>() : nullptr;
  const int64_t outer = L.outer, R = L.reduced, inner = L.inner;
  const int64_t work = outer * R * inner;
  if (inner == 1) {
    if (outer == 1) {
      out[0] = store<T>(Op::finish(reduce_contiguous_parallel<Op>(x, R), R));
      return;
    }
#pragma omp parallel for if (work >= cpu::kParallelGrain)
    for (int64_t o = 0; o < outer; ++o) out[o] = store<T>(Op::finish(reduce_contiguous<Op>(x + o * R, R), R));
    return;
  }
  const int64_t nblk = (inner + kColumns - 1) / kColumns, tasks = outer * nblk;
  if (tasks == 1 && work >= cpu::kParallelGrain && max_threads() > 1) {
    // One column block over many rows: split the rows, then combine the partial blocks in order.
    const int nt = max_threads();
    std::vector<A> part(size_t(nt) * kColumns, Op::init());
#pragma omp parallel num_threads(nt)
    {
      const cpu::ThreadShare share = cpu::thread_share(R);
      reduce_columns<Op>(x, share.lo, share.hi, inner, inner, part.data() + share.tid * kColumns);
    }
    for (int64_t j = 0; j < inner; ++j) {
      A acc = Op::init();
      for (int t = 0; t < nt; ++t) acc = Op::step(acc, part[size_t(t) * kColumns + j]);
      out[j] = store<T>(Op::finish(acc, R));
    }
    return;
  }
#pragma omp parallel for if (work >= cpu::kParallelGrain)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t o = task / nblk, b0 = (task % nblk) * kColumns, nb = std::min(kColumns, inner - b0);
    A acc[kColumns];
    reduce_columns<Op>(x ? x + o * R * inner + b0 : x, 0, R, inner, nb, acc);
    for (int64_t j = 0; j < nb; ++j) out[o * inner + b0 + j] = store<T>(Op::finish(acc[j], R));
  }
}

template <template <typename> class OpT>
void reduce_kernel(const KernelCall& c) {
  const Tensor& x = c.in[0];
  ReduceLayout L = reduce_layout(x, c.attrs.has("dims") ? c.attrs.ints("dims") : std::vector<int64_t>{});
  DenseOut out(c.out[0]);
  visit_dtype(x.dtype(), [&]<typename T>() {
    reduce_layout_into<OpT, T>(L, out.buf.numel() ? out.buf.data<T>() : nullptr);
  });
  out.commit();
}

// ---- Eigen segments: contiguous runs of values in the accumulation type ----
// Softmax-like ops spend their time in exp; Eigen's vectorised exp is several times faster than a
// scalar std::exp loop, so their inner loops work on Eigen arrays.

template <typename A>
using Vec = Eigen::Array<A, Eigen::Dynamic, 1>;
template <typename A>
using ConstMap = Eigen::Map<const Vec<A>>;

// Per-thread scratch: widened copies of 16-bit inputs (a, b), a temporary (c) and per-column
// statistics of a panel (m, s).
template <typename A>
struct Scratch {
  Vec<A> a, b, c, m, s;
};

// x[0 .. n) as AccType: a map of x itself for f32/f64, a widened copy in buf for f16/bf16.
template <typename T>
ConstMap<AccType<T>> widen(const T* x, int64_t n, Vec<AccType<T>>& buf) {
  if constexpr (std::is_same_v<T, AccType<T>>) {
    return ConstMap<T>(x, n);
  } else {
    buf.resize(n);
    for (int64_t i = 0; i < n; ++i) buf[i] = load(x[i]);
    return ConstMap<AccType<T>>(buf.data(), n);
  }
}

// y[0 .. n) = v (an Eigen expression in AccType), rounded to T; tmp must not appear in v.
template <typename T, typename Expr>
void narrow(T* y, int64_t n, const Expr& v, Vec<AccType<T>>& tmp) {
  if constexpr (std::is_same_v<T, AccType<T>>) {
    Eigen::Map<Vec<T>>(y, n) = v;
  } else {
    tmp = v;
    for (int64_t i = 0; i < n; ++i) y[i] = store<T>(tmp[i]);
  }
}

// out = exp(d), exactly 0 where d = -inf (a masked logit): Eigen's exp only flushes to ~1e-38 there.
template <typename A, typename Expr>
void exp_into(Vec<A>& out, const Expr& d) {
  out = d.exp();
  out = (d == -std::numeric_limits<A>::infinity()).select(A(0), out);
}

// ---- softmax, log-softmax and their backward ops ----
// Along `dim`, x is (outer, C, inner). With inner == 1 each row of C is contiguous and reduced with
// Eigen's reductions; otherwise a panel of C rows x nb (<= kColumns) columns, row stride inner, is
// processed with per-column statistics so every Eigen operation runs along memory.

struct DimLayout {
  int64_t outer = 1, C = 1, inner = 1;
};

DimLayout dim_layout(const Shape& shape, int64_t dim, const char* op) {
  DimLayout L;
  if (shape.empty()) return L;  // a 0-dim tensor is one row of one element
  int64_t d = wrap_dim(dim, int64_t(shape.size()), op);
  for (int64_t i = 0; i < int64_t(shape.size()); ++i) {
    if (i < d) L.outer *= shape[i];
    else if (i == d) L.C = shape[i];
    else L.inner *= shape[i];
  }
  return L;
}

// Calls row(offset, scratch) for every row (inner == 1) or panel(offset, nb, scratch) for every
// column block, where offset is the element offset of its first element. Tasks run in parallel.
template <typename A, typename Row, typename Panel>
void for_each_tile(const DimLayout& L, Row row, Panel panel) {
  const int64_t nblk = L.inner == 1 ? 1 : (L.inner + kColumns - 1) / kColumns, tasks = L.outer * nblk;
#pragma omp parallel if (L.outer * L.C * L.inner >= cpu::kParallelGrain)
  {
    Scratch<A> s;
#pragma omp for
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t o = t / nblk, b0 = (t % nblk) * kColumns, off = o * L.C * L.inner + b0;
      if (L.inner == 1) row(off, s);
      else panel(off, std::min(kColumns, L.inner - b0), s);
    }
  }
}

// Softmax: y = exp(x - m) / sum exp(x - m).  LogSoftmax: y = (x - m) - log(sum exp(x - m)).
// Subtracting the maximum m keeps every exp <= 1 (no overflow).
template <typename T, bool Log>
void softmax_row(const T* x, T* y, int64_t C, Scratch<AccType<T>>& s) {
  using A = AccType<T>;
  auto a = widen(x, C, s.a);
  const A m = a.maxCoeff();
  if constexpr (std::is_same_v<T, float> && !Log) {
    // f32: the exp, its sum and the store in one pass (kernels/cpu/vector_math.h, AVX-512 where
    // present), then the scaling in place. A row of -inf only (m = -inf) takes the general path below,
    // which gives NaN as PyTorch does.
    if (m != -std::numeric_limits<A>::infinity()) {
      const float inv = 1.0f / cpu::exp_shifted_f32(x, m, y, C);
      for (int64_t j = 0; j < C; ++j) y[j] *= inv;
      return;
    }
  }
  if constexpr (Log) {
    const A log_sum = std::log((a - m).exp().sum());
    narrow(y, C, (a - m) - log_sum, s.c);
  } else {
    exp_into(s.c, a - m);
    narrow(y, C, s.c * (A(1) / s.c.sum()), s.b);
  }
}

template <typename T, bool Log>
void softmax_panel(const T* x, T* y, int64_t C, int64_t stride, int64_t nb, Scratch<AccType<T>>& s) {
  using A = AccType<T>;
  s.m.setConstant(nb, -std::numeric_limits<A>::infinity());
  for (int64_t c = 0; c < C; ++c) s.m = s.m.max(widen(x + c * stride, nb, s.a));
  s.s.setZero(nb);
  for (int64_t c = 0; c < C; ++c) {
    exp_into(s.c, widen(x + c * stride, nb, s.a) - s.m);
    s.s += s.c;
  }
  if constexpr (Log) {
    s.s = s.s.log();
    for (int64_t c = 0; c < C; ++c) narrow(y + c * stride, nb, (widen(x + c * stride, nb, s.a) - s.m) - s.s, s.c);
  } else {
    s.s = s.s.inverse();
    for (int64_t c = 0; c < C; ++c) {
      exp_into(s.c, widen(x + c * stride, nb, s.a) - s.m);
      narrow(y + c * stride, nb, s.c * s.s, s.b);
    }
  }
}

// Softmax: dx = y (g - sum(g y)).  LogSoftmax (y = log p): dx = g - exp(y) sum(g).
template <typename T, bool Log>
void softmax_backward_row(const T* g, const T* y, T* dx, int64_t C, Scratch<AccType<T>>& s) {
  auto gv = widen(g, C, s.a);
  auto yv = widen(y, C, s.b);
  if constexpr (Log) narrow(dx, C, gv - yv.exp() * gv.sum(), s.c);
  else narrow(dx, C, yv * (gv - (gv * yv).sum()), s.c);
}

template <typename T, bool Log>
void softmax_backward_panel(const T* g, const T* y, T* dx, int64_t C, int64_t stride, int64_t nb,
                            Scratch<AccType<T>>& s) {
  s.s.setZero(nb);
  for (int64_t c = 0; c < C; ++c) {
    auto gv = widen(g + c * stride, nb, s.a);
    if constexpr (Log) s.s += gv;
    else s.s += gv * widen(y + c * stride, nb, s.b);
  }
  for (int64_t c = 0; c < C; ++c) {
    auto gv = widen(g + c * stride, nb, s.a);
    auto yv = widen(y + c * stride, nb, s.b);
    if constexpr (Log) narrow(dx + c * stride, nb, gv - yv.exp() * s.s, s.c);
    else narrow(dx + c * stride, nb, yv * (gv - s.s), s.c);
  }
}

template <bool Log>
void softmax_kernel(const KernelCall& c) {
  const char* op = op_name(c.op);
  Tensor x = dense(c.in[0]);  // x: (outer, C, inner) along dim
  DenseOut out(c.out[0]);
  DimLayout L = dim_layout(x.shape(), c.attrs.i("dim"), op);
  if (x.numel() == 0) return;
  visit_float_dtype(x.dtype(), op, [&]<typename T>() {
    using A = AccType<T>;
    const T* px = x.data<T>();
    T* py = out.buf.data<T>();
    for_each_tile<A>(
        L, [&](int64_t off, Scratch<A>& s) { softmax_row<T, Log>(px + off, py + off, L.C, s); },
        [&](int64_t off, int64_t nb, Scratch<A>& s) {
          softmax_panel<T, Log>(px + off, py + off, L.C, L.inner, nb, s);
        });
  });
  out.commit();
}

template <bool Log>
void softmax_backward_kernel(const KernelCall& c) {
  const char* op = op_name(c.op);
  Tensor g = dense(c.in[0]), y = dense(c.in[1]);  // g, y: (outer, C, inner) along dim
  DenseOut out(c.out[0]);
  DimLayout L = dim_layout(y.shape(), c.attrs.i("dim"), op);
  if (y.numel() == 0) return;
  visit_float_dtype(y.dtype(), op, [&]<typename T>() {
    using A = AccType<T>;
    const T *pg = g.data<T>(), *py = y.data<T>();
    T* pdx = out.buf.data<T>();
    for_each_tile<A>(
        L, [&](int64_t off, Scratch<A>& s) { softmax_backward_row<T, Log>(pg + off, py + off, pdx + off, L.C, s); },
        [&](int64_t off, int64_t nb, Scratch<A>& s) {
          softmax_backward_panel<T, Log>(pg + off, py + off, pdx + off, L.C, L.inner, nb, s);
        });
  });
  out.commit();
}

// ---- cross-entropy ----

struct CrossEntropyArgs {
  Tensor logits, target;  // contiguous: logits (N, C), target (N)
  int64_t N, C, ignore_index, count;
  bool mean;
};

// Reads the attrs, makes the inputs contiguous and refuses targets outside [0, C) that are not
// ignore_index (here, not in the schema: the values are data). count = rows that are not ignored.
CrossEntropyArgs cross_entropy_args(const KernelCall& c, const Tensor& logits, const Tensor& target) {
  CrossEntropyArgs a{dense(logits), dense(target), logits.shape()[0], logits.shape()[1],
                     c.attrs.i("ignore_index", -100), 0, c.attrs.i("reduction", 0) == 0};
  const int64_t* t = a.N ? a.target.data<int64_t>() : nullptr;
  for (int64_t n = 0; n < a.N; ++n) {
    if (t[n] == a.ignore_index) continue;
    REEL_CHECK(t[n] >= 0 && t[n] < a.C, op_name(c.op), ": target ", t[n], " at position ", n,
               " is out of range for ", a.C, " classes (logits ", shape_str(logits.shape()), "; expected 0 to ",
               a.C - 1, " or ignore_index ", a.ignore_index, ")");
    ++a.count;
  }
  return a;
}

// loss = sum or mean over counted rows of lse_n - logits[n, target_n]; lse saved for the backward.
// The per-row losses are summed in order in double, so the result does not depend on threading.
void cross_entropy_kernel(const KernelCall& c) {
  CrossEntropyArgs a = cross_entropy_args(c, c.in[0], c.in[1]);
  DenseOut loss_out(c.out[0]), lse_out(c.out[1]);
  visit_float_dtype(a.logits.dtype(), "cross_entropy", [&]<typename T>() {
    using A = AccType<T>;
    std::vector<double> row_loss(size_t(a.N), 0.0);
    if (a.N > 0) {
      const T* x = a.logits.data<T>();  // x: (N, C)
      const int64_t* t = a.target.data<int64_t>();
      A* lse = lse_out.buf.data<A>();   // lse: (N)
#pragma omp parallel if (a.N * a.C >= cpu::kParallelGrain)
      {
        Vec<A> buf;
#pragma omp for
        for (int64_t n = 0; n < a.N; ++n) {
          auto row = widen(x + n * a.C, a.C, buf);
          const A m = row.maxCoeff();
          lse[n] = m + std::log((row - m).exp().sum());
          if (t[n] != a.ignore_index) row_loss[size_t(n)] = double(lse[n] - row[t[n]]);
        }
      }
    }
    double total = 0;
    for (double l : row_loss) total += l;
    // mean with every row ignored: 0 / 0 = NaN, as in PyTorch.
    loss_out.buf.data<T>()[0] = store<T>(A(a.mean ? total / double(a.count) : total));
  });
  loss_out.commit();
  lse_out.commit();
}

// dlogits[n, c] = (exp(logits[n, c] - lse_n) - [c == target_n]) * g / (count or 1); ignored rows 0.
void cross_entropy_backward_kernel(const KernelCall& c) {
  CrossEntropyArgs a = cross_entropy_args(c, c.in[1], c.in[2]);
  Tensor lse_t = dense(c.in[3]);
  DenseOut out(c.out[0]);
  if (a.N == 0) return;
  visit_float_dtype(a.logits.dtype(), "cross_entropy_backward", [&]<typename T>() {
    using A = AccType<T>;
    const A g = load(c.in[0].data<T>()[0]);  // one element: data_ptr is it, whatever the strides
    // With every row ignored the scale is g/0, but no row uses it.
    const A scale = a.mean ? g / A(a.count) : g;
    const T* x = a.logits.data<T>();  // x: (N, C)
    const int64_t* t = a.target.data<int64_t>();
    const A* lse = lse_t.data<A>();
    T* dx = out.buf.data<T>();        // dx: (N, C)
#pragma omp parallel if (a.N * a.C >= cpu::kParallelGrain)
    {
      Scratch<A> s;
#pragma omp for
      for (int64_t n = 0; n < a.N; ++n) {
        if (t[n] == a.ignore_index) {
          std::fill(dx + n * a.C, dx + (n + 1) * a.C, store<T>(A(0)));
          continue;
        }
        exp_into(s.c, widen(x + n * a.C, a.C, s.a) - lse[n]);
        s.c *= scale;
        s.c[t[n]] -= scale;
        narrow(dx + n * a.C, a.C, s.c, s.b);
      }
    }
  });
  out.commit();
}

// ---- global norm ----

// sqrt of the sum of squares of every input. Each input's sum of squares accumulates in AccType
// (blocked, threaded for large inputs); the per-input sums add up in double.
// With attr check_finite the last input is found_inf, set (c.out[1], in place) when an element of
// an x_i is inf or NaN: an input whose sum of squares is not finite is scanned again, since squares
// of finite values overflow too.
void global_norm_kernel(const KernelCall& c) {
  const bool check = c.attrs.b("check_finite", false);
  const size_t k = c.in.size() - (check ? 1 : 0);
  double total = 0;
  bool nonfinite = false;
  visit_float_dtype(c.in[0].dtype(), "global_norm", [&]<typename T>() {
    for (size_t j = 0; j < k; ++j) {
      const Tensor& t = c.in[j];
      if (t.numel() == 0) continue;
      Tensor d = dense(t);
      const T* x = d.data<T>();
      const int64_t n = d.numel();
      const AccType<T> squares = reduce_contiguous_parallel<SumSquaresOp<AccType<T>>>(x, n);
      total += double(squares);
      // A finite sum of squares has no inf or NaN among its terms; one that is not may be an overflow.
      if (!check || nonfinite || std::isfinite(squares)) continue;
      bool bad = false;
#pragma omp parallel for reduction(|| : bad) if (n >= cpu::kParallelGrain)
      for (int64_t i = 0; i < n; ++i) bad = bad || !std::isfinite(load(x[i]));
      nonfinite = bad;
    }
  });
  DenseOut out(c.out[0]);
  if (out.buf.dtype() == DType::f64) out.buf.data<double>()[0] = std::sqrt(total);
  else out.buf.data<float>()[0] = float(std::sqrt(total));
  out.commit();
  if (nonfinite) *c.out[1].data<float>() = 1.f;
}

// ---- fused (kernels/ops.def): references composed of the kernels above ----

// out (N) (=|+=) the f32 sums of x (..., N) over its rows.
void column_sums_kernel(const KernelCall& c) {
  const Tensor x = cpu::converted(c.in[0], DType::f32);
  std::vector<int64_t> rows(size_t(x.dim() - 1));
  for (size_t d = 0; d < rows.size(); ++d) rows[d] = int64_t(d);
  // An empty dims list means "all dims" to sum: a 1-D x has no rows to sum over, its sums are x.
  auto sum_rows = [&](const Tensor& into) {
    if (rows.empty()) cpu::run_op(OpKind::Copy, {x}, {into});
    else cpu::run_op(OpKind::Sum, {x}, {into}, Attrs().set("dims", rows));
  };
  if (!c.attrs.b("accumulate", false)) {
    sum_rows(c.out[0]);
    return;
  }
  Tensor sums = cpu::scratch(c.out[0].shape(), DType::f32);
  sum_rows(sums);
  cpu::run_op(OpKind::Add, {c.in[1], sums}, {c.out[0]});
}

// loss = cross_entropy(logits, target); dlogits = its backward with g, cast to the gradient's
// dtype. in: logits, target, g.
void cross_entropy_with_grad_kernel(const KernelCall& c) {
  const Tensor &logits = c.in[0], &target = c.in[1], &g = c.in[2];
  const Attrs a =
      Attrs().set("ignore_index", c.attrs.i("ignore_index", -100)).set("reduction", c.attrs.i("reduction", 0));
  Tensor lse = cpu::scratch({logits.shape()[0]}, logits.dtype() == DType::f64 ? DType::f64 : DType::f32);
  cpu::run_op(OpKind::CrossEntropy, {logits, target}, {c.out[0], lse}, a);
  const bool cast = c.out[1].dtype() != logits.dtype();
  Tensor dlogits = cast ? cpu::scratch(logits.shape(), logits.dtype()) : c.out[1];
  cpu::run_op(OpKind::CrossEntropyBackward, {g, logits, target, lse}, {dlogits}, a);
  if (cast) cpu::run_op(OpKind::Copy, {dlogits}, {c.out[1]});
}

// [xt = x.to(dtype)]; logits = xt @ w + bias in f32; loss, dlogits = cross_entropy_with_grad(logits)
// with the gradient in xt's dtype; dx = dlogits @ w^T. in: x, w, bias, target, g. The unfused ops,
// one after another.
void linear_cross_entropy_with_grad_kernel(const KernelCall& c) {
  const Tensor &w = c.in[1], &dlogits = c.out[1];
  const bool cast = c.attrs.has("dtype");
  if (cast) cpu::run_op(OpKind::Copy, {c.in[0]}, {c.out[3]});
  const Tensor& x = cast ? c.out[3] : c.in[0];
  Tensor logits = cpu::scratch({x.shape()[0], w.shape()[1]}, DType::f32);
  cpu::run_op(OpKind::GemmEpilogue, {x, w, c.in[2]}, {logits}, Attrs().set("dtype", DType::f32));
  Attrs a = Attrs().set("ignore_index", c.attrs.i("ignore_index", -100)).set("reduction", c.attrs.i("reduction", 0));
  if (dlogits.dtype() != DType::f32) a.set("dtype", dlogits.dtype());
  cpu::run_op(OpKind::CrossEntropyWithGrad, {logits, c.in[3], c.in[4]}, {c.out[0], dlogits}, a);
  const Tensor wt = Tensor::make_view(w, {w.shape()[1], w.shape()[0]}, {w.strides()[1], w.strides()[0]}, w.offset());
  cpu::run_op(OpKind::Matmul, {dlogits, wt}, {c.out[2]});
}

// The f32 result into out[0] when kept, and its 16-bit copy into the last output when asked for.
void softmax_results(const KernelCall& c, const std::function<void(const Tensor&)>& compute) {
  const bool keep = c.attrs.b("keep_f32", true);
  Tensor y = keep ? c.out[0] : cpu::scratch(c.out[0].shape(), DType::f32);
  compute(y);
  if (c.attrs.has("dtype")) cpu::run_op(OpKind::Copy, {y}, {c.out.back()});
}

// y = softmax(masked_fill(x, mask, value), -1). in: x, mask.
void masked_softmax_kernel(const KernelCall& c) {
  softmax_results(c, [&](const Tensor& y) {
    Tensor z = cpu::scratch(c.in[0].shape(), DType::f32);
    cpu::run_op(OpKind::MaskedFill, {c.in[0], c.in[1]}, {z}, Attrs().set("value", c.attrs.f("value")));
    cpu::run_op(OpKind::Softmax, {z}, {y}, Attrs().set("dim", int64_t(-1)));
  });
}

// dx = masked_fill(softmax_backward(g, y, -1), mask, 0). in: g, y, mask.
void masked_softmax_backward_kernel(const KernelCall& c) {
  softmax_results(c, [&](const Tensor& dx) {
    Tensor d = cpu::scratch(c.in[0].shape(), DType::f32);
    cpu::run_op(OpKind::SoftmaxBackward, {c.in[0], c.in[1]}, {d}, Attrs().set("dim", int64_t(-1)));
    cpu::run_op(OpKind::MaskedFill, {d, c.in[2]}, {dx}, Attrs().set("value", 0.0));
  });
}

}  // namespace

void register_reduce_cpu_kernels() {
  constexpr DeviceType cpu = DeviceType::CPU;
  register_kernel(cpu, OpKind::Sum, reduce_kernel<SumOp>);
  register_kernel(cpu, OpKind::Mean, reduce_kernel<MeanOp>);
  register_kernel(cpu, OpKind::Max, reduce_kernel<MaxOp>);
  register_kernel(cpu, OpKind::Softmax, softmax_kernel<false>);
  register_kernel(cpu, OpKind::LogSoftmax, softmax_kernel<true>);
  register_kernel(cpu, OpKind::SoftmaxBackward, softmax_backward_kernel<false>);
  register_kernel(cpu, OpKind::LogSoftmaxBackward, softmax_backward_kernel<true>);
  register_kernel(cpu, OpKind::CrossEntropy, cross_entropy_kernel);
  register_kernel(cpu, OpKind::CrossEntropyBackward, cross_entropy_backward_kernel);
  register_kernel(cpu, OpKind::CrossEntropyWithGrad, cross_entropy_with_grad_kernel);
  register_kernel(cpu, OpKind::LinearCrossEntropyWithGrad, linear_cross_entropy_with_grad_kernel);
  register_kernel(cpu, OpKind::GlobalNorm, global_norm_kernel);
  register_kernel(cpu, OpKind::ColumnSums, column_sums_kernel);
  register_kernel(cpu, OpKind::MaskedSoftmax, masked_softmax_kernel);
  register_kernel(cpu, OpKind::MaskedSoftmaxBackward, masked_softmax_backward_kernel);
}

}  // namespace reel
