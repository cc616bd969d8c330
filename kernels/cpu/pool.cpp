// CPU kernels of the pooling and embedding ops (schemas and attrs: kernels/schema/pool.cpp).
//
// Pooling windows: output (oh, ow) covers input rows h in [oh*S - P, oh*S - P + K) and columns
// likewise, clipped to the input (the schema's padding <= K/2 and floor sizes guarantee every window
// holds at least one real element).
//   max_pool2d       y = max over the window, padding acting as -inf; indices = h*W + w of the
//                    maximum. Ties: the first maximum in row-major window order wins (strict >), as
//                    in PyTorch's CPU kernel. A NaN is taken as the maximum (the first NaN wins).
//   max_pool2d bwd   dx[n, c, indices[n, c, j]] += g[n, c, j]  (a window overlap can hit one input
//                    element several times, so it is a scatter-add; one thread owns a whole plane)
//   avg_pool2d       y = (sum of the window's real elements) / K^2  (padding counts as zeros)
//   avg_pool2d bwd   dx[h, w] = sum over the windows containing (h, w) of g[oh, ow] / K^2, gathered
//                    per input element, so rows of dx can be split across threads without races
//   embedding        y[i, :] = weight[indices[i], :]
//   embedding bwd    dweight[v, :] = sum of g[i, :] over positions i with indices[i] == v: positions
//                    are bucketed by row first (a counting sort), then each row is summed by one
//                    thread in position order, so the result is race-free and deterministic.
//                    With accumulate, dweight = c + those sums (c the third input, dweight itself):
//                    each row's sums rounded to T first, then added as the add op adds, so the bits
//                    are those of the backward and then the add.
// All accumulation happens in AccType (f32 for f16/bf16, f64 for f64). Inputs may have any strides:
// pooling forward reads x through its strides; the other kernels read dense copies of g/indices.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/dispatch.h"

namespace reel {
namespace {

struct Window {
  int64_t kernel, stride, padding;
};

Window window_attrs(const Attrs& a) { return {a.i("kernel"), a.i("stride"), a.i("padding")}; }

// t itself when contiguous, else a dense copy.
Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  cpu::copy_strided(c, t);
  return c;
}

// "(1, 2)": the multi-index of flat position `flat` in `shape`, for error messages.
std::string position_str(int64_t flat, const Shape& shape) {
  Shape pos(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    pos[d] = flat % shape[d];
    flat /= shape[d];
  }
  return shape_str(pos);
}

// [lo, hi) of the window starting at `start`, clipped to [0, size).
inline void clip(int64_t start, int64_t kernel, int64_t size, int64_t& lo, int64_t& hi) {
  lo = std::max<int64_t>(start, 0);
  hi = std::min<int64_t>(start + kernel, size);
}

// x: (N, C, H, W) any strides; y: (N, C, Ho, Wo) contiguous. reduce(plane, h_lo, h_hi, w_lo, w_hi, o)
// computes the window [h_lo, h_hi) x [w_lo, w_hi) of `plane` (pointing at x[n, c, 0, 0]) into flat
// output element o.
template <typename T, typename Reduce>
void pool2d_fwd_loop(const Tensor& x, const Tensor& y, const Window& p, Reduce reduce) {
  const int64_t C = x.shape()[1], H = x.shape()[2], W = x.shape()[3];
  const int64_t planes = x.shape()[0] * C, Ho = y.shape()[2], Wo = y.shape()[3];
  const int64_t s0 = x.strides()[0], s1 = x.strides()[1];
  const T* px = x.data<T>();
  const int64_t work = planes * Ho * Wo * p.kernel * p.kernel;
#pragma omp parallel for collapse(2) if (work >= cpu::kParallelGrain)
  for (int64_t pl = 0; pl < planes; ++pl) {
    for (int64_t oh = 0; oh < Ho; ++oh) {
      const T* plane = px + (pl / C) * s0 + (pl % C) * s1;
      int64_t h_lo, h_hi;
      clip(oh * p.stride - p.padding, p.kernel, H, h_lo, h_hi);
      for (int64_t ow = 0; ow < Wo; ++ow) {
        int64_t w_lo, w_hi;
        clip(ow * p.stride - p.padding, p.kernel, W, w_lo, w_hi);
        reduce(plane, h_lo, h_hi, w_lo, w_hi, (pl * Ho + oh) * Wo + ow);
      }
    }
  }
}

void max_pool2d_fwd_kernel(const KernelCall& c) {
  const Tensor &x = c.in[0], &y = c.out[0], &idx = c.out[1];
  Window p = window_attrs(c.attrs);
  visit_float_dtype(x.dtype(), "max_pool2d", [&]<typename T>() {
    using A = AccType<T>;
    const int64_t W = x.shape()[3], sh = x.strides()[2], sw = x.strides()[3];
    T* py = y.data<T>();
    int64_t* pi = idx.data<int64_t>();
    pool2d_fwd_loop<T>(x, y, p, [&](const T* plane, int64_t h_lo, int64_t h_hi, int64_t w_lo, int64_t w_hi, int64_t o) {
      A best = -std::numeric_limits<A>::infinity();
      int64_t arg = h_lo * W + w_lo;  // kept when every element is -inf: the first one wins
      bool nan = false;
      for (int64_t h = h_lo; h < h_hi && !nan; ++h) {
        for (int64_t w = w_lo; w < w_hi; ++w) {
          A v = load(plane[h * sh + w * sw]);
          if (v > best || std::isnan(v)) {
            best = v;
            arg = h * W + w;
            if ((nan = std::isnan(v))) break;
          }
        }
      }
      py[o] = store<T>(best);
      pi[o] = arg;
    });
  });
}

void avg_pool2d_fwd_kernel(const KernelCall& c) {
  const Tensor &x = c.in[0], &y = c.out[0];
  Window p = window_attrs(c.attrs);
  visit_float_dtype(x.dtype(), "avg_pool2d", [&]<typename T>() {
    using A = AccType<T>;
    const int64_t sh = x.strides()[2], sw = x.strides()[3];
    const A inv_area = A(1) / A(p.kernel * p.kernel);  // count_include_pad: always K^2
    T* py = y.data<T>();
    pool2d_fwd_loop<T>(x, y, p, [&](const T* plane, int64_t h_lo, int64_t h_hi, int64_t w_lo, int64_t w_hi, int64_t o) {
      A acc = 0;
      for (int64_t h = h_lo; h < h_hi; ++h)
        for (int64_t w = w_lo; w < w_hi; ++w) acc += load(plane[h * sh + w * sw]);
      py[o] = store<T>(acc * inv_area);
    });
  });
}

// g, indices: (N, C, Ho, Wo); dx: (N, C, H, W). Indices are checked first (a kernel cannot throw
// from inside an OpenMP region), then each thread scatters whole planes into an AccType buffer.
void max_pool2d_bwd_scatter_kernel(const KernelCall& c) {
  Tensor g = dense(c.in[0]), idx = dense(c.in[1]);
  const Tensor& dx = c.out[0];
  const int64_t planes = dx.shape()[0] * dx.shape()[1], HW = dx.shape()[2] * dx.shape()[3];
  const int64_t per_plane = g.shape()[2] * g.shape()[3];
  const int64_t* pi = idx.data<int64_t>();
  for (int64_t j = 0; j < idx.numel(); ++j)
    REEL_CHECK(pi[j] >= 0 && pi[j] < HW, "max_pool2d_backward: index ", pi[j], " at position ",
               position_str(j, idx.shape()), " is outside the ", dx.shape()[2], "x", dx.shape()[3],
               " input plane (expected 0 <= index < ", HW, ")");
  visit_float_dtype(g.dtype(), "max_pool2d_backward", [&]<typename T>() {
    using A = AccType<T>;
    const T* pg = g.data<T>();
    T* pdx = dx.data<T>();
#pragma omp parallel if (planes * (HW + per_plane) >= cpu::kParallelGrain)
    {
      std::vector<A> acc(static_cast<size_t>(HW));
#pragma omp for
      for (int64_t pl = 0; pl < planes; ++pl) {
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t j = pl * per_plane; j < (pl + 1) * per_plane; ++j) acc[size_t(pi[j])] += load(pg[j]);
        for (int64_t k = 0; k < HW; ++k) pdx[pl * HW + k] = store<T>(acc[size_t(k)]);
      }
    }
  });
}

// Output rows oh whose window [oh*S - P, oh*S - P + K) contains input row h: [lo, hi).
inline void covering(int64_t h, const Window& p, int64_t out_size, int64_t& lo, int64_t& hi) {
  int64_t first = h + p.padding - p.kernel + 1;  // smallest oh*S that still reaches h
  lo = first <= 0 ? 0 : (first + p.stride - 1) / p.stride;
  hi = std::min<int64_t>((h + p.padding) / p.stride + 1, out_size);
}

void avg_pool2d_bwd_gather_kernel(const KernelCall& c) {
  Tensor g = dense(c.in[0]);
  const Tensor& dx = c.out[0];
  Window p = window_attrs(c.attrs);
  const int64_t planes = dx.shape()[0] * dx.shape()[1], H = dx.shape()[2], W = dx.shape()[3];
  const int64_t Ho = g.shape()[2], Wo = g.shape()[3];
  visit_float_dtype(g.dtype(), "avg_pool2d_backward", [&]<typename T>() {
    using A = AccType<T>;
    const A inv_area = A(1) / A(p.kernel * p.kernel);
    const T* pg = g.data<T>();
    T* pdx = dx.data<T>();
    const int64_t reach = std::max<int64_t>(1, p.kernel / p.stride);  // windows covering one element, per dim
    const int64_t work = planes * H * W * reach * reach;
#pragma omp parallel for collapse(2) if (work >= cpu::kParallelGrain)
    for (int64_t pl = 0; pl < planes; ++pl) {
      for (int64_t h = 0; h < H; ++h) {
        int64_t oh_lo, oh_hi;
        covering(h, p, Ho, oh_lo, oh_hi);
        const T* gp = pg + pl * Ho * Wo;
        for (int64_t w = 0; w < W; ++w) {
          int64_t ow_lo, ow_hi;
          covering(w, p, Wo, ow_lo, ow_hi);
          A acc = 0;
          for (int64_t oh = oh_lo; oh < oh_hi; ++oh)
            for (int64_t ow = ow_lo; ow < ow_hi; ++ow) acc += load(gp[oh * Wo + ow]);
          pdx[(pl * H + h) * W + w] = store<T>(acc * inv_area);
        }
      }
    }
  });
}

// Throws naming `op` when an index is outside [0, V) (before any parallel work starts).
void check_rows(const char* op, const Tensor& idx, const Shape& shape, int64_t V, const Shape& weight_shape) {
  const int64_t* pi = idx.data<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i)
    REEL_CHECK(pi[i] >= 0 && pi[i] < V, op, ": index ", pi[i], " at position ", position_str(i, shape),
               " of indices ", shape_str(shape), " is out of range for weight ", shape_str(weight_shape),
               " (expected 0 <= index < V = ", V, ")");
}

// weight: (V, D) any strides, indices: any shape -> y: indices.shape + (D) contiguous.
void embedding_fwd_kernel(const KernelCall& c) {
  const Tensor &weight = c.in[0], &y = c.out[0];
  Tensor idx = dense(c.in[1]);
  const int64_t V = weight.shape()[0], D = weight.shape()[1], n = idx.numel();
  check_rows("embedding", idx, c.in[1].shape(), V, weight.shape());
  const int64_t* pi = idx.data<int64_t>();
  visit_dtype(weight.dtype(), [&]<typename T>() {
    const T* pw = weight.data<T>();
    T* py = y.data<T>();
    const int64_t s0 = weight.strides()[0], s1 = weight.strides()[1];
#pragma omp parallel for if (n * D >= cpu::kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      const T* row = pw + pi[i] * s0;
      if (s1 == 1) {
        std::memcpy(py + i * D, row, size_t(D) * sizeof(T));
      } else {
        for (int64_t d = 0; d < D; ++d) py[i * D + d] = row[d * s1];
      }
    }
  });
}

// g: indices.shape + (D), indices: any shape -> dweight: (V, D).
void embedding_bwd_bucket_kernel(const KernelCall& c) {
  Tensor g = dense(c.in[0]), idx = dense(c.in[1]);
  const bool accumulate = c.attrs.b("accumulate", false);
  const Tensor before = accumulate ? dense(c.in[2]) : Tensor();  // dw's values to add to (dw itself)
  const Tensor& dw = c.out[0];
  const int64_t V = dw.shape()[0], D = dw.shape()[1], n = idx.numel();
  check_rows("embedding_backward", idx, c.in[1].shape(), V, dw.shape());
  const int64_t* pi = idx.data<int64_t>();
  // Counting sort of positions by row: row v's positions are order[start[v] .. start[v + 1]).
  std::vector<int64_t> start(size_t(V) + 1, 0), order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ++start[size_t(pi[i]) + 1];
  for (int64_t v = 0; v < V; ++v) start[size_t(v) + 1] += start[size_t(v)];
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < n; ++i) order[size_t(fill[size_t(pi[i])]++)] = i;
  visit_float_dtype(g.dtype(), "embedding_backward", [&]<typename T>() {
    using A = AccType<T>;
    const T* pg = g.data<T>();
    const T* pbefore = accumulate ? before.data<T>() : nullptr;
    T* pdw = dw.data<T>();
#pragma omp parallel if ((n + V) * D >= cpu::kParallelGrain)
    {
      std::vector<A> acc(static_cast<size_t>(D));
      // Dynamic: a few hot rows (frequent tokens) may hold most of the positions.
#pragma omp for schedule(dynamic, 16)
      for (int64_t v = 0; v < V; ++v) {
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t k = start[size_t(v)]; k < start[size_t(v) + 1]; ++k) {
          const T* row = pg + order[size_t(k)] * D;
          for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += load(row[d]);
        }
        if (pbefore)
          for (int64_t d = 0; d < D; ++d)
            pdw[v * D + d] = store<T>(load(pbefore[v * D + d]) + load(store<T>(acc[size_t(d)])));
        else
          for (int64_t d = 0; d < D; ++d) pdw[v * D + d] = store<T>(acc[size_t(d)]);
      }
    }
  });
}

}  // namespace

void register_pool_cpu_kernels() {
  constexpr DeviceType cpu = DeviceType::CPU;
  register_kernel(cpu, OpKind::MaxPool2d, max_pool2d_fwd_kernel);
  register_kernel(cpu, OpKind::MaxPool2dBackward, max_pool2d_bwd_scatter_kernel);
  register_kernel(cpu, OpKind::AvgPool2d, avg_pool2d_fwd_kernel);
  register_kernel(cpu, OpKind::AvgPool2dBackward, avg_pool2d_bwd_gather_kernel);
  register_kernel(cpu, OpKind::Embedding, embedding_fwd_kernel);
  register_kernel(cpu, OpKind::EmbeddingBackward, embedding_bwd_bucket_kernel);
}

}  // namespace reel
