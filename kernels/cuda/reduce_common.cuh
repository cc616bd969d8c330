// Pieces shared by the CUDA kernels of the reduce family (reduce.cu, softmax.cu, cross_entropy.cu):
// warp and block reductions over any combine operator, the dtype visitors and launch-size helpers.
//
// Reductions are deterministic: the xor-shuffle tree and the per-warp partials are combined in a
// fixed order, so the same inputs give the same bits on every run (no atomics in this family).
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_copy.h"

namespace reel::cuda::reduce_detail {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarp = 32;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for a grid-stride loop over `items` units of work (at least 1, at most 2^20).
inline unsigned grid_for(int64_t items) {
  return unsigned(std::min<int64_t>(std::max<int64_t>(items, 1), int64_t(1) << 20));
}

// A lane's value from lane ^ mask. Structs of two values (softmax's running max and sum) overload this.
template <typename T>
__device__ __forceinline__ T shfl_xor(T v, int mask) {
  return __shfl_xor_sync(kFullMask, v, mask);
}

// Op::combine over the 32 lanes of a warp; every lane gets the result. The xor butterfly gives every
// lane the same bits when combine is commutative (each step combines the same two values).
template <typename Op, typename T>
__device__ __forceinline__ T warp_reduce(T v) {
#pragma unroll
  for (int mask = kWarp / 2; mask > 0; mask >>= 1) v = Op::combine(v, shfl_xor(v, mask));
  return v;
}

// Op::combine over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets
// the result. Every thread of the block must call it: it synchronises.
template <typename Op, typename T>
__device__ T block_reduce(T v) {
  __shared__ T partial[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_reduce<Op>(v);
  __syncthreads();  // readers of an earlier call are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_reduce<Op>(lane < warps ? partial[lane] : Op::identity());
}

// Op::combine as a function object (a step for strided_fold below).
template <typename Op, typename T>
struct CombineFn {
  __device__ T operator()(T a, T b) const { return Op::combine(a, b); }
};
template <typename Op, typename T>
__device__ __forceinline__ CombineFn<Op, T> combine_fn() {
  return {};
}

// The fold of step(acc, load(i)) over i = first, first + stride, ... < end, for one thread. It keeps
// kFoldLanes independent accumulators (element k of each group of kFoldLanes goes to lane k), so that
// several loads are in flight and no accumulator waits on the previous step, then combines them in
// a fixed order with Op::combine. step must agree with Op (Op::combine of two folds = one fold).
constexpr int kFoldLanes = 4;

template <typename Op, typename T, typename Step, typename Load>
__device__ __forceinline__ T strided_fold(int64_t first, int64_t end, int64_t stride, Step step, Load load) {
  static_assert(kFoldLanes == 4, "the final combine below is written for 4 lanes");
  T acc[kFoldLanes];
#pragma unroll
  for (int k = 0; k < kFoldLanes; ++k) acc[k] = Op::identity();
  int64_t i = first;
  for (; i + (kFoldLanes - 1) * stride < end; i += kFoldLanes * stride) {
    decltype(load(i)) v[kFoldLanes];
#pragma unroll
    for (int k = 0; k < kFoldLanes; ++k) v[k] = load(i + k * stride);
#pragma unroll
    for (int k = 0; k < kFoldLanes; ++k) acc[k] = step(acc[k], v[k]);
  }
  for (; i < end; i += stride) acc[0] = step(acc[0], load(i));
  return Op::combine(Op::combine(acc[0], acc[1]), Op::combine(acc[2], acc[3]));
}

// Rows of kShortRow < R <= kWarpRow values (with inner == 1) get a warp each in reduce.cu.
constexpr int64_t kShortRow = 16;
constexpr int64_t kWarpRow = 1024;

// One row of R values folded by the warp that owns it (lane l folds elements l, l + 32, ..., then
// the lanes' folds are combined): every lane gets the result. What reduce.cu's warp-per-row kernel
// computes for each row, and what a fused kernel calls to give a reduction's bits (group norm's pool
// in norm.cu).
template <typename Op, typename A, typename Load>
__device__ __forceinline__ A warp_row_fold(int64_t R, Load load) {
  return warp_reduce<Op>(strided_fold<Op, A>(threadIdx.x % kWarp, R, kWarp, combine_fn<Op, A>(), load));
}

// The threads that share one row of a row-wise kernel: a warp (short rows; blockDim.x / 32 rows per
// block) or the whole block (long rows). Rows are visited in a grid-stride loop, so a team's loop
// condition is uniform across the team, as its reductions require.
template <bool kBlock>
struct RowTeam {
  __device__ static int rank() { return kBlock ? int(threadIdx.x) : int(threadIdx.x % kWarp); }
  __device__ static int size() { return kBlock ? int(blockDim.x) : kWarp; }
  __device__ static int64_t first_row() {
    return kBlock ? int64_t(blockIdx.x) : int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  }
  __device__ static int64_t row_stride() {
    return kBlock ? int64_t(gridDim.x) : int64_t(gridDim.x) * (blockDim.x / kWarp);
  }
  template <typename Op, typename T>
  __device__ static T reduce(T v) {
    if constexpr (kBlock) return block_reduce<Op>(v);
    else return warp_reduce<Op>(v);
  }
};

// Addition as a combine operator.
template <typename A>
struct AddOp {
  __device__ static A identity() { return A(0); }
  __device__ static A combine(A a, A b) { return a + b; }
};

// exp and log in the accumulation type (IEEE-accurate expf/logf; nvcc's defaults, no fast math).
__device__ __forceinline__ float exp_acc(float v) { return expf(v); }
__device__ __forceinline__ double exp_acc(double v) { return exp(v); }
__device__ __forceinline__ float log_acc(float v) { return logf(v); }
__device__ __forceinline__ double log_acc(double v) { return log(v); }

// ---- online softmax statistics ----
// One pass over a row keeps a running maximum m and s = sum exp(x - m), rescaling s when m grows;
// partial statistics of several threads merge with MaxSumOp. Special values give what the CPU's
// two-pass formula (m = max x, then s = sum exp(x - m) with exp(-inf) = 0) gives:
//   - an element -inf adds exactly 0 (it is skipped, which also avoids -inf - -inf = NaN);
//   - an element NaN makes s NaN;
//   - an infinite maximum (a +inf element: inf - inf; or every element -inf: -inf - -inf) makes s
//     NaN in finalize(), so every output of that row is NaN, as on the CPU.
template <typename A>
struct MaxSum {
  A m, s;
};

template <typename A>
__device__ __forceinline__ void push(MaxSum<A>& t, A v) {
  if (v == A(-INFINITY)) return;
  if (v > t.m) {
    t.s = t.s * exp_acc(t.m - v) + A(1);  // t.m = -inf: exp(-inf) = 0 (a NaN in s stays NaN)
    t.m = v;
  } else {
    t.s += exp_acc(v - t.m);  // NaN v (never > m): s becomes NaN
  }
}

// push as a step for strided_fold.
template <typename A>
struct PushFn {
  __device__ MaxSum<A> operator()(MaxSum<A> t, A v) const {
    push(t, v);
    return t;
  }
};

template <typename A>
struct MaxSumOp {
  __device__ static MaxSum<A> identity() { return {A(-INFINITY), A(0)}; }
  // s * exp(m_part - m); a part whose maximum is m (also both -inf or both +inf) keeps its s.
  __device__ static A rescale(MaxSum<A> t, A m) { return t.m == m ? t.s : t.s * exp_acc(t.m - m); }
  __device__ static MaxSum<A> combine(MaxSum<A> a, MaxSum<A> b) {
    const A m = a.m > b.m ? a.m : b.m;  // m is never NaN: a NaN never wins v > m in push
    return {m, rescale(a, m) + rescale(b, m)};
  }
};

template <typename A>
__device__ __forceinline__ MaxSum<A> shfl_xor(MaxSum<A> v, int mask) {
  return {shfl_xor(v.m, mask), shfl_xor(v.s, mask)};
}

// The row's statistics with an infinite maximum turned into s = NaN (see above).
template <typename A>
__device__ __forceinline__ MaxSum<A> finalize(MaxSum<A> t) {
  if (t.m == A(INFINITY) || t.m == A(-INFINITY)) t.s = A(NAN);
  return t;
}

using cuda::visit_float;  // kernels/cuda/cuda_common.cuh

// Typed device pointers (nullptr for an empty tensor, whose storage may be absent).
template <typename D>
const D* in_ptr(const Tensor& t) {
  return t.numel() ? static_cast<const D*>(t.data_ptr()) : nullptr;
}
template <typename D>
D* out_ptr(const Tensor& t) {
  return t.numel() ? static_cast<D*>(t.data_ptr()) : nullptr;
}

// A contiguous buffer to write an output into: the output itself, or (when dispatch_out gave a
// strided view) a temporary that commit() copies back on the device, in stream order.
struct DenseOut {
  Tensor target, buf;
  explicit DenseOut(const Tensor& out)
      : target(out), buf(out.is_contiguous() ? out : Tensor::empty(out.shape(), out.dtype(), out.device())) {}
  void commit() const {
    if (!buf.is_same(target)) copy_on_device(target, buf);
  }
};

}  // namespace reel::cuda::reduce_detail
