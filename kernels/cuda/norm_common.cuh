// Pieces shared by the CUDA kernels of the norm family (norm.cu, batch_norm.cu, dropout.cu): warp and
// block sums, the float-dtype visitors (x's own dtype, or a 16-bit x read as f32), the statistics'
// 1/sqrt, and running a kernel into contiguous outputs (dispatch_out may hand us strided views).
//
// Sums are deterministic: the shuffle tree and the per-warp partials are combined in a fixed order,
// so the same inputs give the same bits on every run (no atomics anywhere in this family).
#pragma once
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_copy.h"
#include "kernels/dense_outputs.h"
#include "kernels/elementwise_math.h"

namespace reel::cuda::norm_detail {

constexpr unsigned kFullMask = 0xffffffffu;

// Sum over the 32 lanes of a warp. The xor butterfly gives every lane the same bits (each step adds
// the same two values in either order, and float addition is commutative).
template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
// Every thread of the block must call it: it synchronises.
template <typename A>
__device__ A block_sum(A v) {
  __shared__ A partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // readers of an earlier call are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? partial[lane] : A(0));
}

// rstd = 1 / sqrt(var + eps), IEEE-rounded division and square root (nvcc's defaults without
// --use_fast_math), as the CPU computes it.
__device__ __forceinline__ float inv_std(float var, float eps) { return 1.0f / sqrtf(var + eps); }
__device__ __forceinline__ double inv_std(double var, double eps) { return 1.0 / sqrt(var + eps); }

using cuda::visit_float;  // kernels/cuda/cuda_common.cuh

// Calls fn.template operator()<X, D>() with X the device type of x's dtype and D that of the outputs
// (the norm's compute type). A plain call has X = D. Group and batch norm also read a bf16/f16 x as
// f32 (attr dtype = f32, schema/norm.cpp): X = __half or __nv_bfloat16, D = float. The kernels load x
// with to_acc, which widens exactly, so they give the bits of x.to(f32) through the f32 kernels.
template <typename Fn>
void visit_norm_input(DType x, DType d, const char* op, Fn&& fn) {
  if (x == d) return visit_float(d, op, [&]<typename D>() { fn.template operator()<D, D>(); });
  if (d == DType::f32 && x == DType::f16) return fn.template operator()<__half, float>();
  if (d == DType::f32 && x == DType::bf16) return fn.template operator()<__nv_bfloat16, float>();
  throw Error(detail::cat(op, ": x of dtype ", dtype_name(x), " with outputs of dtype ", dtype_name(d),
                          " is not supported (x in the outputs' dtype, or bf16/f16 x with f32 outputs)"));
}

// Calls fn.template operator()<O>() with O the device type of a group or batch norm backward's dx: D's
// own, or bf16/f16 with attr dx_dtype (D = float then; the schema allows nothing else).
template <typename D, typename Fn>
auto visit_dx_type(DType dx, DType d, const char* op, Fn&& fn) {
  if (dx == d) return fn.template operator()<D>();
  if constexpr (std::is_same_v<D, float>) {
    if (dx == DType::bf16) return fn.template operator()<__nv_bfloat16>();
    if (dx == DType::f16) return fn.template operator()<__half>();
  }
  throw Error(detail::cat(op, ": dx of dtype ", dtype_name(dx), " with outputs of dtype ", dtype_name(d),
                          " is not supported"));
}

// Calls fn.template operator()<G>() with G the device type of a group or batch norm backward's
// incoming gradient: D's own, or a 16-bit x's X with D = float (read as its exact widening,
// schema/norm.cpp).
template <typename X, typename D, typename Fn>
void visit_grad_type(DType g, DType d, const char* op, Fn&& fn) {
  if (g == d) return fn.template operator()<D>();
  if constexpr (!std::is_same_v<X, D>) {
    constexpr DType x16 = std::is_same_v<X, __nv_bfloat16> ? DType::bf16 : DType::f16;
    if (g == x16) return fn.template operator()<X>();
  }
  throw Error(detail::cat(op, ": gradient of dtype ", dtype_name(g), " with outputs of dtype ", dtype_name(d),
                          " is not supported"));
}

// Calls fn.template operator()<Y16>() with Y16 the device type of a group or batch norm's 16-bit copy
// of y (attr cast_dtype, D = float), or D itself when there is none (the kernels get a null pointer).
template <typename D, typename Fn>
void visit_copy_type(const Tensor& y16, const char* op, Fn&& fn) {
  if (!y16.defined()) return fn.template operator()<D>();
  if constexpr (std::is_same_v<D, float>) {
    if (y16.dtype() == DType::bf16) return fn.template operator()<__nv_bfloat16>();
    if (y16.dtype() == DType::f16) return fn.template operator()<__half>();
  }
  throw Error(detail::cat(op, ": a copy of y in ", dtype_name(y16.dtype()), " is not supported"));
}

// The gradient at a norm's output with a fused relu: relu_backward(g, y) = g where y > 0, else 0;
// g itself when y is null (no relu). g's value v, y's element iy.
template <typename A, typename D>
__device__ __forceinline__ A relu_grad(A v, const D* y, int64_t iy) {
  return y ? math::binary<OpKind::ReluBackward>(v, A(to_acc(y[iy]))) : v;
}

// relu_grad of element i of g, y at element i too.
template <typename A, typename G, typename D>
__device__ __forceinline__ A relu_grad_at(const G* g, const D* y, int64_t i) {
  return relu_grad(A(to_acc(g[i])), y, i);
}

// Where a group or batch norm's backward puts dw and db (D, (C)): stored, or with `accumulate` (attr
// accumulate: the compiler's write of a later micro-batch's dw, db into the parameters' gradients)
// added to what they hold as the add op adds a result of dtype D to them: the bits of storing them
// and then adding. dw null: the caller stores nothing (the sums are finished elsewhere).
template <typename D>
struct ParamGrads {
  D* dw = nullptr;
  D* db = nullptr;
  bool accumulate = false;
  template <typename A>
  __device__ void put(D* p, A v) const {
    const D r = from_acc<D>(v);
    *p = accumulate ? from_acc<D>(math::binary<OpKind::Add>(to_acc(*p), to_acc(r))) : r;
  }
  template <typename A>
  __device__ void store(int64_t c, A dw_c, A db_c) const {
    put(dw + c, dw_c);
    put(db + c, db_c);
  }
};

// Typed device pointers of a tensor; nullptr for an absent optional input.
template <typename D>
const D* in_ptr(const Tensor& t) {
  return t.defined() ? static_cast<const D*>(t.data_ptr()) : nullptr;
}
template <typename D>
D* out_ptr(const Tensor& t) {
  return static_cast<D*>(t.data_ptr());
}

// dw, db of a backward call (out[1], out[2]), added to with attr accumulate.
template <typename D>
ParamGrads<D> param_grads_of(const KernelCall& c) {
  return {out_ptr<D>(c.out[1]), out_ptr<D>(c.out[2]), c.attrs.b("accumulate", false)};
}

// Grid size for a grid-stride loop over `items` blocks' worth of work (at least 1).
inline unsigned grid_for(int64_t items) {
  return unsigned(std::min<int64_t>(std::max<int64_t>(items, 1), int64_t(1) << 20));
}

// kernels/dense_outputs.h with the device's strided copy (stream-ordered): kernels may then assume
// dense outputs.
inline void run_into_contiguous(const KernelCall& call, KernelFn kernel) {
  reel::run_into_contiguous(call, kernel, copy_on_device);
}

// A dense channels-last 4-D tensor that is not also (N, C, S)-contiguous (as when C or S is 1): an
// operand the group and batch norm kernels read or write where it lies.
inline bool is_channels_last_only(const Tensor& t) {
  return t.defined() && t.dim() == 4 && !t.is_contiguous() && t.is_contiguous(MemoryFormat::ChannelsLast);
}

// Shapes of x (N, C, *) as N, C and S = prod(*), for group and batch norm.
struct NCS {
  int64_t N, C, S;
};
inline NCS ncs_of(const Tensor& x) {
  int64_t S = 1;
  for (int64_t d = 2; d < x.dim(); ++d) S *= x.shape()[d];
  return {x.shape()[0], x.shape()[1], S};
}

}  // namespace reel::cuda::norm_detail
