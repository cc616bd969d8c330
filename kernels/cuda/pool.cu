// CUDA kernels of the pooling and embedding ops. Schemas and attrs: kernels/schema/pool.cpp; the
// reference semantics are the CPU kernels' (kernels/cpu/pool.cpp), mirrored here exactly.
//
// Pooling windows (K kernel, S stride, P padding): output (oh, ow) covers input rows
// h in [oh*S - P, oh*S - P + K) clipped to [0, H), and columns likewise.
//
//   max_pool2d      y = max over the window; indices (i64) = h*W + w of the maximum inside its (H, W)
//                   plane. Padding acts as -inf and never wins (an all -inf window picks its first real
//                   element); ties: the first maximum in row-major window order (strict >); a NaN is
//                   taken as the maximum and the first NaN wins. One thread per output element, grid-
//                   stride; x is read through its strides (no copy).
//   max_pool2d bwd  dx[n, c, indices[n, c, j]] += g[n, c, j]. The op carries only input_shape, not
//                   the window geometry, so it cannot gather per input element over the windows that
//                   contain it; it scatters with atomicAdd (one thread per g element) into a zeroed
//                   accumulator in the accumulation type: dx itself for contiguous f32/f64, else an
//                   f32/f64 temporary rounded into dx afterwards. NOT bit-deterministic where one input
//                   element wins 3 or more windows (the order of its sums varies); with 1 or 2 winners
//                   the result equals the CPU's bit for bit.
//   avg_pool2d      y = (sum of the window's real elements) * (1 / K^2): padding counts as zeros
//                   (count_include_pad), and the same product form as the CPU. One thread per output.
//   avg_pool2d bwd  dx[h, w] = (sum over the windows containing (h, w) of g[oh, ow]) * (1 / K^2),
//                   gathered per input element in row-major (oh, ow) order: deterministic, no atomics.
//   embedding       y[i, :] = weight[indices[i], :], a bit copy for every dtype (i64 too, as on the
//                   CPU). One thread per output element.
//   embedding bwd   dweight[v, :] = sum of g[i, :] over positions i with indices[i] == v.
//                   Deterministic, like the CPU's counting sort: (row, position) pairs are sorted by
//                   row with CUB's stable radix sort, so each row's positions stay ascending; a binary
//                   search per row finds where each row's run starts; then one block per (row v, tile
//                   of <= 128 columns) sums v's run, one thread per column, in position order. The sums
//                   are the CPU's, in the CPU's order, so f32/f64 results match it bit for bit. A very
//                   frequent row is summed serially by its few blocks (fine for token data).
//                   Short index lists and small tables (n <= 8192, n V <= 2^24: a GPT's token and
//                   position ids) skip the sort: each block scans the ids for its row's positions in
//                   order (embedding_bwd_scan_kernel), one launch instead of four or more, same sums.
//                   With accumulate (attr; c, dweight itself, the third input): dweight = c + the
//                   row's sums rounded to D, added in Acc<D> and rounded as the add op does: the
//                   bits of the backward and then the add, one launch and one pass over dweight fewer.
//
// All accumulation is in Acc<D>: f32 for f16/bf16/f32, f64 for f64. Flat indices are split into
// coordinates with 32-bit multiply-shift division whenever the tensors allow (Divider below).
//
// Out-of-range index values — max_pool2d_backward indices outside [0, H*W), embedding indices
// outside [0, V) — are errors on the CPU, but are NOT checked on CUDA: that would need a host read
// of device data inside the op. Such positions are skipped instead: the embedding forward writes a
// zero row for them, the backwards drop their gradient. Nothing outside the tensors is read or
// written.
//
// Inputs may have any strides (pooling forwards and the embedding weight are read through theirs;
// the others are made dense with contiguous_on_device). Outputs passed with strides by dispatch_out
// are computed into a contiguous temporary and copied in.
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_registry.h"
#include "kernels/cuda/device_copy.h"

namespace reel {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// Calls fn.template operator()<T>() for the float dtypes only (the schemas have refused i64 already).
template <typename Fn>
void visit_floating(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::f16: return fn.template operator()<Half>();
    case DType::bf16: return fn.template operator()<BFloat16>();
    default: throw Error(detail::cat(op, " (cuda): dtype ", dtype_name(t), " is not supported"));
  }
}

// `out` itself when contiguous, else a contiguous temporary that finish_output copies into `out`.
Tensor dense_output(const Tensor& out) {
  return out.is_contiguous() ? out : Tensor::empty(out.shape(), out.dtype(), out.device());
}
void finish_output(const Tensor& out, const Tensor& dense) {
  if (!dense.is_same(out)) copy_on_device(out, dense);
}

// Calls fn.template operator()<I>() with I = int32_t when every index value of a launch fits in
// 31 bits, else int64_t. These kernels split flat indices into coordinates per element, and 32-bit
// indices allow the fast division below. Pointer offsets are always computed in 64 bits (a strided
// input may span more memory than it has elements).
template <typename Fn>
void visit_index(int64_t largest_value, Fn&& fn) {
  if (largest_value <= INT32_MAX) fn.template operator()<int32_t>();
  else fn.template operator()<int64_t>();
}

// n / d for 0 <= n by a divisor d >= 1 fixed at launch. The GPU has no integer divide
// instruction (a 32-bit one costs ~20 instructions, a 64-bit one far more), and these kernels divide
// several times per element. For 32-bit indices: n / d = (umulhi(n, m) + n) >> s with s = ceil(log2 d)
// and m = floor(2^32 (2^s - d) / d) + 1 (Granlund & Montgomery; PyTorch's IntDivider); exact for
// n < 2^31, where umulhi(n, m) <= n keeps the sum below 2^32. 64-bit indices divide plainly.
template <typename I>
struct Divider;

template <>
struct Divider<int32_t> {
  int32_t d;
  uint32_t m, s;
  // A size of 0 (an empty input plane, never divided by) gets the constants of 1.
  explicit Divider(int64_t divisor) : d(int32_t(divisor)), s(0) {
    const uint64_t dv = divisor < 1 ? 1 : uint64_t(divisor);
    while ((uint64_t(1) << s) < dv) ++s;
    m = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << s) - dv)) / dv + 1);
  }
  __device__ __forceinline__ int32_t div(int32_t n) const {
    return int32_t((__umulhi(uint32_t(n), m) + uint32_t(n)) >> s);
  }
};

template <>
struct Divider<int64_t> {
  int64_t d;
  explicit Divider(int64_t divisor) : d(divisor) {}
  __device__ __forceinline__ int64_t div(int64_t n) const { return n / d; }
};

// ---------------------------------------------------------------------------------------------------
// Pooling

// Sizes and window of one pooling op in the launch's index type, passed to kernels by value. Sizes
// are Dividers (the value is .d): x (N, C, H, W), y (N, C, Ho, Wo).
template <typename I>
struct PoolShape {
  Divider<I> C, H, W, Ho, Wo;
  Divider<I> stride;  // S
  I kernel, padding;  // K, P
};

template <typename I>
PoolShape<I> pool_shape(const Shape& x, const Shape& y, const Attrs& a) {
  using Div = Divider<I>;
  return {Div(x[1]), Div(x[2]), Div(x[3]), Div(y[2]), Div(y[3]), Div(a.i("stride")), I(a.i("kernel")),
          I(a.i("padding"))};
}

// The largest index value a pooling kernel computes: element counts, and window arithmetic such as
// oh*S - P + K, which stays within max(H, W) + 2P + K + S.
int64_t pool_largest_value(const Shape& x, const Shape& y, const Attrs& a) {
  return std::max({numel_of(x), numel_of(y),
                   std::max(x[2], x[3]) + 2 * a.i("padding") + a.i("kernel") + a.i("stride")});
}

// Element strides of x: (N, C, H, W).
struct Strides4 {
  int64_t n, c, h, w;
};

Strides4 strides4(const Tensor& x) { return {x.strides()[0], x.strides()[1], x.strides()[2], x.strides()[3]}; }

// [lo, hi) of the window starting at `start`, clipped to [0, size).
template <typename I>
__device__ __forceinline__ void clip(I start, I kernel, I size, I& lo, I& hi) {
  lo = start > 0 ? start : 0;
  hi = start + kernel < size ? start + kernel : size;
}

// Output rows oh whose window [oh*S - P, oh*S - P + K) contains input row h: [lo, hi) (maybe empty).
template <typename I>
__device__ __forceinline__ void covering(I h, const PoolShape<I>& p, I out_size, I& lo, I& hi) {
  const I first = h + p.padding - p.kernel + 1;  // smallest oh*S that still reaches h
  lo = first <= 0 ? 0 : p.stride.div(first + p.stride.d - 1);
  const I last = p.stride.div(h + p.padding) + 1;  // one past the largest oh with oh*S - P <= h
  hi = last < out_size ? last : out_size;
}

// Flat index o of a contiguous (N, C, rows, cols) tensor -> (plane n*C + c, row, col).
template <typename I>
__device__ __forceinline__ void split_index(I o, const Divider<I>& rows, const Divider<I>& cols, I& plane, I& row,
                                            I& col) {
  const I t = cols.div(o);
  col = o - t * cols.d;
  plane = rows.div(t);
  row = t - plane * rows.d;
}

// x: (N, C, H, W) any strides; y, idx: (N, C, Ho, Wo) contiguous. One thread per output o.
template <typename D, typename I>
__global__ void max_pool2d_fwd_window_kernel(PoolShape<I> p, Strides4 sx, int64_t n_out, const D* x, D* y,
                                             int64_t* idx) {
  grid_dependency_wait();
  using A = Acc<D>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_out; i += int64_t(gridDim.x) * blockDim.x) {
    I plane, oh, ow;
    split_index(I(i), p.Ho, p.Wo, plane, oh, ow);
    const I n = p.C.div(plane), c = plane - n * p.C.d;
    const D* xp = x + n * sx.n + c * sx.c;  // x[n, c, 0, 0]
    I h_lo, h_hi, w_lo, w_hi;
    clip<I>(oh * p.stride.d - p.padding, p.kernel, p.H.d, h_lo, h_hi);
    clip<I>(ow * p.stride.d - p.padding, p.kernel, p.W.d, w_lo, w_hi);
    A best = A(-INFINITY);
    int64_t arg = int64_t(h_lo) * p.W.d + w_lo;  // kept when every element is -inf: the first one wins
    bool nan = false;
    for (I h = h_lo; h < h_hi && !nan; ++h) {
      for (I w = w_lo; w < w_hi; ++w) {
        const A v = to_acc(xp[h * sx.h + w * sx.w]);
        if (v > best || isnan(v)) {  // strict >: the first maximum wins ties
          best = v;
          arg = int64_t(h) * p.W.d + w;
          if ((nan = isnan(v))) break;  // the first NaN is the maximum
        }
      }
    }
    y[i] = from_acc<D>(best);
    idx[i] = arg;
  }
}

// x: (N, C, H, W) any strides; y: (N, C, Ho, Wo) contiguous. One thread per output o.
template <typename D, typename I>
__global__ void avg_pool2d_fwd_window_kernel(PoolShape<I> p, Strides4 sx, int64_t n_out, const D* x, D* y) {
  grid_dependency_wait();
  using A = Acc<D>;
  const A inv_area = A(1) / A(int64_t(p.kernel) * p.kernel);  // count_include_pad: always K^2
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_out; i += int64_t(gridDim.x) * blockDim.x) {
    I plane, oh, ow;
    split_index(I(i), p.Ho, p.Wo, plane, oh, ow);
    const I n = p.C.div(plane), c = plane - n * p.C.d;
    const D* xp = x + n * sx.n + c * sx.c;
    I h_lo, h_hi, w_lo, w_hi;
    clip<I>(oh * p.stride.d - p.padding, p.kernel, p.H.d, h_lo, h_hi);
    clip<I>(ow * p.stride.d - p.padding, p.kernel, p.W.d, w_lo, w_hi);
    A acc = 0;
    for (I h = h_lo; h < h_hi; ++h)
      for (I w = w_lo; w < w_hi; ++w) acc += to_acc(xp[h * sx.h + w * sx.w]);
    y[i] = from_acc<D>(acc * inv_area);
  }
}

// g, idx: (N, C, Ho, Wo) contiguous, per_plane = Ho*Wo; acc: (N, C, H, W) contiguous and zeroed,
// HW = H*W. One thread per g element j; indices outside [0, HW) are skipped (see the top).
template <typename D, typename A, typename I>
__global__ void max_pool2d_bwd_scatter_kernel(int64_t n_g, Divider<I> per_plane, int64_t HW, const D* g,
                                              const int64_t* idx, A* acc) {
  grid_dependency_wait();
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < n_g; j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = idx[j];
    if (k < 0 || k >= HW) continue;
    atomicAdd(acc + per_plane.div(I(j)) * HW + k, A(to_acc(g[j])));
  }
}

// g: (N, C, Ho, Wo) contiguous; dx: (N, C, H, W) contiguous. One thread per input element i, summing
// the windows that contain it in row-major (oh, ow) order.
template <typename D, typename I>
__global__ void avg_pool2d_bwd_gather_kernel(PoolShape<I> p, int64_t n_x, const D* g, D* dx) {
  grid_dependency_wait();
  using A = Acc<D>;
  const A inv_area = A(1) / A(int64_t(p.kernel) * p.kernel);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_x; i += int64_t(gridDim.x) * blockDim.x) {
    I plane, h, w;
    split_index(I(i), p.H, p.W, plane, h, w);
    I oh_lo, oh_hi, ow_lo, ow_hi;
    covering<I>(h, p, p.Ho.d, oh_lo, oh_hi);
    covering<I>(w, p, p.Wo.d, ow_lo, ow_hi);
    const D* gp = g + int64_t(plane) * p.Ho.d * p.Wo.d;  // g[n, c, 0, 0]
    A acc = 0;
    for (I oh = oh_lo; oh < oh_hi; ++oh)
      for (I ow = ow_lo; ow < ow_hi; ++ow) acc += to_acc(gp[oh * p.Wo.d + ow]);
    dx[i] = from_acc<D>(acc * inv_area);
  }
}

// in: x (N, C, H, W); out: y (N, C, Ho, Wo), indices (N, C, Ho, Wo) i64.
void max_pool2d_cuda(const KernelCall& c) {
  const Tensor& x = c.in[0];
  Tensor y = dense_output(c.out[0]), idx = dense_output(c.out[1]);
  const int64_t n_out = y.numel();
  if (n_out == 0) return;
  visit_floating(x.dtype(), "max_pool2d", [&]<typename T>() {
    visit_index(pool_largest_value(x.shape(), y.shape(), c.attrs), [&]<typename I>() {
      using D = Dev<T>;
      launch_kernel(max_pool2d_fwd_window_kernel<D, I>, blocks_for(n_out, kThreads), kThreads, 0, stream_of(x),
                    pool_shape<I>(x.shape(), y.shape(), c.attrs), strides4(x), n_out,
                    static_cast<const D*>(x.data_ptr()), static_cast<D*>(y.data_ptr()), idx.data<int64_t>());
      REEL_CUDA_LAUNCH_CHECK();
    });
  });
  finish_output(c.out[0], y);
  finish_output(c.out[1], idx);
}

// in: g (N, C, Ho, Wo), indices (N, C, Ho, Wo) i64; attr input_shape; out: dx (N, C, H, W).
void max_pool2d_backward_cuda(const KernelCall& c) {
  const Tensor& dx = c.out[0];
  if (dx.numel() == 0) return;
  Tensor g = contiguous_on_device(c.in[0]), idx = contiguous_on_device(c.in[1]);
  // The atomics accumulate in Acc: into dx directly when it is a contiguous f32/f64 tensor.
  const DType acc_dtype = dx.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor acc = dx.dtype() == acc_dtype && dx.is_contiguous() ? dx : Tensor::empty(dx.shape(), acc_dtype, dx.device());
  cudaStream_t s = stream_of(dx);
  REEL_CUDA_CHECK(cudaMemsetAsync(acc.data_ptr(), 0, acc.nbytes(), s));  // all-zero bits are +0.0
  const int64_t n_g = g.numel(), per_plane = g.shape()[2] * g.shape()[3], HW = dx.shape()[2] * dx.shape()[3];
  if (n_g > 0) {
    visit_floating(g.dtype(), "max_pool2d_backward", [&]<typename T>() {
      visit_index(std::max(n_g, dx.numel()), [&]<typename I>() {
        using D = Dev<T>;
        using A = Acc<D>;
        launch_kernel(max_pool2d_bwd_scatter_kernel<D, A, I>, blocks_for(n_g, kThreads), kThreads, 0, s, n_g,
                      Divider<I>(per_plane), HW, static_cast<const D*>(g.data_ptr()), idx.data<int64_t>(),
                      static_cast<A*>(acc.data_ptr()));
        REEL_CUDA_LAUNCH_CHECK();
      });
    });
  }
  if (!acc.is_same(dx)) copy_on_device(dx, acc);  // rounds f32 -> f16/bf16 once, or writes strided dx
}

// in: x (N, C, H, W); out: y (N, C, Ho, Wo).
void avg_pool2d_cuda(const KernelCall& c) {
  const Tensor& x = c.in[0];
  Tensor y = dense_output(c.out[0]);
  const int64_t n_out = y.numel();
  if (n_out == 0) return;
  visit_floating(x.dtype(), "avg_pool2d", [&]<typename T>() {
    visit_index(pool_largest_value(x.shape(), y.shape(), c.attrs), [&]<typename I>() {
      using D = Dev<T>;
      launch_kernel(avg_pool2d_fwd_window_kernel<D, I>, blocks_for(n_out, kThreads), kThreads, 0, stream_of(x),
                    pool_shape<I>(x.shape(), y.shape(), c.attrs), strides4(x), n_out,
                    static_cast<const D*>(x.data_ptr()), static_cast<D*>(y.data_ptr()));
      REEL_CUDA_LAUNCH_CHECK();
    });
  });
  finish_output(c.out[0], y);
}

// in: g (N, C, Ho, Wo); attrs input_shape, kernel, stride, padding; out: dx (N, C, H, W).
void avg_pool2d_backward_cuda(const KernelCall& c) {
  Tensor dx = dense_output(c.out[0]);
  const int64_t n_x = dx.numel();
  if (n_x == 0) return;
  Tensor g = contiguous_on_device(c.in[0]);
  visit_floating(g.dtype(), "avg_pool2d_backward", [&]<typename T>() {
    visit_index(pool_largest_value(dx.shape(), g.shape(), c.attrs), [&]<typename I>() {
      using D = Dev<T>;
      launch_kernel(avg_pool2d_bwd_gather_kernel<D, I>, blocks_for(n_x, kThreads), kThreads, 0, stream_of(dx),
                    pool_shape<I>(dx.shape(), g.shape(), c.attrs), n_x, static_cast<const D*>(g.data_ptr()),
                    static_cast<D*>(dx.data_ptr()));
      REEL_CUDA_LAUNCH_CHECK();
    });
  });
  finish_output(c.out[0], dx);
}

// ---------------------------------------------------------------------------------------------------
// Embedding

// weight: (V, D) with element strides s0, s1; idx: (n) contiguous; y: (n, D) contiguous, n_y = n*D.
// One thread per y element e = i*D + d. U is an unsigned integer of the element's size: a bit copy.
template <typename U, typename I>
__global__ void embedding_fwd_gather_kernel(int64_t n_y, Divider<I> width, int64_t V, int64_t s0, int64_t s1,
                                            const int64_t* idx, const U* weight, U* y) {
  grid_dependency_wait();
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n_y; e += int64_t(gridDim.x) * blockDim.x) {
    const I i = width.div(I(e)), d = I(e) - i * width.d;
    const int64_t row = idx[i];
    y[e] = row >= 0 && row < V ? weight[row * s0 + d * s1] : U(0);  // out of range: a zero row
  }
}

// idx: (n) contiguous -> keys, pos: (n) int32, the sort's input. An out-of-range row becomes key V,
// a bucket that no output row reads.
__global__ void embedding_bwd_keys_kernel(int32_t n, int32_t V, const int64_t* idx, int32_t* keys, int32_t* pos) {
  grid_dependency_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx[i];
    keys[i] = row >= 0 && row < V ? int32_t(row) : V;
    pos[i] = int32_t(i);
  }
}

// keys: (n) sorted ascending -> start: (V + 1), start[v] = the first k with keys[k] >= v (n if none),
// so row v's positions are pos[start[v] .. start[v + 1]). One thread per v, a binary search each.
__global__ void embedding_bwd_runs_kernel(int32_t n, int32_t V, const int32_t* keys, int32_t* start) {
  grid_dependency_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i <= V; i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t v = int32_t(i);
    int32_t lo = 0, hi = n;
    while (lo < hi) {
      const int32_t mid = lo + (hi - lo) / 2;
      if (keys[mid] < v) lo = mid + 1;
      else hi = mid;
    }
    start[v] = lo;
  }
}

// dw[i] = the sum rounded to D, or (accumulating) before[i] + that, added as the add op adds.
template <typename D>
__device__ __forceinline__ void write_row_sum(D* dw, const D* before, int64_t i, Acc<D> sum) {
  const D rounded = from_acc<D>(sum);
  dw[i] = before ? from_acc<D>(to_acc(before[i]) + to_acc(rounded)) : rounded;
}

// pos: (n) positions grouped by row, ascending within a row; start: (V + 1) the runs; g: (n, D)
// contiguous; dw: (V, D) contiguous. Grid (V, ceil(D / blockDim.x)): block (v, tile) owns row v's
// columns [tile*blockDim.x, (tile+1)*blockDim.x), one thread per column, summing v's run in order.
template <typename D>
__global__ void embedding_bwd_segment_kernel(int64_t width, const int32_t* start, const int32_t* pos, const D* g,
                                             const D* before, D* dw) {
  grid_dependency_wait();
  using A = Acc<D>;
  const int32_t v = int32_t(blockIdx.x);
  const int64_t d = blockIdx.y * int64_t(blockDim.x) + threadIdx.x;
  if (d >= width) return;
  const int32_t lo = start[v], hi = start[v + 1];
  A acc = 0;
  // Unrolled so that several rows' loads are in flight at once (a frequent token's run is long);
  // the additions still happen one by one, in position order.
#pragma unroll 8
  for (int32_t k = lo; k < hi; ++k) acc += to_acc(g[int64_t(pos[k]) * width + d]);  // coalesced over d
  write_row_sum(dw, before, int64_t(v) * width + d, acc);
}

// The backward for short index lists (n <= kScanMaxPositions), in one launch: block (v, tile) scans
// idx for row v's positions, compacting them into shared memory in ascending order (a ballot per warp,
// the warps' counts in order), then each thread sums its column over them in that order, as the
// sorted path's segment kernel does: the same bits, without the sort's launches. A block has a
// thread per column, up to kScanMaxThreads, so that a row's columns take one block and one scan of
// idx (gpt-small's (256, 512) tables from 4096 positions: 256 blocks scanning in steps of 512,
// where four 128-column tiles each scanned in steps of 128: 19.5 us a launch).
constexpr int kScanMaxThreads = 1024;
constexpr int64_t kScanMaxPositions = 8192;

template <typename D>
__global__ void embedding_bwd_scan_kernel(int32_t n, int64_t width, const int64_t* idx, const D* g, const D* before,
                                          D* dw) {
  grid_dependency_wait();
  using A = Acc<D>;
  __shared__ int32_t rows[kScanMaxPositions];
  __shared__ int32_t warp_count[kScanMaxThreads / 32];
  __shared__ int32_t found;
  const int64_t v = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (threadIdx.x == 0) found = 0;
  __syncthreads();
  for (int32_t base = 0; base < n; base += int32_t(blockDim.x)) {
    const int32_t k = base + int32_t(threadIdx.x);
    const bool hit = k < n && idx[k] == v;
    const unsigned ballot = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int32_t before = found;
    for (int w = 0; w < warp; ++w) before += warp_count[w];
    if (hit) rows[before + __popc(ballot & ((1u << lane) - 1))] = k;
    __syncthreads();
    if (threadIdx.x == 0)
      for (int w = 0; w < warps; ++w) found += warp_count[w];
    __syncthreads();
  }
  const int64_t d = blockIdx.y * int64_t(blockDim.x) + threadIdx.x;
  if (d >= width) return;
  A acc = 0;
  for (int32_t j = 0; j < found; ++j) acc += to_acc(g[int64_t(rows[j]) * width + d]);
  write_row_sum(dw, before, v * width + d, acc);
}

// The values an accumulating backward adds to, or nullptr (write_row_sum's `before`).
template <typename D>
const D* rows_before(const Tensor& before) {
  return before.defined() ? static_cast<const D*>(before.data_ptr()) : nullptr;
}

// in: weight (V, D) any dtype, indices (any shape) i64; out: y indices.shape + (D).
void embedding_cuda(const KernelCall& c) {
  const Tensor& weight = c.in[0];
  Tensor y = dense_output(c.out[0]);
  const int64_t n_y = y.numel();
  if (n_y == 0) return;
  Tensor idx = contiguous_on_device(c.in[1]);
  const int64_t V = weight.shape()[0], width = weight.shape()[1];
  const int64_t s0 = weight.strides()[0], s1 = weight.strides()[1];
  cudaStream_t s = stream_of(y);
  auto launch = [&]<typename U>() {
    visit_index(n_y, [&]<typename I>() {
      launch_kernel(embedding_fwd_gather_kernel<U, I>, blocks_for(n_y, kThreads), kThreads, 0, s, n_y,
                    Divider<I>(width), V, s0, s1, idx.data<int64_t>(), static_cast<const U*>(weight.data_ptr()),
                    static_cast<U*>(y.data_ptr()));
      REEL_CUDA_LAUNCH_CHECK();
    });
  };
  switch (weight.element_size()) {
    case 2: launch.template operator()<uint16_t>(); break;
    case 4: launch.template operator()<uint32_t>(); break;
    case 8: launch.template operator()<uint64_t>(); break;
    default: throw InternalError(detail::cat("embedding (cuda): unexpected element size ", weight.element_size()));
  }
  finish_output(c.out[0], y);
}

// Stable radix sort of (key, position) pairs by key on stream s; keys lie in [0, V].
void sort_rows(const int32_t* keys_in, int32_t* keys_out, const int32_t* pos_in, int32_t* pos_out, int32_t n,
               int32_t V, Device device, cudaStream_t s) {
  int end_bit = 1;
  while ((int64_t(1) << end_bit) <= V) ++end_bit;  // enough bits for the values 0..V
  size_t temp_bytes = 0;  // the size query runs nothing on the device
  REEL_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, pos_in, pos_out, n, 0, end_bit, s));
  Tensor temp = workspace(temp_bytes, device);
  REEL_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, keys_in, keys_out, pos_in, pos_out,
                                                  n, 0, end_bit, s));
}

// in: g indices.shape + (D), indices (any shape) i64; attr num_weights V; out: dweight (V, D).
void embedding_backward_cuda(const KernelCall& c) {
  Tensor dw = dense_output(c.out[0]);
  const int64_t V = dw.shape()[0], width = dw.shape()[1];
  if (dw.numel() == 0) return;
  Tensor g = contiguous_on_device(c.in[0]), idx = contiguous_on_device(c.in[1]);
  // dw's values to add to (dw itself when dense; read before any block writes its row)
  const Tensor before = c.attrs.b("accumulate", false) ? contiguous_on_device(c.in[2]) : Tensor();
  const int64_t n = idx.numel();
  const int threads = int(std::min<int64_t>(128, (width + 31) / 32 * 32));
  const int64_t tiles = (width + threads - 1) / threads;
  REEL_CHECK(n < INT32_MAX && V < INT32_MAX && tiles <= 65535, "embedding_backward (cuda): ", n,
             " positions, num_weights ", V, " and width ", width, " exceed the kernel's limits (2^31 - 1 positions ",
             "and rows, ", 65535 * 128, " columns)");
  const Device device = dw.device();
  cudaStream_t s = stream_of(dw);
  if (n <= kScanMaxPositions && n * V <= (int64_t(1) << 24)) {  // short lists, small tables: one launch
    visit_floating(g.dtype(), "embedding_backward", [&]<typename T>() {
      using D = Dev<T>;
      const int scan_threads = int(std::min<int64_t>(kScanMaxThreads, (width + 31) / 32 * 32));
      const int64_t scan_tiles = (width + scan_threads - 1) / scan_threads;
      const dim3 grid{unsigned(V), unsigned(scan_tiles)};
      launch_kernel(embedding_bwd_scan_kernel<D>, grid, scan_threads, 0, s, int32_t(n), width, idx.data<int64_t>(),
                    static_cast<const D*>(g.data_ptr()), rows_before<D>(before), static_cast<D*>(dw.data_ptr()));
      REEL_CUDA_LAUNCH_CHECK();
    });
    finish_output(c.out[0], dw);
    return;
  }
  // int32 buffers: sort keys and positions before and after the sort, and the run starts.
  const size_t bytes = size_t(n) * sizeof(int32_t);
  Tensor keys_in = workspace(bytes, device), keys = workspace(bytes, device);
  Tensor pos_in = workspace(bytes, device), pos = workspace(bytes, device);
  Tensor start = workspace(size_t(V + 1) * sizeof(int32_t), device);
  auto* k_in = static_cast<int32_t*>(keys_in.data_ptr());
  auto* k_out = static_cast<int32_t*>(keys.data_ptr());
  auto* p_in = static_cast<int32_t*>(pos_in.data_ptr());
  auto* p_out = static_cast<int32_t*>(pos.data_ptr());
  auto* runs = static_cast<int32_t*>(start.data_ptr());
  if (n > 0) {
    launch_kernel(embedding_bwd_keys_kernel, blocks_for(n, kThreads), kThreads, 0, s, int32_t(n), int32_t(V),
                  idx.data<int64_t>(), k_in, p_in);
    REEL_CUDA_LAUNCH_CHECK();
    sort_rows(k_in, k_out, p_in, p_out, int32_t(n), int32_t(V), device, s);
  }
  launch_kernel(embedding_bwd_runs_kernel, blocks_for(V + 1, kThreads), kThreads, 0, s, int32_t(n), int32_t(V), k_out,
                runs);
  REEL_CUDA_LAUNCH_CHECK();
  visit_floating(g.dtype(), "embedding_backward", [&]<typename T>() {
    using D = Dev<T>;
    const dim3 grid{unsigned(V), unsigned(tiles)};
    launch_kernel(embedding_bwd_segment_kernel<D>, grid, threads, 0, s, width, runs, p_out,
                  static_cast<const D*>(g.data_ptr()), rows_before<D>(before), static_cast<D*>(dw.data_ptr()));
    REEL_CUDA_LAUNCH_CHECK();
  });
  finish_output(c.out[0], dw);
}

}  // namespace
}  // namespace cuda

void register_pool_cuda_kernels() {
  using namespace cuda;
  constexpr DeviceType gpu = DeviceType::CUDA;
  register_kernel(gpu, OpKind::MaxPool2d, max_pool2d_cuda);
  register_kernel(gpu, OpKind::MaxPool2dBackward, max_pool2d_backward_cuda);
  register_kernel(gpu, OpKind::AvgPool2d, avg_pool2d_cuda);
  register_kernel(gpu, OpKind::AvgPool2dBackward, avg_pool2d_backward_cuda);
  register_kernel(gpu, OpKind::Embedding, embedding_cuda);
  register_kernel(gpu, OpKind::EmbeddingBackward, embedding_backward_cuda);
}

}  // namespace reel
