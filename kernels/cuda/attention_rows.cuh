// The row kernels of attention (any head size; f32/f64 compute, and 16-bit compute at head sizes the
// tiled kernels do not take): a block per query row (forward, backward's dQ) or key row (backward's
// dK, dV), that row's scores in shared memory. Simple loops with the tiled kernels' rounding points.
// causal is a runtime flag (it only bounds the loops over partner rows); the mask is a template
// parameter, so the unmasked build's arithmetic is exactly what it was before masks existed.
#pragma once
#include "kernels/cuda/attention_tiles.cuh"

namespace reel::cuda::attention_detail {

// Maximum over the block (blockDim.x a multiple of 32); every thread gets it. Every thread must call it.
template <typename A>
__device__ A block_max(A v) {
  __shared__ A partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, o));
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : A(-INFINITY);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// x . y over hd values, both rounded to C, summed by the warp (every lane gets it).
template <typename C, typename A, typename X, typename Z>
__device__ A warp_dot_rounded(const X* x, const Z* y, int hd) {
  A acc = 0;
  for (int c = threadIdx.x % 32; c < hd; c += 32) acc += round_c<C>(A(to_acc(x[c]))) * round_c<C>(A(to_acc(y[c])));
  return warp_sum(acc);
}

constexpr int kRowThreads = 128;

// Bytes allocated past a row kernel's scores. ptxas merges the guarded loads of an unrolled loop's
// last iterations into one wider shared load (three f32 scores: 12 bytes) that may reach up to 8
// bytes past the last score; the extra values are never used, but compute-sanitizer's memcheck
// reported each such load as out of bounds. The slack keeps every load inside the allocation.
constexpr size_t kRowSmemSlack = 16;

// Forward, one block per query row. grid (T, B H), shared memory T values of A. y or y16 may be null.
// Keys [0, t] (causal) or [0, T) are visible; with Masked, M is added to the scaled scores and a row
// whose keys are all -inf gets y = 0, lse = +inf (kernels/cpu/attention.cpp).
template <typename In, typename Q, typename C, typename A, bool Masked>
__global__ void attention_fwd_rows(const Q* qkv, In* y, C* y16, A* lse, int T, int H, int d, int hd, A scale,
                                   bool causal, DeviceMask<A> mask) {
  grid_dependency_wait();
  extern __shared__ __align__(128) unsigned char raw[];
  A* score = reinterpret_cast<A*>(raw);
  const int t = blockIdx.x, b = blockIdx.y / H, h = blockIdx.y % H, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int keys = causal ? t + 1 : T;  // visible keys [0, keys)
  const int64_t width = 3 * int64_t(d);
  const Q* base = qkv + int64_t(b) * T * width + h * hd;
  const auto m_row = mask.head(blockIdx.y, H);
  for (int s = warp; s < keys; s += warps) {
    const A dot = warp_dot_rounded<C, A>(base + int64_t(t) * width, base + int64_t(s) * width + d, hd);
    if (threadIdx.x % 32 == 0) {
      if constexpr (Masked) score[s] = dot * scale + m_row.at(t, s);
      else score[s] = dot * scale;
    }
  }
  __syncthreads();
  A mx = A(-INFINITY);
  for (int s = threadIdx.x; s < keys; s += blockDim.x) mx = max(mx, score[s]);
  mx = block_max(mx);
  const int64_t out0 = (int64_t(b) * T + t) * d + h * hd;
  if constexpr (Masked) {
    if (mx == A(-INFINITY)) {  // every visible key masked (the same for the whole block)
      for (int c = threadIdx.x; c < hd; c += blockDim.x) {
        if (y) y[out0 + c] = from_acc<In>(A(0));
        if (y16) y16[out0 + c] = from_acc<C>(0.0f);
      }
      if (threadIdx.x == 0) lse[int64_t(blockIdx.y) * T + t] = A(INFINITY);
      return;
    }
  }
  A part = 0;
  for (int s = threadIdx.x; s < keys; s += blockDim.x) {
    const A p = exp(score[s] - mx);
    score[s] = p;
    part += p;
  }
  const A l = block_sum(part);  // synchronises, so every p is in `score`
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    A acc = 0;
    for (int s = 0; s < keys; ++s) acc += round_c<C>(score[s]) * round_c<C>(A(to_acc(base[int64_t(s) * width + 2 * d + c])));
    const In v = from_acc<In>(acc / l);
    if (y) y[out0 + c] = v;
    if (y16) y16[out0 + c] = from_acc<C>(to_acc(v));
  }
  if (threadIdx.x == 0) lse[int64_t(blockIdx.y) * T + t] = mx + log(l);
}

// Backward, one block per row: z = 0 key row s (dk, dv), z = 1 query row t (dq).
// grid (T, B H, 2), shared memory 2 T values of A. A fully masked query row has lse = +inf, so its P
// and dS are exp(-inf) = 0.
template <typename In, typename Q, typename Y, typename C, typename A, bool Masked>
__global__ void attention_bwd_rows(const In* dy, const Q* qkv, const Y* y, const A* lse, In* dqkv, C* dqkv16, int T,
                                   int H, int d, int hd, A scale, bool causal, DeviceMask<A> mask) {
  grid_dependency_wait();
  extern __shared__ __align__(128) unsigned char raw[];
  A* pr = reinterpret_cast<A*>(raw);  // rounded P per partner row
  A* ds = pr + T;                     // rounded dS per partner row
  const int row = blockIdx.x, warp = threadIdx.x / 32, warps = blockDim.x / 32, lane = threadIdx.x % 32;
  const int64_t width = 3 * int64_t(d);
  const auto [base, g, yo, l, out, out16] = HeadOperands<In, Q, Y, C, A>(dy, qkv, y, lse, dqkv, dqkv16, T, H, d, hd);
  auto put = [&](int64_t at, A value) {
    const In v = from_acc<In>(value);
    if (out) out[at] = v;
    if (out16) out16[at] = from_acc<C>(to_acc(v));
  };
  // Partners: the queries t >= s of key row s, or the keys s <= t of query row t (causal); every row
  // of the other side otherwise.
  const bool keys = blockIdx.z == 0;
  const int first = keys && causal ? row : 0, last = keys || !causal ? T - 1 : row;
  const auto m_row = mask.head(blockIdx.y, H);
  for (int o = first + warp; o <= last; o += warps) {
    const int t = keys ? o : row, s = keys ? row : o;
    A D = 0;
    for (int c = lane; c < hd; c += 32) D += A(to_acc(g[int64_t(t) * d + c])) * A(to_acc(yo[int64_t(t) * d + c]));
    D = warp_sum(D);
    const A qk = warp_dot_rounded<C, A>(base + int64_t(t) * width, base + int64_t(s) * width + d, hd);
    const A dp = warp_dot_rounded<C, A>(g + int64_t(t) * d, base + int64_t(s) * width + 2 * d, hd);
    A x = qk * scale;
    if constexpr (Masked) x += m_row.at(t, s);
    const A p = exp(x - l[t]);
    if (lane == 0) pr[o] = round_c<C>(p), ds[o] = round_c<C>(p * (dp - D));
  }
  __syncthreads();
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    if (keys) {
      A dk = 0, dv = 0;
      for (int t = first; t <= last; ++t) {
        dk += ds[t] * round_c<C>(A(to_acc(base[int64_t(t) * width + c])));
        dv += pr[t] * round_c<C>(A(to_acc(g[int64_t(t) * d + c])));
      }
      put(int64_t(row) * width + d + c, scale * dk);
      put(int64_t(row) * width + 2 * d + c, dv);
    } else {
      A dq = 0;
      for (int s = first; s <= last; ++s) dq += ds[s] * round_c<C>(A(to_acc(base[int64_t(s) * width + d + c])));
      put(int64_t(row) * width + c, scale * dq);
    }
  }
}

}  // namespace reel::cuda::attention_detail
