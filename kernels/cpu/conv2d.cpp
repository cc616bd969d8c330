// CPU kernels of conv2d and its two backward ops: im2col + Eigen GEMM, one image per OpenMP thread.
//
// With K = C*kH*kW and P = Ho*Wo, image n's columns are
//   col (K, P):  col[(c*kH + i)*kW + j, oh*Wo + ow] = x[n, c, oh*sh - ph + i, ow*sw - pw + j]  (0 outside)
// and, with w viewed as (O, K) and g[n] as (O, P):
//   forward          y[n] (O, P)  = w @ col + bias (broadcast over P)
//   backward input   dx[n]        = col2im(w^T @ g[n])        col2im is im2col's adjoint: scatter-add
//   backward weight  dw (O, K)    = sum_n g[n] @ col[n]^T     bias: db = sum of g over (N, Ho, Wo),
//                                                             done by autograd with sum()
// Threading (policy in linalg.cpp): images are split over OpenMP threads, each with its own column
// buffer (and, for the weight gradient, its own dw accumulator, summed once at the end); Eigen runs
// single-threaded inside the region. With one image (or little work) the loop stays serial and
// Eigen threads each GEMM itself when it is large enough.
// Dtypes: everything is computed in AccType (f32 for f16/bf16, f64 for f64): x is widened while it
// is unfolded (read through its own strides, never copied), w and g are widened to contiguous
// buffers, results are rounded back once. Stride and padding come as [h, w] attrs.
#include <Eigen/Dense>
#include <optional>
#include <type_traits>
#include <vector>

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

struct ConvGeom {
  int64_t N, C, H, W, O, kH, kW, Ho, Wo, sh, sw, ph, pw;
  int64_t K() const { return C * kH * kW; }
  int64_t P() const { return Ho * Wo; }
  double image_flops() const { return 2.0 * double(O) * double(K()) * double(P()); }  // one image's GEMM
};

ConvGeom make_geom(const Shape& x, const Shape& w, const Shape& y, const Attrs& attrs) {
  const auto& s = attrs.ints("stride");
  const auto& p = attrs.ints("padding");
  return {x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], s[0], s[1], p[0], p[1]};
}

// How the images are run: split over threads (`split`), or one after another with Eigen threading
// each GEMM only when it is large (`serial_scope` narrows Eigen's threads for small ones).
struct ImageThreading {
  explicit ImageThreading(const ConvGeom& g) : split(split_gemm_batch(g.N, g.image_flops())) {
    if (!split) serial_scope.emplace(g.image_flops());
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

// col (K, P) <- image x (C, H, W) read through strides xs = {sC, sH, sW}, widened to A.
template <typename T, typename A>
void im2col(const T* x, const int64_t* xs, const ConvGeom& g, A* col) {
  for (int64_t c = 0; c < g.C; ++c)
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

// dx (C, H, W) contiguous += col2im(col): the adjoint of im2col.
template <typename A>
void col2im_add(const A* col, const ConvGeom& g, A* dx) {
  for (int64_t c = 0; c < g.C; ++c)
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

// y (N, O, Ho, Wo) = conv2d(x, w) + bias.
template <typename T>
void conv2d_fwd_im2col_kernel(const KernelCall& c) {
  using A = AccType<T>;
  const DType acc = DTypeOf<A>::value;
  const Tensor& x = c.in[0];
  const Tensor& y = c.out[0];
  const ConvGeom g = make_geom(x.shape(), c.in[1].shape(), y.shape(), c.attrs);
  Tensor w = contiguous_as(c.in[1], acc);  // (O, K)
  Tensor bias = c.in[2].defined() ? contiguous_as(c.in[2], acc) : Tensor();
  const int64_t xs[3] = {x.strides()[1], x.strides()[2], x.strides()[3]};
  ConstMatMap<A> wm(w.data<A>(), g.O, g.K());

  const ImageThreading threading(g);
#pragma omp parallel if (threading.split)
  {
    std::vector<A> col(size_t(g.K() * g.P()));
    std::vector<A> ybuf(std::is_same_v<T, A> ? 0 : size_t(g.O * g.P()));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.N; ++n) {
      im2col(x.data<T>() + n * x.strides()[0], xs, g, col.data());
      A* yn = nullptr;
      if constexpr (std::is_same_v<T, A>) yn = y.data<T>() + n * g.O * g.P();
      else yn = ybuf.data();
      MatMap<A> ym(yn, g.O, g.P());
      ym.noalias() = wm * ConstMatMap<A>(col.data(), g.K(), g.P());
      if (bias.defined()) ym.colwise() += Eigen::Map<const Eigen::Matrix<A, Eigen::Dynamic, 1>>(bias.data<A>(), g.O);
      if constexpr (!std::is_same_v<T, A>) {
        T* dst = y.data<T>() + n * g.O * g.P();
        for (int64_t k = 0; k < g.O * g.P(); ++k) dst[k] = store<T>(yn[k]);
      }
    }
  }
}

// dx (N, C, H, W) from g (N, O, Ho, Wo) and w (O, C, kH, kW).
template <typename T>
void conv2d_bwd_input_im2col_kernel(const KernelCall& c) {
  using A = AccType<T>;
  const DType acc = DTypeOf<A>::value;
  const Tensor& dx = c.out[0];
  const ConvGeom g = make_geom(dx.shape(), c.in[1].shape(), c.in[0].shape(), c.attrs);
  Tensor gr = contiguous_as(c.in[0], acc);  // (N, O, P)
  Tensor w = contiguous_as(c.in[1], acc);   // (O, K)
  ConstMatMap<A> wm(w.data<A>(), g.O, g.K());
  const int64_t image = g.C * g.H * g.W;

  const ImageThreading threading(g);
#pragma omp parallel if (threading.split)
  {
    std::vector<A> col(size_t(g.K() * g.P()));
    std::vector<A> dxbuf(std::is_same_v<T, A> ? 0 : size_t(image));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.N; ++n) {
      MatMap<A> cm(col.data(), g.K(), g.P());
      cm.noalias() = wm.transpose() * ConstMatMap<A>(gr.data<A>() + n * g.O * g.P(), g.O, g.P());
      A* dxn = nullptr;
      if constexpr (std::is_same_v<T, A>) dxn = dx.data<T>() + n * image;
      else dxn = dxbuf.data();
      std::fill(dxn, dxn + image, A(0));
      col2im_add(col.data(), g, dxn);
      if constexpr (!std::is_same_v<T, A>) {
        T* dst = dx.data<T>() + n * image;
        for (int64_t k = 0; k < image; ++k) dst[k] = store<T>(dxn[k]);
      }
    }
  }
}

// dw (O, C, kH, kW) from g (N, O, Ho, Wo) and x (N, C, H, W).
template <typename T>
void conv2d_bwd_weight_im2col_kernel(const KernelCall& c) {
  using A = AccType<T>;
  const DType acc = DTypeOf<A>::value;
  const Tensor& x = c.in[1];
  const Tensor& dw = c.out[0];
  const ConvGeom g = make_geom(x.shape(), dw.shape(), c.in[0].shape(), c.attrs);
  Tensor gr = contiguous_as(c.in[0], acc);  // (N, O, P)
  const int64_t xs[3] = {x.strides()[1], x.strides()[2], x.strides()[3]};
  const size_t wsize = size_t(g.O * g.K());
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
    MatMap<A> dwm(partial[tid].data(), g.O, g.K());
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.N; ++n) {
      im2col(x.data<T>() + n * x.strides()[0], xs, g, col.data());
      dwm.noalias() += ConstMatMap<A>(gr.data<A>() + n * g.O * g.P(), g.O, g.P()) *
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

// i64 is refused by the schemas, so only the float instantiations exist.
void conv2d_fwd_kernel(const KernelCall& c) {
  visit_float_dtype(c.out[0].dtype(), "conv2d", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, int64_t>) conv2d_fwd_im2col_kernel<T>(c);
  });
}

void conv2d_bwd_input_kernel(const KernelCall& c) {
  visit_float_dtype(c.out[0].dtype(), "conv2d_backward_input", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, int64_t>) conv2d_bwd_input_im2col_kernel<T>(c);
  });
}

void conv2d_bwd_weight_kernel(const KernelCall& c) {
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
