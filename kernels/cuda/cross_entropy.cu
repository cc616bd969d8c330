// CUDA kernels of the fused cross-entropy and its backward. Schemas and formulas:
// kernels/schema/reduce.cpp; the CPU twin: kernels/cpu/reduce.cpp.
//
//   forward:  lse_n = m_n + log(sum_c exp(logits[n, c] - m_n))        (N), in Acc
//             loss  = sum over counted rows of (lse_n - logits[n, t_n]), / count for the mean
//   backward: dlogits[n, c] = (exp(logits[n, c] - lse_n) - [c == t_n]) * scale,
//             scale = g / count (mean) or g (sum); rows whose target is ignore_index get 0.
// count = rows whose target is not ignore_index; the mean over no rows is 0/0 = NaN (with a zero
// gradient), as on the CPU and in PyTorch.
//
// Launches. Forward: cross_entropy_fwd_row_kernel, one team per row (a warp for C <= 1024, a
// 512-thread block beyond), computes lse_n by online softmax and writes the row's loss (double) to
// a workspace; cross_entropy_fwd_total_kernel, one block, adds those losses and counts the rows in
// a fixed order, so the loss is reproducible bit for bit (no atomics). Backward:
// cross_entropy_bwd_scale_kernel (one block) turns g and the count into scale on the device, then
// cross_entropy_bwd_row_kernel writes dlogits, one team per row.
//
// Fused (cross_entropy_with_grad): cross_entropy_with_grad_kernel does the work of all four in one
// launch and one read of the logits. Each block counts the rows that are not ignored (the mean's
// divisor; the targets are a few KiB, read from L2 by every block, which is why its grid stops at
// two blocks an SM and its teams may take several rows), then per row computes lse_n, the row's loss
// and the row of dlogits, written in the gradient's dtype (the 16-bit copy the head's GEMMs read, so
// no f32 gradient is stored), and the last block to finish adds the rows' losses in the total
// kernel's order (kernels/cuda/last_block.cuh). The same folds, formulas and order of sums as the
// kernels above: the loss and the gradient have the bits of cross_entropy, cross_entropy_backward
// and the cast, where those take five launches.
//
// Fused classifier head (linear_cross_entropy_with_grad): a block per row of x computes the row's
// logits (x @ w + bias, f32), its loss and gradient as cross_entropy_with_grad_kernel does (the
// same fold and formulas over the same f32 logits), and the input's gradient dlogits @ w^T from the
// gradient as rounded to its dtype, so the head's three kernels (its two GEMMs and the loss) are one,
// four with autocast's cast of an f32 x before them, which it also writes.
// Taken for heads too small for a GEMM to pay (linear_cross_entropy_supported): ten classes over a
// CNN's pooled features, where cuBLAS's kernels are all launch and no arithmetic.
//
// Difference from the CPU: the CPU refuses a target outside [0, C) that is not ignore_index. The
// targets live on the GPU and reading them back would synchronise the host, so here such a row is
// not checked: it counts as a row, its loss is NaN and its gradient row is NaN (never an
// out-of-bounds read), which makes the loss NaN and the failure visible (a GradScaler skips it).
#include <cmath>

#include "kernels/cuda/cuda_registry.h"
#include "kernels/cuda/last_block.cuh"
#include "kernels/cuda/reduce_common.cuh"

namespace reel {
namespace cuda {
namespace {

using namespace reduce_detail;

constexpr int kThreads = 256;       // warp-per-row kernels (8 rows per block) and one-block kernels
constexpr int kRowThreads = 512;    // block-per-row kernels

// The rows whose target is not ignore_index (the mean's divisor), counted by the whole block: every
// thread gets the count.
__device__ __forceinline__ int64_t counted_rows(const int64_t* target, int64_t N, int64_t ignore_index) {
  int64_t count = 0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) count += target[n] != ignore_index;
  return block_reduce<AddOp<int64_t>>(count);
}

// One row of dlogits, (exp(x[c] - l) - [c == tn]) * scale for c < C, by the team's ranks: x[c] is
// load(c), each value goes to store(c, v); 0 for an ignored row, NaN for a target outside [0, C).
template <typename Team, typename A, typename Load, typename Store>
__device__ __forceinline__ void gradient_values(int64_t C, int64_t tn, bool ignored, A l, A scale, Load load,
                                                Store store) {
  const bool valid = tn >= 0 && tn < C;
  for (int64_t c = Team::rank(); c < C; c += Team::size()) {
    A v = A(0);
    if (!ignored) {
      v = valid ? exp_acc(load(c) - l) * scale : A(NAN);
      if (c == tn) v -= scale;
    }
    store(c, v);
  }
}

// The row xr's dlogits written to dr in the gradient's dtype G.
template <typename Team, typename D, typename G, typename A>
__device__ __forceinline__ void gradient_row(const D* xr, G* dr, int64_t C, int64_t tn, bool ignored, A l, A scale) {
  gradient_values<Team>(
      C, tn, ignored, l, scale, [&](int64_t c) { return to_acc(xr[c]); },
      [&](int64_t c, A v) { dr[c] = from_acc<G>(v); });
}

// A row's loss, l - x[tn] with x[tn] = load(tn): 0 for an ignored row, NaN for a target outside [0, C).
template <typename A, typename Load>
__device__ __forceinline__ double row_loss_value(A l, int64_t tn, bool ignored, int64_t C, Load load) {
  if (ignored) return 0.0;
  return tn >= 0 && tn < C ? double(l - load(tn)) : double(NAN);
}

// logits: (N, C), target: (N) -> lse: (N) Acc, row_loss: (N) double (0 for an ignored row).
template <typename D, bool kBlock>
__global__ void cross_entropy_fwd_row_kernel(const D* logits, const int64_t* target, Acc<D>* lse, double* row_loss,
                                             int64_t N, int64_t C, int64_t ignore_index) {
  grid_dependency_wait();
  using A = Acc<D>;
  using Team = RowTeam<kBlock>;
  for (int64_t n = Team::first_row(); n < N; n += Team::row_stride()) {
    const D* xr = logits + n * C;
    MaxSum<A> t = strided_fold<MaxSumOp<A>, MaxSum<A>>(Team::rank(), C, Team::size(), PushFn<A>(),
                                                       [&](int64_t c) { return to_acc(xr[c]); });
    t = finalize(Team::template reduce<MaxSumOp<A>>(t));
    if (Team::rank() == 0) {
      const A l = t.m + log_acc(t.s);
      const int64_t tn = target[n];
      lse[n] = l;
      row_loss[n] = row_loss_value(l, tn, tn == ignore_index, C, [&](int64_t c) { return to_acc(xr[c]); });
    }
  }
}

// loss (0-dim) from row_loss (N) and the count of rows not ignored, by one block of any multiple of
// kThreads threads, for the total kernel and the fused kernel's last block: the first kThreads threads
// add rows n = rank, rank + kThreads, ... in order and the others add zeros (where a block of kThreads
// puts block_reduce's identity), so both give the same bits. Rows are read from L2 (last_block.cuh).
template <typename D>
__device__ void cross_entropy_total(const double* row_loss, int64_t N, int64_t count, bool mean, D* loss) {
  using A = Acc<D>;
  double total = 0;
  if (threadIdx.x < kThreads)
    for (int64_t n = threadIdx.x; n < N; n += kThreads) total += load_partial(row_loss + n);
  total = block_reduce<AddOp<double>>(total);
  if (threadIdx.x == 0) *loss = from_acc<D>(A(mean ? total / double(count) : total));
}

// loss (0-dim) = sum of row_loss (N), divided by the number of rows whose target is not
// ignore_index for the mean. One block of kThreads.
template <typename D>
__global__ void cross_entropy_fwd_total_kernel(const double* row_loss, const int64_t* target, int64_t N,
                                               int64_t ignore_index, bool mean, D* loss) {
  grid_dependency_wait();
  cross_entropy_total(row_loss, N, counted_rows(target, N, ignore_index), mean, loss);
}

// scale (one Acc) = g / count (mean) or g (sum); g is one element. One block.
template <typename D>
__global__ void cross_entropy_bwd_scale_kernel(const D* g, const int64_t* target, int64_t N, int64_t ignore_index,
                                               bool mean, Acc<D>* scale) {
  grid_dependency_wait();
  using A = Acc<D>;
  const int64_t count = mean ? counted_rows(target, N, ignore_index) : 0;  // mean: alike in every thread
  // With every row ignored the scale is g / 0, but no row uses it.
  if (threadIdx.x == 0) *scale = mean ? to_acc(*g) / A(count) : to_acc(*g);
}

// logits, dx: (N, C); target, lse: (N). One team (warp or block) per row.
template <typename D, bool kBlock>
__global__ void cross_entropy_bwd_row_kernel(const D* logits, const int64_t* target, const Acc<D>* lse,
                                             const Acc<D>* scale_at, D* dx, int64_t N, int64_t C,
                                             int64_t ignore_index) {
  grid_dependency_wait();
  using A = Acc<D>;
  using Team = RowTeam<kBlock>;
  const A scale = *scale_at;
  for (int64_t n = Team::first_row(); n < N; n += Team::row_stride()) {
    const D* xr = logits + n * C;
    D* dr = dx + n * C;
    const int64_t tn = target[n];
    const A l = lse[n];
    gradient_row<Team>(xr, dr, C, tn, tn == ignore_index, l, scale);
  }
}

// logits: (N, C), target: (N), g: one element -> loss (0-dim), dx: (N, C) in G (D, or 16 bits for f32
// logits); row_loss: (N) double, a workspace. Teams as in the kernels above. Every block counts the
// targets (the mean's divisor) after its first row's logits are folded, so both reads are in flight
// together; the last block to finish adds the rows' losses (last_block.cuh): one launch.
template <typename D, typename G, bool kBlock>
__global__ void cross_entropy_with_grad_kernel(const D* logits, const int64_t* target, const D* g, double* row_loss,
                                               D* loss, G* dx, int64_t N, int64_t C, int64_t ignore_index, bool mean) {
  grid_dependency_wait();
  using A = Acc<D>;
  using Team = RowTeam<kBlock>;
  auto fold = [&](int64_t n) {
    const D* xr = logits + n * C;
    MaxSum<A> t = strided_fold<MaxSumOp<A>, MaxSum<A>>(Team::rank(), C, Team::size(), PushFn<A>(),
                                                       [&](int64_t c) { return to_acc(xr[c]); });
    return finalize(Team::template reduce<MaxSumOp<A>>(t));  // every rank of the team gets it
  };
  int64_t n = Team::first_row();
  MaxSum<A> t{};
  if (n < N) t = fold(n);
  const int64_t count = counted_rows(target, N, ignore_index);
  // As cross_entropy_bwd_scale_kernel: with every row ignored the scale is g / 0, used by no row.
  const A scale = mean ? to_acc(*g) / A(count) : to_acc(*g);
  for (bool first = true; n < N; n += Team::row_stride(), first = false) {
    if (!first) t = fold(n);
    const D* xr = logits + n * C;
    const A l = t.m + log_acc(t.s);
    const int64_t tn = target[n];
    const bool ignored = tn == ignore_index;
    if (Team::rank() == 0) row_loss[n] = row_loss_value(l, tn, ignored, C, [&](int64_t c) { return to_acc(xr[c]); });
    gradient_row<Team>(xr, dx + n * C, C, tn, ignored, l, scale);
  }
  if (arrive_last(finish_counter(0), gridDim.x)) cross_entropy_total(row_loss, N, count, mean, loss);
}

// Launches a row kernel: one warp per row for C <= kWarpRow, else one block per row.
template <typename WarpKernel, typename BlockKernel, typename... Args>
void launch_rows(WarpKernel warp_kernel, BlockKernel block_kernel, int64_t N, int64_t C, cudaStream_t st,
                 Args... args) {
  if (C <= kWarpRow)
    launch_kernel(warp_kernel, grid_for(ceil_div(N, kThreads / kWarp)), kThreads, 0, st, args...);
  else
    launch_kernel(block_kernel, grid_for(N), kRowThreads, 0, st, args...);
  REEL_CUDA_LAUNCH_CHECK();
}

struct CrossEntropyArgs {
  Tensor logits, target;  // contiguous: logits (N, C), target (N)
  int64_t N, C, ignore_index;
  bool mean;
};

CrossEntropyArgs cross_entropy_args(const KernelCall& c, const Tensor& logits, const Tensor& target) {
  return {contiguous_on_device(logits), contiguous_on_device(target), logits.shape()[0], logits.shape()[1],
          c.attrs.i("ignore_index", -100), c.attrs.i("reduction", 0) == 0};
}

void cross_entropy_kernel(const KernelCall& c) {
  const CrossEntropyArgs a = cross_entropy_args(c, c.in[0], c.in[1]);
  DenseOut loss_out(c.out[0]), lse_out(c.out[1]);
  cudaStream_t st = stream_of(a.logits);
  Tensor ws = workspace(size_t(std::max<int64_t>(a.N, 1)) * sizeof(double), a.logits.device());
  double* row_loss = static_cast<double*>(ws.data_ptr());
  const int64_t* target = in_ptr<int64_t>(a.target);
  visit_float(a.logits.dtype(), "cross_entropy", [&]<typename D>() {
    using A = Acc<D>;
    if (a.N > 0)
      launch_rows(cross_entropy_fwd_row_kernel<D, false>, cross_entropy_fwd_row_kernel<D, true>, a.N, a.C, st,
                  in_ptr<D>(a.logits), target, out_ptr<A>(lse_out.buf), row_loss, a.N, a.C, a.ignore_index);
    launch_kernel(cross_entropy_fwd_total_kernel<D>, 1, kThreads, 0, st, row_loss, target, a.N, a.ignore_index, a.mean,
                  out_ptr<D>(loss_out.buf));
    REEL_CUDA_LAUNCH_CHECK();
  });
  loss_out.commit();
  lse_out.commit();
}

void cross_entropy_backward_kernel(const KernelCall& c) {
  const CrossEntropyArgs a = cross_entropy_args(c, c.in[1], c.in[2]);
  const Tensor& g = c.in[0];  // one element: data_ptr is it, whatever the strides
  Tensor lse = contiguous_on_device(c.in[3]);
  DenseOut out(c.out[0]);
  if (a.N == 0) return;
  cudaStream_t st = stream_of(a.logits);
  const int64_t* target = in_ptr<int64_t>(a.target);
  visit_float(a.logits.dtype(), "cross_entropy_backward", [&]<typename D>() {
    using A = Acc<D>;
    Tensor ws = workspace(sizeof(A), a.logits.device());
    A* scale = static_cast<A*>(ws.data_ptr());
    launch_kernel(cross_entropy_bwd_scale_kernel<D>, 1, kThreads, 0, st, static_cast<const D*>(g.data_ptr()), target,
                  a.N, a.ignore_index, a.mean, scale);
    REEL_CUDA_LAUNCH_CHECK();
    launch_rows(cross_entropy_bwd_row_kernel<D, false>, cross_entropy_bwd_row_kernel<D, true>, a.N, a.C, st,
                in_ptr<D>(a.logits), target, in_ptr<A>(lse), static_cast<const A*>(scale), out_ptr<D>(out.buf), a.N,
                a.C, a.ignore_index);
  });
  out.commit();
}

// The fused kernel's grid: a team per row as launch_rows gives, but at most kFusedBlocksPerSm
// blocks an SM (each block reads all N targets for the count; beyond that the teams loop over rows).
constexpr int kFusedBlocksPerSm = 2;
constexpr int kFusedThreads = 512;  // 16 warp teams a block: enough loads in flight with few blocks

void cross_entropy_with_grad_kernel(const KernelCall& c) {
  const CrossEntropyArgs a = cross_entropy_args(c, c.in[0], c.in[1]);
  const Tensor& g = c.in[2];  // one element: data_ptr is it, whatever the strides
  DenseOut loss_out(c.out[0]), grad_out(c.out[1]);
  cudaStream_t st = stream_of(a.logits);
  Tensor ws = workspace(size_t(std::max<int64_t>(a.N, 1)) * sizeof(double), a.logits.device());
  double* row_loss = static_cast<double*>(ws.data_ptr());
  const int64_t* target = in_ptr<int64_t>(a.target);
  const int64_t cap = int64_t(kFusedBlocksPerSm) * multiprocessor_count(a.logits.device().index);
  const DType grad_dtype = grad_out.buf.dtype();
  visit_float(a.logits.dtype(), "cross_entropy_with_grad", [&]<typename D>() {
    auto launch = [&]<typename G>() {
      const bool rows_of_a_warp = a.C <= kWarpRow;
      const int64_t teams_per_block = rows_of_a_warp ? kFusedThreads / kWarp : 1;
      const unsigned grid = grid_for(std::min(ceil_div(a.N, teams_per_block), cap));
      auto kernel =
          rows_of_a_warp ? cross_entropy_with_grad_kernel<D, G, false> : cross_entropy_with_grad_kernel<D, G, true>;
      launch_kernel(kernel, grid, kFusedThreads, 0, st, in_ptr<D>(a.logits), target,
                    static_cast<const D*>(g.data_ptr()), row_loss, out_ptr<D>(loss_out.buf), out_ptr<G>(grad_out.buf),
                    a.N, a.C, a.ignore_index, a.mean);
      REEL_CUDA_LAUNCH_CHECK();
    };
    if (grad_dtype == a.logits.dtype())
      launch.template operator()<D>();
    else if constexpr (std::is_same_v<D, float>) {
      if (grad_dtype == DType::bf16)
        launch.template operator()<__nv_bfloat16>();
      else if (grad_dtype == DType::f16)
        launch.template operator()<__half>();
      else
        throw Error(detail::cat("cross_entropy_with_grad: no CUDA kernel writes a ", dtype_name(grad_dtype),
                                " gradient of f32 logits"));
    } else {
      throw Error(detail::cat("cross_entropy_with_grad: no CUDA kernel writes a ", dtype_name(grad_dtype),
                              " gradient of ", dtype_name(a.logits.dtype()), " logits"));
    }
  });
  loss_out.commit();
  grad_out.commit();
}

// ---- a small classifier's head in one launch ----
//
//   logits[n, k] = sum_c x[n, c] w[c, k] + bias[k]        x (N, C), w (C, K) in T; f32 sums, never stored
//   loss, dlogits[n, k] = cross_entropy_with_grad(logits)  dlogits (N, K) rounded to T
//   dx[n, c] = sum_k dlogits[n, k] w[c, k]                 dx (N, C) in T, from the rounded dlogits
//
// w (C, K) of any strides (wc, wk): a Linear's W^T, a view of the (K, C) weight in f32, or autocast's
// 16-bit copy. A block per row (rows n = block, block + grid, ...): the row of x staged in shared memory as f32, a
// warp per logit (lanes over c, the warp's fixed-order sum), warp 0 the loss and gradient of the row
// over the staged logits, a thread per dx column. The sums' orders are fixed: the same bits every run.
// Against cuBLAS's GEMMs the logits and dx are within f32 rounding (other orders of the same sums).
constexpr int kHeadThreads = 256;
constexpr int64_t kHeadMaxC = 2048;  // staged x row: 8 KiB of f32
constexpr int64_t kHeadMaxK = 1024;  // staged logits: 4 KiB
// At most this many multiply-adds a launch (N C K): cnn-small's head is 41 k, ResNet-18's 164 k; a
// GPT's (4 M rows x a vocabulary) belongs to the tensor cores.
constexpr int64_t kHeadMaxWork = int64_t(1) << 22;

// X: x's type, T or float (then each x is rounded to T, which the kernel also stores in xt: the cast
// autocast made for the GEMMs, which the weight gradient still reads).
template <typename X, typename T>
__global__ void __launch_bounds__(kHeadThreads)
    linear_cross_entropy_kernel(const X* x, const T* w, int64_t wc, int64_t wk, const float* bias,
                                const int64_t* target, const float* g, double* row_loss, float* loss, T* dlogits, T* dx,
                                T* xt, int64_t N, int C, int K, int64_t ignore_index, bool mean) {
  grid_dependency_wait();
  __shared__ float sx[kHeadMaxC];  // (C): the row of x
  __shared__ float sl[kHeadMaxK];  // (K): its logits, then its gradient as rounded to T
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp, warps = kHeadThreads / kWarp;
  const int64_t count = counted_rows(target, N, ignore_index);
  const float scale = mean ? *g / float(count) : *g;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    for (int c = int(threadIdx.x); c < C; c += kHeadThreads) {
      if constexpr (std::is_same_v<X, T>) {
        sx[c] = to_acc(x[n * C + c]);
      } else {
        const T r = from_acc<T>(x[n * C + c]);
        xt[n * C + c] = r;
        sx[c] = to_acc(r);
      }
    }
    __syncthreads();
    for (int k = warp; k < K; k += warps) {
      float acc = 0.0f;
      for (int c = lane; c < C; c += kWarp) acc = fmaf(sx[c], to_acc(w[c * wc + k * wk]), acc);
      acc = warp_reduce<AddOp<float>>(acc);
      if (lane == 0) sl[k] = acc + bias[k];
    }
    __syncthreads();
    if (warp == 0) {
      using Team = RowTeam<false>;
      MaxSum<float> t = strided_fold<MaxSumOp<float>, MaxSum<float>>(Team::rank(), K, Team::size(), PushFn<float>(),
                                                                     [&](int64_t k) { return sl[k]; });
      t = finalize(Team::template reduce<MaxSumOp<float>>(t));
      const float l = t.m + log_acc(t.s);
      const int64_t tn = target[n];
      const bool ignored = tn == ignore_index;
      const double row = row_loss_value(l, tn, ignored, K, [&](int64_t k) { return sl[k]; });
      __syncwarp();  // every lane has read sl[tn] before the gradient overwrites it
      if (lane == 0) row_loss[n] = row;
      // Each lane reads and then overwrites its own logits: sl holds the gradient as rounded to T after.
      gradient_values<Team>(
          K, tn, ignored, l, scale, [&](int64_t k) { return sl[k]; },
          [&](int64_t k, float v) {
            const T r = from_acc<T>(v);
            dlogits[n * K + k] = r;
            sl[k] = to_acc(r);
          });
    }
    __syncthreads();
    for (int c = int(threadIdx.x); c < C; c += kHeadThreads) {
      float acc = 0.0f;
      const T* wrow = w + c * wc;
      for (int k = 0; k < K; ++k) acc = fmaf(sl[k], to_acc(wrow[k * wk]), acc);
      dx[n * C + c] = from_acc<T>(acc);
    }
    __syncthreads();  // sx and sl are the next row's
  }
  if (arrive_last(finish_counter(0), gridDim.x)) cross_entropy_total(row_loss, N, count, mean, loss);
}

// Dense operands (w of any strides) and results on one GPU, a head small enough (kHeadMax*), at least
// one row.
bool linear_cross_entropy_supported(const KernelCall& c) {
  const Tensor &x = c.in[0], &w = c.in[1];
  const int64_t N = x.size(0), C = x.size(1), K = w.size(1);
  bool dense = true;
  for (size_t i = 0; i < c.in.size(); ++i) dense = dense && (i == 1 || c.in[i].is_contiguous());
  for (const Tensor& t : c.out) dense = dense && t.is_contiguous();
  return dense && N > 0 && C <= kHeadMaxC && K <= kHeadMaxK && N * C * K <= kHeadMaxWork && w.dtype() != DType::f64;
}

void linear_cross_entropy_with_grad_kernel(const KernelCall& c) {
  const Tensor &x = c.in[0], &w = c.in[1], &bias = c.in[2], &target = c.in[3], &g = c.in[4];
  const Tensor &loss = c.out[0], &dlogits = c.out[1], &dx = c.out[2];
  REEL_CHECK(linear_cross_entropy_supported(c), "linear_cross_entropy_with_grad: no CUDA kernel for x ",
             shape_str(x.shape()), " and w ", shape_str(w.shape()), " (dense x, C <= ", kHeadMaxC, ", K <= ", kHeadMaxK,
             ", N C K <= ", kHeadMaxWork, ")");
  const int64_t N = x.size(0);
  cudaStream_t st = stream_of(x);
  Tensor ws = workspace(size_t(N) * sizeof(double), x.device());
  const unsigned grid = unsigned(std::min<int64_t>(N, int64_t(4) * multiprocessor_count(x.device().index)));
  visit_float(w.dtype(), "linear_cross_entropy_with_grad", [&]<typename D>() {
    auto launch = [&]<typename X>() {
      D* xt = c.out.size() > 3 ? static_cast<D*>(c.out[3].data_ptr()) : nullptr;
      launch_kernel(linear_cross_entropy_kernel<X, D>, grid, kHeadThreads, 0, st, in_ptr<X>(x), in_ptr<D>(w),
                    w.strides()[0], w.strides()[1], in_ptr<float>(bias), in_ptr<int64_t>(target),
                    static_cast<const float*>(g.data_ptr()), static_cast<double*>(ws.data_ptr()),
                    static_cast<float*>(loss.data_ptr()), static_cast<D*>(dlogits.data_ptr()),
                    static_cast<D*>(dx.data_ptr()), xt, N, int(x.size(1)), int(w.size(1)),
                    c.attrs.i("ignore_index", -100), c.attrs.i("reduction", 0) == 0);
      REEL_CUDA_LAUNCH_CHECK();
    };
    if constexpr (std::is_same_v<D, float>) {
      launch.template operator()<float>();
    } else if constexpr (!std::is_same_v<D, double>) {
      if (x.dtype() == DType::f32)
        launch.template operator()<float>();
      else
        launch.template operator()<D>();
    }
  });
}

}  // namespace

void register_cross_entropy_cuda_kernels() {
  constexpr DeviceType gpu = DeviceType::CUDA;
  register_kernel(gpu, OpKind::CrossEntropy, cross_entropy_kernel);
  register_kernel(gpu, OpKind::CrossEntropyBackward, cross_entropy_backward_kernel);
  register_kernel(gpu, OpKind::CrossEntropyWithGrad, cross_entropy_with_grad_kernel);
  register_kernel(gpu, OpKind::LinearCrossEntropyWithGrad, linear_cross_entropy_with_grad_kernel);
  register_supports(gpu, OpKind::LinearCrossEntropyWithGrad, linear_cross_entropy_supported);
}

}  // namespace cuda
}  // namespace reel
