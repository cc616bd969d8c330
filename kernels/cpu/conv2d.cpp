// CPU kernels of conv2d and its two backward ops: im2col + Eigen GEMM, one (image, group) per
// OpenMP thread. These are the reference. f32, f16 and bf16 calls go to oneDNN's primitives
// (conv2d_dnnl.cpp) when the path switch says so (conv2d_dnnl.h: REEL_CPU_CONV, its default, and
// set_cpu_conv_path, consulted on every call so that tests and benchmarks run both paths in one
// process); f64 always runs here.
//
// Groups G split the C input and O output channels into G equal blocks; block q of the output reads
// only block q of the input (Cg = C/G channels), through w's rows [q*Og, (q+1)*Og), Og = O/G. Each
// (image n, group q) is then one ordinary convolution of Cg channels into Og: with K = Cg*kH*kW and
// P = Ho*Wo, its columns are
//   col (K, P):  col[(c*kH + i)*kW + j, oh*Wo + ow] = x[n, q*Cg + c, oh*sh - ph + i, ow*sw - pw + j]
//                (0 outside)
// and, with w viewed as (O, K) (w is (O, Cg, kH, kW)), its block w_q (Og, K) and g[n, q] as (Og, P):
//   forward          y[n, q] (Og, P) = w_q @ col + bias_q (broadcast over P)
//   backward input   dx[n, q]        = col2im(w_q^T @ g[n, q])   col2im is im2col's adjoint: scatter-add
//   backward weight  dw_q (Og, K)    = sum_n g[n, q] @ col[n, q]^T
//   bias: db = sum of g over (N, Ho, Wo), done by autograd with sum()
// G == 1 is the plain convolution (one block, the same GEMMs as before groups existed); G == C is
// the depthwise one, a GEMM of (Og, kH*kW) by (kH*kW, P) per channel: small, but the column buffer of
// one channel stays in cache, so the im2col copy costs about what a direct loop would read anyway.
// Threading (policy in linalg.cpp): the N*G (image, group) items are split over OpenMP threads, each
// with its own column buffer (and, for the weight gradient, its own dw accumulator, summed once at
// the end); Eigen runs single-threaded inside the region. With one item (or little work) the loop
// stays serial and Eigen threads each GEMM itself when it is large enough.
// Dtypes: everything is computed in AccType (f32 for f16/bf16, f64 for f64): x is widened while it
// is unfolded (read through its own strides, never copied), w and g are widened to contiguous
// buffers, results are rounded back once. Stride and padding come as [h, w] attrs.
#include <Eigen/Dense>
#include <optional>
#include <type_traits>
#include <vector>

#include "kernels/cpu/conv2d_dnnl.h"
#include "kernels/cpu/gemm_threading.h"
#include "kernels/cpu/loops.h"
#include "kernels/dispatch.h"

namespace reel::cpu {

namespace {

template <typename A>
using RowMat = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename A>
using MatMap = Eigen::Map<RowMat<A>>;
template <typename A>
using ConstMatMap = Eigen::Map<const RowMat<A>>;

// C and O count all channels; Cg() and Og() those of one group, K() one group's column rows.
struct ConvGeom {
  int64_t N, C, H, W, O, kH, kW, Ho, Wo, sh, sw, ph, pw, G;
  int64_t Cg() const { return C / G; }
  int64_t Og() const { return O / G; }
  int64_t K() const { return Cg() * kH * kW; }
  int64_t P() const { return Ho * Wo; }
  int64_t items() const { return N * G; }  // (image, group) pairs: item t is image t / G, group t % G
  double item_flops() const { return 2.0 * double(Og()) * double(K()) * double(P()); }  // one item's GEMM
};

ConvGeom make_geom(const Shape& x, const Shape& w, const Shape& y, const Attrs& attrs) {
  const auto& s = attrs.ints("stride");
  const auto& p = attrs.ints("padding");
  return {x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], s[0], s[1], p[0], p[1], attrs.i("groups", 1)};
}

// How the items are run: split over threads (`split`), or one after another with Eigen threading
// each GEMM only when it is large (`serial_scope` narrows Eigen's threads for small ones).
struct ImageThreading {
  explicit ImageThreading(const ConvGeom& g) : split(split_gemm_batch(g.items(), g.item_flops())) {
    if (!split) serial_scope.emplace(g.item_flops());
  }
  bool split;
  std::optional<GemmThreadScope> serial_scope;
};

// `t` as a contiguous tensor of dtype `dt` (itself when it already is one).
Tensor contiguous_as(const Tensor& t, DType dt) {
  if (t.dtype() == dt && t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), dt, t.device());
  copy_strided(c, t);
  return c;
}

// The output columns ow in [lo, hi) whose input column ow*sw - pw + j lies inside [0, W).
void valid_range(int64_t j, int64_t stride, int64_t pad, int64_t size, int64_t n_out, int64_t& lo, int64_t& hi) {
  // ow*stride >= pad - j  and  ow*stride <= size - 1 + pad - j
  int64_t first = pad - j;
  lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  int64_t last = size - 1 + pad - j;
  hi = last < 0 ? 0 : std::min<int64_t>(n_out, last / stride + 1);
  if (hi < lo) hi = lo;
}

// col (K, P) <- one group's channels x (Cg, H, W) read through strides xs = {sC, sH, sW}, widened to A.
template <typename T, typename A>
void im2col(const T* x, const int64_t* xs, const ConvGeom& g, A* col) {
  for (int64_t c = 0; c < g.Cg(); ++c)
    for (int64_t i = 0; i < g.kH; ++i)
      for (int64_t j = 0; j < g.kW; ++j) {
        A* row = col + ((c * g.kH + i) * g.kW + j) * g.P();
        int64_t lo, hi;
        valid_range(j, g.sw, g.pw, g.W, g.Wo, lo, hi);
        for (int64_t oh = 0; oh < g.Ho; ++oh) {
          A* r = row + oh * g.Wo;
          int64_t ih = oh * g.sh - g.ph + i;
          if (ih < 0 || ih >= g.H) {
            std::fill(r, r + g.Wo, A(0));
            continue;
          }
          const T* src = x + c * xs[0] + ih * xs[1];
          std::fill(r, r + lo, A(0));
          if (g.sw == 1 && xs[2] == 1) {  // the common case: a unit-stride run the compiler vectorises
            const T* run = src + (lo - g.pw + j);
            for (int64_t k = 0; k < hi - lo; ++k) r[lo + k] = load(run[k]);
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) r[ow] = load(src[(ow * g.sw - g.pw + j) * xs[2]]);
          }
          std::fill(r + hi, r + g.Wo, A(0));
        }
      }
}

// dx (Cg, H, W) contiguous += col2im(col): the adjoint of im2col, into one group's channels.
template <typename A>
void col2im_add(const A* col, const ConvGeom& g, A* dx) {
  for (int64_t c = 0; c < g.Cg(); ++c)
    for (int64_t i = 0; i < g.kH; ++i)
      for (int64_t j = 0; j < g.kW; ++j) {
        const A* row = col + ((c * g.kH + i) * g.kW + j) * g.P();
        int64_t lo, hi;
        valid_range(j, g.sw, g.pw, g.W, g.Wo, lo, hi);
        for (int64_t oh = 0; oh < g.Ho; ++oh) {
          int64_t ih = oh * g.sh - g.ph + i;
          if (ih < 0 || ih >= g.H) continue;
          A* dst = dx + (c * g.H + ih) * g.W;
          const A* src = row + oh * g.Wo;
          if (g.sw == 1) {
            A* run = dst + (lo - g.pw + j);
            for (int64_t k = 0; k < hi - lo; ++k) run[k] += src[lo + k];
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) dst[ow * g.sw - g.pw + j] += src[ow];
          }
        }
      }
}

// y (N, O, Ho, Wo) = conv2d(x, w) + bias, group by group.
template <typename T>
void conv2d_fwd_im2col_kernel(const KernelCall& c) {
  using A = AccType<T>;
  const DType acc = DTypeOf<A>::value;
  const Tensor& x = c.in[0];
  const Tensor& y = c.out[0];
  const ConvGeom g = make_geom(x.shape(), c.in[1].shape(), y.shape(), c.attrs);
  Tensor w = contiguous_as(c.in[1], acc);  // (O, K): group q's rows are [q*Og, (q+1)*Og)
  Tensor bias = c.in[2].defined() ? contiguous_as(c.in[2], acc) : Tensor();
  const int64_t xs[3] = {x.strides()[1], x.strides()[2], x.strides()[3]};
  const int64_t Og = g.Og(), block = Og * g.P();  // one group's output block (Og, P), contiguous in y[n]

  const ImageThreading threading(g);
#pragma omp parallel if (threading.split)
  {
    std::vector<A> col(size_t(g.K() * g.P()));
    std::vector<A> ybuf(std::is_same_v<T, A> ? 0 : size_t(block));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < g.items(); ++t) {
      const int64_t n = t / g.G, q = t % g.G;
      im2col(x.data<T>() + n * x.strides()[0] + q * g.Cg() * xs[0], xs, g, col.data());
      A* yq = nullptr;  // y[n, q]: (Og, P)
      if constexpr (std::is_same_v<T, A>) yq = y.data<T>() + t * block;
      else yq = ybuf.data();
      MatMap<A> ym(yq, Og, g.P());
      ym.noalias() =
          ConstMatMap<A>(w.data<A>() + q * Og * g.K(), Og, g.K()) * ConstMatMap<A>(col.data(), g.K(), g.P());
      if (bias.defined())
        ym.colwise() += Eigen::Map<const Eigen::Matrix<A, Eigen::Dynamic, 1>>(bias.data<A>() + q * Og, Og);
      if constexpr (!std::is_same_v<T, A>) {
        T* dst = y.data<T>() + t * block;
        for (int64_t k = 0; k < block; ++k) dst[k] = store<T>(yq[k]);
      }
    }
  }
}

// dx (N, C, H, W) from g (N, O, Ho, Wo) and w (O, C/G, kH, kW), group by group.
template <typename T>
void conv2d_bwd_input_im2col_kernel(const KernelCall& c) {
  using A = AccType<T>;
  const DType acc = DTypeOf<A>::value;
  const Tensor& dx = c.out[0];
  const ConvGeom g = make_geom(dx.shape(), c.in[1].shape(), c.in[0].shape(), c.attrs);
  Tensor gr = contiguous_as(c.in[0], acc);  // (N, O, P): g[n, q] is the (Og, P) block at item t
  Tensor w = contiguous_as(c.in[1], acc);   // (O, K)
  const int64_t Og = g.Og(), block = g.Cg() * g.H * g.W;  // one group's channels of dx[n], contiguous

  const ImageThreading threading(g);
#pragma omp parallel if (threading.split)
  {
    std::vector<A> col(size_t(g.K() * g.P()));
    std::vector<A> dxbuf(std::is_same_v<T, A> ? 0 : size_t(block));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < g.items(); ++t) {
      const int64_t q = t % g.G;
      MatMap<A> cm(col.data(), g.K(), g.P());
      cm.noalias() = ConstMatMap<A>(w.data<A>() + q * Og * g.K(), Og, g.K()).transpose() *
                     ConstMatMap<A>(gr.data<A>() + t * Og * g.P(), Og, g.P());
      A* dxq = nullptr;
      if constexpr (std::is_same_v<T, A>) dxq = dx.data<T>() + t * block;
      else dxq = dxbuf.data();
      std::fill(dxq, dxq + block, A(0));
      col2im_add(col.data(), g, dxq);
      if constexpr (!std::is_same_v<T, A>) {
        T* dst = dx.data<T>() + t * block;
        for (int64_t k = 0; k < block; ++k) dst[k] = store<T>(dxq[k]);
      }
    }
  }
}

// dw (O, C/G, kH, kW) from g (N, O, Ho, Wo) and x (N, C, H, W), group by group.
template <typename T>
void conv2d_bwd_weight_im2col_kernel(const KernelCall& c) {
  using A = AccType<T>;
  const DType acc = DTypeOf<A>::value;
  const Tensor& x = c.in[1];
  const Tensor& dw = c.out[0];
  const ConvGeom g = make_geom(x.shape(), dw.shape(), c.in[0].shape(), c.attrs);
  Tensor gr = contiguous_as(c.in[0], acc);  // (N, O, P)
  const int64_t xs[3] = {x.strides()[1], x.strides()[2], x.strides()[3]};
  const size_t wsize = size_t(g.O * g.K());  // dw viewed as (O, K): group q's rows [q*Og, (q+1)*Og)
  const int64_t Og = g.Og();
  std::vector<std::vector<A>> partial;  // one dw accumulator per thread

  const ImageThreading threading(g);
#pragma omp parallel if (threading.split)
  {
    int tid = 0, nthreads = 1;
#ifdef _OPENMP
    tid = omp_get_thread_num();
    nthreads = omp_get_num_threads();
#endif
#pragma omp single
    partial.resize(size_t(nthreads));
    // (the implicit barrier after `single` publishes the resize)
    partial[tid].assign(wsize, A(0));
    std::vector<A> col(size_t(g.K() * g.P()));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < g.items(); ++t) {
      const int64_t n = t / g.G, q = t % g.G;
      im2col(x.data<T>() + n * x.strides()[0] + q * g.Cg() * xs[0], xs, g, col.data());
      MatMap<A> dwm(partial[tid].data() + q * Og * g.K(), Og, g.K());
      dwm.noalias() += ConstMatMap<A>(gr.data<A>() + t * Og * g.P(), Og, g.P()) *
                       ConstMatMap<A>(col.data(), g.K(), g.P()).transpose();
    }
  }
  T* out = dw.data<T>();
  for (size_t k = 0; k < wsize; ++k) {
    A s = A(0);
    for (const auto& p : partial) s += p[k];
    out[k] = store<T>(s);
  }
}

// i64 is refused by the schemas, so only the float instantiations exist. oneDNN first, where the
// switch sends the call there and it has an implementation of the geometry.
void conv2d_fwd_kernel(const KernelCall& c) {
  if (conv2d_uses_dnnl(c.out[0].dtype()) && conv2d_fwd_dnnl_kernel(c)) return;
  visit_float_dtype(c.out[0].dtype(), "conv2d", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, int64_t>) conv2d_fwd_im2col_kernel<T>(c);
  });
}

void conv2d_bwd_input_kernel(const KernelCall& c) {
  if (conv2d_uses_dnnl(c.out[0].dtype()) && conv2d_bwd_input_dnnl_kernel(c)) return;
  visit_float_dtype(c.out[0].dtype(), "conv2d_backward_input", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, int64_t>) conv2d_bwd_input_im2col_kernel<T>(c);
  });
}

void conv2d_bwd_weight_kernel(const KernelCall& c) {
  if (conv2d_uses_dnnl(c.out[0].dtype()) && conv2d_bwd_weight_dnnl_kernel(c)) return;
  visit_float_dtype(c.out[0].dtype(), "conv2d_backward_weight", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, int64_t>) conv2d_bwd_weight_im2col_kernel<T>(c);
  });
}

}  // namespace

void register_conv2d_cpu_kernels() {
  register_kernel(DeviceType::CPU, OpKind::Conv2d,
                  [](const KernelCall& c) { run_into_contiguous(c, conv2d_fwd_kernel); });
  register_kernel(DeviceType::CPU, OpKind::Conv2dBackwardInput,
                  [](const KernelCall& c) { run_into_contiguous(c, conv2d_bwd_input_kernel); });
  register_kernel(DeviceType::CPU, OpKind::Conv2dBackwardWeight,
                  [](const KernelCall& c) { run_into_contiguous(c, conv2d_bwd_weight_kernel); });
}

}  // namespace reel::cpu
