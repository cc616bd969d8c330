// CUDA kernels of softmax and log-softmax along one dim, and of their backward ops. Schemas and
// formulas: kernels/schema/reduce.cpp; the CPU twin: kernels/cpu/reduce.cpp.
//
//   softmax:               y = exp(x - m) / s            m = max x, s = sum exp(x - m) along dim
//   log_softmax:           y = (x - m) - log(s)
//   softmax_backward:      dx = y * (g - sum(g * y))
//   log_softmax_backward:  dx = g - exp(y) * sum(g)
//
// Layout. Inputs are made contiguous and seen along `dim` as (outer, C, inner).
//   inner == 1: rows of C contiguous values, *_row_kernel<..., kBlock>: one warp per row for
//               C <= 1024 (8 rows per 256-thread block), one 512-thread block per row beyond. The
//               team strides the row (coalesced) and reduces with shuffles (+ shared memory).
//   inner > 1:  columns of C values with stride inner, *_column_kernel: one thread per column
//               (o, i); neighbouring threads read neighbouring elements, so every step is coalesced.
// The forward statistics (m, s) come from one pass of online softmax (reduce_common.cuh), which
// keeps the CPU's results for -inf (exactly 0 probability), NaN and +inf inputs. Everything is
// computed in Acc (float for f32/f16/bf16, double for f64) and rounded once on store.
#include "kernels/cuda/cuda_registry.h"
#include "kernels/cuda/reduce_common.cuh"

namespace reel {
namespace cuda {
namespace {

using namespace reduce_detail;

constexpr int kThreads = 256;       // warp-per-row and column kernels
constexpr int kRowThreads = 512;    // block-per-row kernels

// ---- forward ----

// y from x and the row's statistics.
template <typename A, bool kLog>
struct SoftmaxOut {
  A m, inv_s, log_s;
  __device__ explicit SoftmaxOut(MaxSum<A> t) : m(t.m), inv_s(A(1) / t.s), log_s(log_acc(t.s)) {}
  __device__ A operator()(A x) const { return kLog ? (x - m) - log_s : exp_acc(x - m) * inv_s; }
};

// x, y: (rows, C) contiguous. One team (warp or block) per row.
template <typename D, bool kLog, bool kBlock>
__global__ void softmax_fwd_row_kernel(const D* x, D* y, int64_t rows, int64_t C) {
  grid_dependency_wait();
  using A = Acc<D>;
  using Team = RowTeam<kBlock>;
  for (int64_t row = Team::first_row(); row < rows; row += Team::row_stride()) {
    const D* xr = x + row * C;
    D* yr = y + row * C;
    const MaxSum<A> t = strided_fold<MaxSumOp<A>, MaxSum<A>>(Team::rank(), C, Team::size(), PushFn<A>(),
                                                             [&](int64_t c) { return to_acc(xr[c]); });
    const SoftmaxOut<A, kLog> f(finalize(Team::template reduce<MaxSumOp<A>>(t)));
    for (int64_t c = Team::rank(); c < C; c += Team::size()) yr[c] = from_acc<D>(f(to_acc(xr[c])));
  }
}

// x, y: (outer, C, inner) contiguous. One thread per column j = o * inner + i, whose element c sits
// at (o * C + c) * inner + i.
template <typename D, bool kLog>
__global__ void softmax_fwd_column_kernel(const D* x, D* y, int64_t outer, int64_t C, int64_t inner) {
  grid_dependency_wait();
  using A = Acc<D>;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < outer * inner;
       j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (j / inner) * C * inner + j % inner;
    const MaxSum<A> t = strided_fold<MaxSumOp<A>, MaxSum<A>>(0, C, 1, PushFn<A>(),
                                                             [&](int64_t c) { return to_acc(x[base + c * inner]); });
    const SoftmaxOut<A, kLog> f(finalize(t));
    for (int64_t c = 0; c < C; ++c) y[base + c * inner] = from_acc<D>(f(to_acc(x[base + c * inner])));
  }
}

// ---- backward ----

// The per-element term summed along dim: g * y (softmax) or g (log_softmax).
template <typename A, bool kLog>
__device__ __forceinline__ A bwd_term(A g, A y) {
  return kLog ? g : g * y;
}
// dx from g, y and the sum of the terms along dim.
template <typename A, bool kLog>
__device__ __forceinline__ A bwd_out(A g, A y, A sum) {
  return kLog ? g - exp_acc(y) * sum : y * (g - sum);
}

// g, y, dx: (rows, C) contiguous. One team (warp or block) per row.
template <typename D, bool kLog, bool kBlock>
__global__ void softmax_bwd_row_kernel(const D* g, const D* y, D* dx, int64_t rows, int64_t C) {
  grid_dependency_wait();
  using A = Acc<D>;
  using Team = RowTeam<kBlock>;
  for (int64_t row = Team::first_row(); row < rows; row += Team::row_stride()) {
    const int64_t off = row * C;
    const A acc = strided_fold<AddOp<A>, A>(Team::rank(), C, Team::size(), combine_fn<AddOp<A>, A>(), [&](int64_t c) {
      return bwd_term<A, kLog>(to_acc(g[off + c]), to_acc(y[off + c]));
    });
    const A sum = Team::template reduce<AddOp<A>>(acc);
    for (int64_t c = Team::rank(); c < C; c += Team::size())
      dx[off + c] = from_acc<D>(bwd_out<A, kLog>(to_acc(g[off + c]), to_acc(y[off + c]), sum));
  }
}

// g, y, dx: (outer, C, inner) contiguous. One thread per column (see softmax_fwd_column_kernel).
template <typename D, bool kLog>
__global__ void softmax_bwd_column_kernel(const D* g, const D* y, D* dx, int64_t outer, int64_t C, int64_t inner) {
  grid_dependency_wait();
  using A = Acc<D>;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < outer * inner;
       j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (j / inner) * C * inner + j % inner;
    const A sum = strided_fold<AddOp<A>, A>(0, C, 1, combine_fn<AddOp<A>, A>(), [&](int64_t c) {
      return bwd_term<A, kLog>(to_acc(g[base + c * inner]), to_acc(y[base + c * inner]));
    });
    for (int64_t c = 0; c < C; ++c) {
      const int64_t k = base + c * inner;
      dx[k] = from_acc<D>(bwd_out<A, kLog>(to_acc(g[k]), to_acc(y[k]), sum));
    }
  }
}

// ---- launchers ----

struct DimLayout {
  int64_t outer = 1, C = 1, inner = 1;
};

DimLayout dim_layout(const Shape& shape, int64_t dim, const char* op) {
  DimLayout L;
  if (shape.empty()) return L;  // a 0-dim tensor is one row of one element
  const int64_t d = wrap_dim(dim, int64_t(shape.size()), op);
  for (int64_t i = 0; i < int64_t(shape.size()); ++i) {
    if (i < d) L.outer *= shape[i];
    else if (i == d) L.C = shape[i];
    else L.inner *= shape[i];
  }
  return L;
}

template <bool kLog>
void softmax_kernel(const KernelCall& c) {
  const char* op = op_name(c.op);
  Tensor x = contiguous_on_device(c.in[0]);  // x: (outer, C, inner) along dim
  DenseOut out(c.out[0]);
  const DimLayout L = dim_layout(x.shape(), c.attrs.i("dim"), op);
  if (x.numel() == 0) return;
  cudaStream_t st = stream_of(x);
  visit_float(x.dtype(), op, [&]<typename D>() {
    const D* px = in_ptr<D>(x);
    D* py = out_ptr<D>(out.buf);
    if (L.inner > 1)
      launch_kernel(softmax_fwd_column_kernel<D, kLog>, blocks_for(L.outer * L.inner, kThreads), kThreads, 0, st, px,
                    py, L.outer, L.C, L.inner);
    else if (L.C <= kWarpRow)
      launch_kernel(softmax_fwd_row_kernel<D, kLog, false>, grid_for(ceil_div(L.outer, kThreads / kWarp)), kThreads, 0,
                    st, px, py, L.outer, L.C);
    else
      launch_kernel(softmax_fwd_row_kernel<D, kLog, true>, grid_for(L.outer), kRowThreads, 0, st, px, py, L.outer, L.C);
    REEL_CUDA_LAUNCH_CHECK();
  });
  out.commit();
}

template <bool kLog>
void softmax_backward_kernel(const KernelCall& c) {
  const char* op = op_name(c.op);
  Tensor g = contiguous_on_device(c.in[0]), y = contiguous_on_device(c.in[1]);  // (outer, C, inner)
  DenseOut out(c.out[0]);
  const DimLayout L = dim_layout(y.shape(), c.attrs.i("dim"), op);
  if (y.numel() == 0) return;
  cudaStream_t st = stream_of(y);
  visit_float(y.dtype(), op, [&]<typename D>() {
    const D *pg = in_ptr<D>(g), *py = in_ptr<D>(y);
    D* pdx = out_ptr<D>(out.buf);
    if (L.inner > 1)
      launch_kernel(softmax_bwd_column_kernel<D, kLog>, blocks_for(L.outer * L.inner, kThreads), kThreads, 0, st, pg,
                    py, pdx, L.outer, L.C, L.inner);
    else if (L.C <= kWarpRow)
      launch_kernel(softmax_bwd_row_kernel<D, kLog, false>, grid_for(ceil_div(L.outer, kThreads / kWarp)), kThreads, 0,
                    st, pg, py, pdx, L.outer, L.C);
    else
      launch_kernel(softmax_bwd_row_kernel<D, kLog, true>, grid_for(L.outer), kRowThreads, 0, st, pg, py, pdx, L.outer,
                    L.C);
    REEL_CUDA_LAUNCH_CHECK();
  });
  out.commit();
}

}  // namespace

void register_softmax_cuda_kernels() {
  constexpr DeviceType gpu = DeviceType::CUDA;
  register_kernel(gpu, OpKind::Softmax, softmax_kernel<false>);
  register_kernel(gpu, OpKind::LogSoftmax, softmax_kernel<true>);
  register_kernel(gpu, OpKind::SoftmaxBackward, softmax_backward_kernel<false>);
  register_kernel(gpu, OpKind::LogSoftmaxBackward, softmax_backward_kernel<true>);
}

}  // namespace cuda
}  // namespace reel
