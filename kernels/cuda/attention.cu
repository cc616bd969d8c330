// CUDA kernels of fused causal self-attention (the math and the rounding points are in
// kernels/cpu/attention.cpp, the reference these kernels are tested against).
//
// Two implementations of the same op:
//
//  - Tiled tensor-core kernels (16-bit compute, head size 32, 64 or 128): FlashAttention-2's scheme with
//    WMMA fragments. A block of 4 warps owns a tile of 64 rows, each warp 16 of them, and walks the other
//    side's tiles of 64 up to the causal diagonal; nothing T x T is ever written to global memory.
//      forward      block = 64 queries; per key tile: S = Q K^T (f32), the online softmax rescales the
//                   running output O and normaliser l by exp(m_old - m_new), then O += P V. At the end
//                   y = O / l and lse = m + log l.
//      backward     one launch, two roles (blockIdx.z), so no atomics and the same bits on every run:
//                   z = 0: block = 64 keys, walks the query tiles t >= s:  dV += P^T dO, dK += dS^T Q
//                   z = 1: block = 64 queries, walks the key tiles s <= t: dQ += dS K
//                   each recomputes P = exp(scale q.k - lse) and dP = dO v, dS = P (dP - D), with
//                   D = dy . y per query row computed while its dO tile is loaded.
//    Tiles are read straight from qkv's columns (f32 or 16-bit) and rounded to the compute dtype on
//    the way into shared memory; y and dqkv are written in the merged-heads layout. Two builds of this
//    scheme:
//      head size 32, 64   mma.sync kernels (attention_*_mma): scores, P and dS stay in registers,
//                         32 columns of the walked tile at a time, fragments read with ldmatrix;
//                         37 KiB of shared memory (the four tiles). See "register-resident kernels".
//      head size 128      WMMA kernels (attention_*_tiled): scores and dP go from the accumulators
//                         to a per-warp f32 scratch tile, because the per-row softmax needs them by
//                         row and WMMA's fragment layout is opaque (and 16 x 128 accumulators per
//                         warp would not fit in registers). 70 KiB of shared memory per block.
//
//  - Row kernels (any head size, f32/f64 compute, and 16-bit compute at other head sizes): a block
//    per query row (forward, backward's dQ) or key row (backward's dK, dV), scores for that row in
//    shared memory. Simple loops, the same rounding points, O(T) shared memory per block.
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_registry.h"
#include "kernels/cuda/norm_common.cuh"

namespace reel {
namespace cuda {
namespace {

using norm_detail::block_sum;
using norm_detail::kFullMask;
using norm_detail::warp_sum;

// The shape an attention call works on.
struct AttentionGeometry {
  int B, T, H, d, hd;
  AttentionGeometry(const Tensor& qkv, const Attrs& a)
      : B(int(qkv.size(0))), T(int(qkv.size(1))), H(int(a.i("heads"))), d(int(qkv.size(2) / 3)), hd(d / H) {}
};

// v rounded to the compute dtype C and back to the accumulation type.
template <typename C, typename A>
__device__ __forceinline__ A round_c(A v) {
  return A(to_acc(from_acc<C>(v)));
}

// One (batch, head) block row's operands of the backward, from blockIdx.y = b H + h: the head's
// columns of qkv and dqkv (rows of 3d), of dy and y (rows of d), and its row of lse. dqkv or dqkv16
// may be null (that result is not asked for).
template <typename In, typename Q, typename Y, typename C, typename L>
struct HeadOperands {
  const Q* qkv;
  const In* dy;
  const Y* y;
  const L* lse;
  In* dqkv;
  C* dqkv16;
  __device__ HeadOperands(const In* dy_all, const Q* qkv_all, const Y* y_all, const L* lse_all, In* dqkv_all,
                          C* dqkv16_all, int T, int H, int d, int hd) {
    const int b = blockIdx.y / H, h = blockIdx.y % H;
    const int64_t wide = int64_t(b) * T * 3 * d + h * hd, narrow = int64_t(b) * T * d + h * hd;
    qkv = qkv_all + wide;
    dy = dy_all + narrow;
    y = y_all + narrow;
    lse = lse_all + int64_t(blockIdx.y) * T;
    dqkv = dqkv_all ? dqkv_all + wide : nullptr;
    dqkv16 = dqkv16_all ? dqkv16_all + wide : nullptr;
  }
};

// ====================================================================== tiled tensor-core kernels

namespace wm = nvcuda::wmma;

constexpr int kTile = 64;  // rows of a block's own tile, and of each tile it walks
constexpr int kWarps = 4;  // each warp owns 16 rows of the block's tile
constexpr int kThreads = kWarps * 32;

// Shared-memory strides (in elements). 16-bit tiles get 8 extra columns and f32 scratch 4, which keeps
// WMMA's 32-byte alignment and moves consecutive rows off the same banks.
template <int HD>
struct Strides {
  static constexpr int ld = HD + 8;  // a 64 x HD tile of Q, K, V or dO
};
template <int HD>
struct WmmaStrides : Strides<HD> {
  static constexpr int ldp = kTile + 8;                       // a warp's 16 x 64 tile of P or dS
  static constexpr int lds = (HD > kTile ? HD : kTile) + 4;   // a warp's 16 x max(64, HD) f32 scratch
};

// Dynamic shared memory: three 64 x HD tiles (Q, K, V), per warp a 16 x 64 tile of P or dS and a
// 16 x max(64, HD) f32 scratch tile, then a region the forward uses for the warps' running outputs O
// and the backward for the dO tile with lse and D per query row (the two never coexist).
template <typename C, int HD>
constexpr size_t tiled_smem_bytes() {
  using S = WmmaStrides<HD>;
  return sizeof(C) * (3 * kTile * S::ld + kWarps * 16 * S::ldp) + sizeof(float) * 2 * kWarps * 16 * S::lds;
}

template <typename C, int HD>
struct TiledSmem {
  C *q, *k, *v, *p;  // p: this warp's 16 x ldp tile
  float *s, *o;      // this warp's 16 x lds scratch and (forward) running output
  C* dout;           // backward: the 64 x HD dO tile, aliasing the O region
  float *lse, *D;    // backward: per row of the query tile, after dO
  __device__ explicit TiledSmem(unsigned char* raw, int warp) {
    using S = WmmaStrides<HD>;
    static_assert(kTile * S::ld * sizeof(C) + 2 * kTile * sizeof(float) <= kWarps * 16 * S::lds * sizeof(float),
                  "dO, lse and D must fit in the forward's O region");
    q = reinterpret_cast<C*>(raw);
    k = q + kTile * S::ld;
    v = k + kTile * S::ld;
    C* p0 = v + kTile * S::ld;
    p = p0 + warp * 16 * S::ldp;
    float* s0 = reinterpret_cast<float*>(p0 + kWarps * 16 * S::ldp);
    float* o0 = s0 + kWarps * 16 * S::lds;
    s = s0 + warp * 16 * S::lds;
    o = o0 + warp * 16 * S::lds;
    dout = reinterpret_cast<C*>(o0);
    lse = reinterpret_cast<float*>(dout + kTile * S::ld);
    D = lse + kTile;
  }
};

// Tiles move between global and shared memory four elements at a time: a thread's whole share of a
// tile is loaded into registers first (all loads in flight at once; a load-convert-store loop per
// element would wait out the memory latency once per row) and then rounded and stored.
template <typename In>
struct Vec4 {
  In v[4];
};
template <typename In>
__device__ __forceinline__ Vec4<In> load4(const In* p) {
  Vec4<In> out;
  if constexpr (sizeof(In) == 4) {
    const float4 f = *reinterpret_cast<const float4*>(p);  // 16-byte aligned: offsets are multiples of 4
    out.v[0] = f.x, out.v[1] = f.y, out.v[2] = f.z, out.v[3] = f.w;
  } else {
    *reinterpret_cast<uint2*>(out.v) = *reinterpret_cast<const uint2*>(p);
  }
  return out;
}
template <typename C, typename In>
__device__ __forceinline__ void store4_rounded(C* dst, const Vec4<In>& x) {
  Vec4<C> out;
#pragma unroll
  for (int i = 0; i < 4; ++i) out.v[i] = from_acc<C>(to_acc(x.v[i]));
  *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(out.v);  // 8-byte aligned
}

// How a tile of 64 rows x HD columns is shared out: thread i takes the 4-column chunks i, i + 128, ...
// in row-major order, so 16 (HD 64) consecutive threads read one row's contiguous bytes.
template <int HD>
struct TileChunks {
  static constexpr int per_row = HD / 4;
  static constexpr int per_thread = kTile * per_row / kThreads;
  static_assert(kTile * per_row % kThreads == 0, "a tile must split evenly over the block");
  __device__ static int row(int i) { return (int(threadIdx.x) + i * kThreads) / per_row; }
  __device__ static int col(int i) { return (int(threadIdx.x) + i * kThreads) % per_row * 4; }
};

// Rows [row0, row0 + 64) of a (B*T, width) tensor's columns [0, HD) from `src` (already offset to batch
// and column), rounded to C; rows past T are zero.
template <typename C, int HD, typename In>
__device__ void load_tile(C* __restrict__ dst, const In* __restrict__ src, int64_t width, int row0, int T) {
  using K = TileChunks<HD>;
  Vec4<In> x[K::per_thread];
#pragma unroll
  for (int i = 0; i < K::per_thread; ++i) {
    const int t = row0 + K::row(i);
    x[i] = t < T ? load4(src + int64_t(t) * width + K::col(i)) : Vec4<In>{};
  }
#pragma unroll
  for (int i = 0; i < K::per_thread; ++i) store4_rounded(dst + K::row(i) * Strides<HD>::ld + K::col(i), x[i]);
}

// The dO tile of query rows [row0, row0 + 64) rounded to C, with D = dy . y (unrounded) and lse per row.
// A row's chunks lie in per_row consecutive lanes (a power of two dividing 32), which sum D by shuffles.
// dout: the 64 x HD tile (stride Strides<HD>::ld); D_s, lse_s: 64 floats each.
template <typename C, int HD, typename In, typename Y>
__device__ void load_grad_tile(C* __restrict__ dout, float* __restrict__ D_s, float* __restrict__ lse_s,
                               const In* __restrict__ dy, const Y* __restrict__ y, const float* __restrict__ lse,
                               int64_t d, int row0, int T) {
  using K = TileChunks<HD>;
  static_assert(K::per_row <= 32 && 32 % K::per_row == 0, "a row's chunks must lie within one warp");
  Vec4<In> g[K::per_thread];
  Vec4<Y> yv[K::per_thread];
#pragma unroll
  for (int i = 0; i < K::per_thread; ++i) {
    const int t = row0 + K::row(i);
    const int64_t at = int64_t(t) * d + K::col(i);
    g[i] = t < T ? load4(dy + at) : Vec4<In>{};
    yv[i] = t < T ? load4(y + at) : Vec4<Y>{};
  }
#pragma unroll
  for (int i = 0; i < K::per_thread; ++i) {
    const int r = K::row(i);
    store4_rounded(dout + r * Strides<HD>::ld + K::col(i), g[i]);
    float dot = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) dot += to_acc(g[i].v[e]) * to_acc(yv[i].v[e]);
#pragma unroll
    for (int o = K::per_row / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(kFullMask, dot, o);
    if (threadIdx.x % K::per_row == 0) {
      D_s[r] = dot;
      lse_s[r] = row0 + r < T ? lse[row0 + r] : 0.0f;
    }
  }
}

template <typename C>
using ARow = wm::fragment<wm::matrix_a, 16, 16, 16, C, wm::row_major>;
template <typename C>
using BRow = wm::fragment<wm::matrix_b, 16, 16, 16, C, wm::row_major>;
template <typename C>
using BCol = wm::fragment<wm::matrix_b, 16, 16, 16, C, wm::col_major>;
using Acc16 = wm::fragment<wm::accumulator, 16, 16, 16, float>;

// out (16 x 64, f32, stride lds) = A (16 x HD, row-major, stride ld) * B^T, B (64 x HD, row-major):
// a warp's rows against the 64 rows of a walked tile.
template <typename C, int HD>
__device__ void rows_times_tile_t(float* out, const C* a, const C* b) {
  using S = WmmaStrides<HD>;
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    Acc16 acc;
    wm::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      ARow<C> fa;
      BCol<C> fb;
      wm::load_matrix_sync(fa, a + kk * 16, S::ld);
      wm::load_matrix_sync(fb, b + n * 16 * S::ld + kk * 16, S::ld);
      wm::mma_sync(acc, fa, fb, acc);
    }
    wm::store_matrix_sync(out + n * 16, acc, S::lds, wm::mem_row_major);
  }
}

// acc[n] (16 x HD as HD/16 fragments) += P (16 x 64, stride ldp) * B (64 x HD, row-major, stride ld).
template <typename C, int HD>
__device__ void accumulate_p_times_tile(Acc16 (&acc)[HD / 16], const C* p, const C* b) {
  using S = WmmaStrides<HD>;
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    ARow<C> fa;
    wm::load_matrix_sync(fa, p + kk * 16, S::ldp);
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) {
      BRow<C> fb;
      wm::load_matrix_sync(fb, b + kk * 16 * S::ld + n * 16, S::ld);
      wm::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Writes a warp's 16 x HD accumulators times `scale` to rows [row0, row0 + 16) of dst (stride `width`),
// through the warp's f32 scratch so that the global stores go row by row; and, when dst16 is given,
// the same values rounded to C into dst16 (the compiler's fusion of autocast's cast).
template <typename C, int HD, typename Out>
__device__ void store_rows(Acc16 (&acc)[HD / 16], float* scratch, Out* dst, C* dst16, int64_t width, int row0, int T,
                           float scale) {
  using S = WmmaStrides<HD>;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) wm::store_matrix_sync(scratch + n * 16, acc[n], S::lds, wm::mem_row_major);
  __syncwarp();
  for (int r = 0; r < 16; ++r) {
    const int t = row0 + r;
    if (t >= T) break;
    for (int c = lane; c < HD; c += 32) {
      const Out v = from_acc<Out>(scale * scratch[r * S::lds + c]);
      if (dst) dst[int64_t(t) * width + c] = v;
      if (dst16) dst16[int64_t(t) * width + c] = from_acc<C>(to_acc(v));
    }
  }
  __syncwarp();
}

// Forward. grid (ceil(T / 64), B H); qkv (B, T, 3d), y (B, T, d), lse (B, H, T). y or y16 may be null.
template <typename In, typename Q, typename C, int HD>
__global__ void __launch_bounds__(kThreads) attention_fwd_tiled(const Q* __restrict__ qkv, In* __restrict__ y,
                                                               C* __restrict__ y16, float* __restrict__ lse, int T,
                                                               int H, int d, float scale) {
  using S = WmmaStrides<HD>;
  extern __shared__ __align__(128) unsigned char raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TiledSmem<C, HD> sm(raw, warp);
  const int qt = blockIdx.x, b = blockIdx.y / H, h = blockIdx.y % H, q0 = qt * kTile;
  const int64_t width = 3 * int64_t(d);
  const Q* base = qkv + int64_t(b) * T * width + h * HD;
  load_tile<C, HD>(sm.q, base, width, q0, T);
  for (int i = lane; i < 16 * S::lds; i += 32) sm.o[i] = 0.0f;
  // This lane's share of the softmax: row r of the warp's 16, columns c = 2 j + half (interleaved, so
  // the two lanes of a row hit different banks).
  const int r = lane / 2, half = lane % 2, t = q0 + warp * 16 + r;
  float m = -INFINITY, l = 0.0f;
  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();  // the previous K, V tiles are consumed
    load_tile<C, HD>(sm.k, base + d, width, kt * kTile, T);
    load_tile<C, HD>(sm.v, base + 2 * d, width, kt * kTile, T);
    __syncthreads();
    rows_times_tile_t<C, HD>(sm.s, sm.q + warp * 16 * S::ld, sm.k);  // S (16 x 64)
    __syncwarp();
    float x[kTile / 2], mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTile / 2; ++j) {
      const int c = 2 * j + half, s = kt * kTile + c;
      x[j] = (s <= t && s < T) ? sm.s[r * S::lds + c] * scale : -INFINITY;
      mx = fmaxf(mx, x[j]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
    const float m_new = fmaxf(m, mx);  // finite: key 0 is in every row's first tile
    const float alpha = expf(m - m_new);
    float psum = 0.0f;
#pragma unroll
    for (int j = 0; j < kTile / 2; ++j) {
      const float p = expf(x[j] - m_new);
      psum += p;
      sm.p[r * S::ldp + 2 * j + half] = from_acc<C>(p);
    }
    l = l * alpha + psum + __shfl_xor_sync(kFullMask, psum, 1);
    m = m_new;
    for (int c = half; c < HD; c += 2) sm.o[r * S::lds + c] *= alpha;
    __syncwarp();
    Acc16 acc[HD / 16];
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) wm::load_matrix_sync(acc[n], sm.o + n * 16, S::lds, wm::mem_row_major);
    accumulate_p_times_tile<C, HD>(acc, sm.p, sm.v);  // O += P V
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) wm::store_matrix_sync(sm.o + n * 16, acc[n], S::lds, wm::mem_row_major);
    __syncwarp();
  }
  const float inv_l = 1.0f / l;
  for (int c = half; c < HD; c += 2) sm.o[r * S::lds + c] *= inv_l;
  if (half == 0 && t < T) lse[int64_t(blockIdx.y) * T + t] = m + logf(l);
  __syncwarp();
  const int64_t at = int64_t(b) * T * d + h * HD;
  for (int rr = 0; rr < 16; ++rr) {
    const int tt = q0 + warp * 16 + rr;
    if (tt >= T) break;
    for (int c = lane; c < HD; c += 32) {
      const In v = from_acc<In>(sm.o[rr * S::lds + c]);
      if (y) y[at + int64_t(tt) * d + c] = v;
      if (y16) y16[at + int64_t(tt) * d + c] = from_acc<C>(to_acc(v));
    }
  }
}

// Backward. grid (ceil(T / 64), B H, 2); dqkv (B, T, 3d). See the file's opening comment for the roles.
template <typename In, typename Q, typename Y, typename C, int HD>
__global__ void __launch_bounds__(kThreads, HD <= 64 ? 3 : 1) attention_bwd_tiled(const In* __restrict__ dy, const Q* __restrict__ qkv,
                                                               const Y* __restrict__ y, const float* __restrict__ lse,
                                                               In* __restrict__ dqkv, C* __restrict__ dqkv16, int T,
                                                               int H, int d, float scale) {
  using S = WmmaStrides<HD>;
  extern __shared__ __align__(128) unsigned char raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TiledSmem<C, HD> sm(raw, warp);
  const int tile = blockIdx.x, tiles = (T + kTile - 1) / kTile;
  const int64_t width = 3 * int64_t(d);
  const auto [base, dy_b, y_b, lse_bh, out, out16] = HeadOperands<In, Q, Y, C, float>(dy, qkv, y, lse, dqkv, dqkv16, T, H, d, HD);
  // This lane's share of a 16 x 64 tile: row r of the warp's 16, columns c = 2 j + half.
  const int r = lane % 16, half = lane / 16;
  float p[kTile / 2];
  Acc16 acc_a[HD / 16], acc_b[HD / 16];  // dK, dV (keys role) or dQ (queries role)
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) {
    wm::fill_fragment(acc_a[n], 0.0f);
    wm::fill_fragment(acc_b[n], 0.0f);
  }

  if (blockIdx.z == 0) {  // ---- keys role: this block's keys s in [k0, k0 + 64)
    const int k0 = tile * kTile, s = k0 + warp * 16 + r;
    load_tile<C, HD>(sm.k, base + d, width, k0, T);
    load_tile<C, HD>(sm.v, base + 2 * d, width, k0, T);
    for (int qt = tile; qt < tiles; ++qt) {
      const int q0 = qt * kTile;
      __syncthreads();  // the previous query tile is consumed
      load_tile<C, HD>(sm.q, base, width, q0, T);
      load_grad_tile<C, HD>(sm.dout, sm.D, sm.lse, dy_b, y_b, lse_bh, d, q0, T);
      __syncthreads();
      rows_times_tile_t<C, HD>(sm.s, sm.k + warp * 16 * S::ld, sm.q);  // S^T (16 keys x 64 queries)
      __syncwarp();
#pragma unroll
      for (int j = 0; j < kTile / 2; ++j) {
        const int c = 2 * j + half, t = q0 + c;
        p[j] = (s <= t && t < T) ? expf(sm.s[r * S::lds + c] * scale - sm.lse[c]) : 0.0f;
        sm.p[r * S::ldp + c] = from_acc<C>(p[j]);
      }
      __syncwarp();
      accumulate_p_times_tile<C, HD>(acc_b, sm.p, sm.dout);            // dV += P^T dO
      rows_times_tile_t<C, HD>(sm.s, sm.v + warp * 16 * S::ld, sm.dout);  // dP^T (16 keys x 64 queries)
      __syncwarp();
#pragma unroll
      for (int j = 0; j < kTile / 2; ++j) {
        const int c = 2 * j + half;
        sm.p[r * S::ldp + c] = from_acc<C>(p[j] * (sm.s[r * S::lds + c] - sm.D[c]));
      }
      __syncwarp();
      accumulate_p_times_tile<C, HD>(acc_a, sm.p, sm.q);  // dK += dS^T Q
    }
    store_rows<C, HD>(acc_a, sm.s, out ? out + d : nullptr, out16 ? out16 + d : nullptr, width, k0 + warp * 16, T, scale);
    store_rows<C, HD>(acc_b, sm.s, out ? out + 2 * d : nullptr, out16 ? out16 + 2 * d : nullptr, width, k0 + warp * 16, T, 1.0f);
  } else {  // ---- queries role: this block's queries t in [q0, q0 + 64)
    const int q0 = tile * kTile, t = q0 + warp * 16 + r;
    load_tile<C, HD>(sm.q, base, width, q0, T);
    load_grad_tile<C, HD>(sm.dout, sm.D, sm.lse, dy_b, y_b, lse_bh, d, q0, T);
    for (int kt = 0; kt <= tile; ++kt) {
      const int k0 = kt * kTile;
      __syncthreads();  // the previous key tile is consumed (and the query tile is loaded)
      load_tile<C, HD>(sm.k, base + d, width, k0, T);
      load_tile<C, HD>(sm.v, base + 2 * d, width, k0, T);
      __syncthreads();
      const float row_lse = sm.lse[warp * 16 + r], row_D = sm.D[warp * 16 + r];
      rows_times_tile_t<C, HD>(sm.s, sm.q + warp * 16 * S::ld, sm.k);  // S (16 queries x 64 keys)
      __syncwarp();
#pragma unroll
      for (int j = 0; j < kTile / 2; ++j) {
        const int c = 2 * j + half, s = k0 + c;
        p[j] = (s <= t && t < T) ? expf(sm.s[r * S::lds + c] * scale - row_lse) : 0.0f;
      }
      __syncwarp();
      rows_times_tile_t<C, HD>(sm.s, sm.dout + warp * 16 * S::ld, sm.v);  // dP (16 queries x 64 keys)
      __syncwarp();
#pragma unroll
      for (int j = 0; j < kTile / 2; ++j) {
        const int c = 2 * j + half;
        sm.p[r * S::ldp + c] = from_acc<C>(p[j] * (sm.s[r * S::lds + c] - row_D));
      }
      __syncwarp();
      accumulate_p_times_tile<C, HD>(acc_a, sm.p, sm.k);  // dQ += dS K
    }
    store_rows<C, HD>(acc_a, sm.s, out, out16, width, q0 + warp * 16, T, scale);
  }
}

// ====================================================================== register-resident kernels
//
// The same two ops on mma.sync (m16n8k16, f32 accumulation) with the scores, P and dS kept in
// registers, as FlashAttention-2 does: the accumulator layout of two adjacent 16 x 8 score tiles is
// exactly the A-operand layout of a 16 x 16 slice, so P (rounded to C) feeds the next product
// without a trip through shared memory. Shared memory holds only the 64 x HD tiles, read into
// fragments with ldmatrix. Same tiles, roles and rounding points as the WMMA kernels above
// (P and dS rounded to C, D = dy . y from the unrounded values, no atomics); head sizes 32 and 64,
// where the accumulators fit in registers.
//
// Fragments of lane l (g = l / 4, t = l % 4): A (16 x 16) a0 = (g, 2t..2t+1), a1 = (g + 8, 2t..),
// a2 = (g, 2t + 8..), a3 = (g + 8, 2t + 8..); B (16 x 8) b0 = (k 2t..2t+1, n g), b1 = (k 2t + 8.., n g);
// C (16 x 8) c0, c1 = (g, 2t..2t+1), c2, c3 = (g + 8, 2t..2t+1).

namespace mma {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 matrices of 16-bit values; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d += a b (16 x 16 by 16 x 8) in f32.
template <typename C>
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (std::is_same_v<C, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two values rounded to C in one register, x in the low half (the lower column).
template <typename C>
__device__ __forceinline__ unsigned pack(float x, float y) {
  if constexpr (std::is_same_v<C, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<unsigned*>(&v);
  } else {
    __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<unsigned*>(&v);
  }
}

// The A fragments of rows [r0, r0 + 16) of a row-major tile (stride ld), all HD columns.
template <int HD, typename C>
__device__ __forceinline__ void load_a(unsigned (&a)[HD / 16][4], const C* tile, int r0, int ld) {
  const int l = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) ldmatrix_x4(a[kk], tile + (r0 + l % 16) * ld + kk * 16 + (l / 16) * 8);
}

// The walked tile's 64 rows are taken kPart at a time (a part of the scores in registers, not all 64
// columns: fewer registers, more resident warps).
constexpr int kPart = 32;
constexpr int kPartTiles = kPart / 8;  // 16 x 8 accumulator tiles of a part

// acc (16 x kPart) = A (16 x HD, fragments) times B^T, B rows [0, kPart) of a row-major tile (stride
// ld, HD columns): a warp's rows against kPart rows of a walked tile (ldmatrix without transpose).
template <int HD, typename C>
__device__ __forceinline__ void rows_times_tile_t(float (&acc)[kPartTiles][4], const unsigned (&a)[HD / 16][4],
                                                  const C* b, int ld) {
  const int l = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < kPartTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
    for (int n = 0; n < kPartTiles; n += 2) {
      unsigned r[4];
      ldmatrix_x4(r, b + (n * 8 + l % 8 + (l / 16) * 8) * ld + kk * 16 + ((l / 8) % 2) * 8);
      mma16816<C>(acc[n], a[kk], r[0], r[1]);
      mma16816<C>(acc[n + 1], a[kk], r[2], r[3]);
    }
  }
}

// acc (16 x HD: HD / 8 tiles) += P (16 x kPart as A fragments) times B, B rows [0, kPart) of a
// row-major tile (stride ld, HD columns), whose rows are P's columns (ldmatrix with transpose).
template <int HD, typename C>
__device__ __forceinline__ void accumulate_p_times_tile(float (&acc)[HD / 8][4], const unsigned (&p)[kPart / 16][4],
                                                        const C* b, int ld) {
  const int l = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < kPart / 16; ++kk) {
#pragma unroll
    for (int n = 0; n < HD / 8; n += 2) {
      unsigned r[4];
      ldmatrix_x4_trans(r, b + (kk * 16 + l % 16) * ld + n * 8 + (l / 16) * 8);
      mma16816<C>(acc[n], p[kk], r[0], r[1]);
      mma16816<C>(acc[n + 1], p[kk], r[2], r[3]);
    }
  }
}

// Score tiles (16 x kPart, f32) rounded to C as the A fragments of the next product.
template <typename C>
__device__ __forceinline__ void to_a_fragments(unsigned (&a)[kPart / 16][4], const float (&s)[kPartTiles][4]) {
#pragma unroll
  for (int kk = 0; kk < kPart / 16; ++kk) {
    a[kk][0] = pack<C>(s[2 * kk][0], s[2 * kk][1]);
    a[kk][1] = pack<C>(s[2 * kk][2], s[2 * kk][3]);
    a[kk][2] = pack<C>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[kk][3] = pack<C>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// Writes a warp's 16 x HD accumulators times `scale` to rows [row0, row0 + 16) of dst (stride width)
// and, when given, rounded to C into dst16. Rows at or past T are not written.
template <int HD, typename C, typename Out>
__device__ __forceinline__ void store_rows(const float (&acc)[HD / 8][4], Out* dst, C* dst16, int64_t width, int row0,
                                           int T, float scale) {
  const int l = threadIdx.x % 32, g = l / 4, t = l % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + 8 * half;
    if (row >= T) continue;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      const int64_t at = int64_t(row) * width + n * 8 + 2 * t;
      const Out v0 = from_acc<Out>(scale * acc[n][2 * half]), v1 = from_acc<Out>(scale * acc[n][2 * half + 1]);
      if (dst) dst[at] = v0, dst[at + 1] = v1;
      if (dst16) dst16[at] = from_acc<C>(to_acc(v0)), dst16[at + 1] = from_acc<C>(to_acc(v1));
    }
  }
}

}  // namespace mma

// Each register-resident kernel comes in two builds: MinBlocks 1 leaves the compiler all the registers
// it wants (fastest per block, about two blocks per SM), and a bounded one (forward 4, backward 3 blocks
// per SM, a few bytes of spills) that keeps more warps resident. The bounded build wins once the grid
// is more than one wave of the unbounded one (gpt-small's 512 forward and 1024 backward blocks: forward
// 37.6 -> 34.2 us, backward 132.7 -> 114.4 us); below that (gpt-tiny) the unbounded one does.
template <typename Kernel>
bool more_than_one_wave(Kernel unbounded, size_t smem, dim3 grid, int device) {
  static std::mutex mutex;
  static std::map<const void*, int> per_sm;  // resident blocks per SM, by kernel
  int blocks = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    int& n = per_sm[reinterpret_cast<const void*>(unbounded)];
    if (n == 0) REEL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, unbounded, kThreads, smem));
    blocks = std::max(n, 1);
  }
  return int64_t(grid.x) * grid.y * grid.z > int64_t(blocks) * multiprocessor_count(device);
}

// Shared memory of the register-resident kernels: the 64 x HD tiles of Q, K, V and (backward) dO, then
// lse and D per query row of the tile.
template <typename C, int HD>
constexpr size_t mma_smem_bytes() {
  return sizeof(C) * 4 * kTile * Strides<HD>::ld + sizeof(float) * 2 * kTile;
}
template <typename C, int HD>
struct MmaSmem {
  C *q, *k, *v, *dout;
  float *lse, *D;
  __device__ explicit MmaSmem(unsigned char* raw) {
    constexpr int tile = kTile * Strides<HD>::ld;
    q = reinterpret_cast<C*>(raw);
    k = q + tile;
    v = k + tile;
    dout = v + tile;
    lse = reinterpret_cast<float*>(dout + tile);
    D = lse + kTile;
  }
};

// Forward. grid (ceil(T / 64), B H); qkv (B, T, 3d), y (B, T, d), lse (B, H, T). y or y16 may be null.
template <typename In, typename Q, typename C, int HD, int MinBlocks>
__global__ void __launch_bounds__(kThreads, MinBlocks) attention_fwd_mma(const Q* __restrict__ qkv, In* __restrict__ y,
                                                             C* __restrict__ y16, float* __restrict__ lse, int T,
                                                             int H, int d, float scale) {
  constexpr int ld = Strides<HD>::ld;
  extern __shared__ __align__(128) unsigned char raw[];
  const MmaSmem<C, HD> sm(raw);
  C *sq = sm.q, *sk = sm.k, *sv = sm.v;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int qt = blockIdx.x, b = blockIdx.y / H, h = blockIdx.y % H, q0 = qt * kTile;
  const int64_t width = 3 * int64_t(d);
  const Q* base = qkv + int64_t(b) * T * width + h * HD;
  load_tile<C, HD>(sq, base, width, q0, T);
  __syncthreads();
  unsigned qa[HD / 16][4];
  mma::load_a<HD>(qa, sq, warp * 16, ld);
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's part of the row sums
  float o[HD / 8][4] = {};
  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();  // the previous K, V tiles are consumed
    load_tile<C, HD>(sk, base + d, width, kt * kTile, T);
    load_tile<C, HD>(sv, base + 2 * d, width, kt * kTile, T);
    __syncthreads();
#pragma unroll
    for (int part = 0; part < kTile / mma::kPart; ++part) {  // keys kt * 64 + part * kPart + [0, kPart)
      const int key0 = kt * kTile + part * mma::kPart;
      float s[mma::kPartTiles][4];
      mma::rows_times_tile_t<HD>(s, qa, sk + part * mma::kPart * ld, ld);  // S (16 x kPart)
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < mma::kPartTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + n * 8 + 2 * t4 + (e & 1), r = e >> 1;
          s[n][e] = (key <= row[r] && key < T) ? s[n][e] * scale : -INFINITY;
          mx[r] = fmaxf(mx[r], s[n][e]);
        }
      }
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 2));
        // Finite: key 0 is in every row's first part; a later part wholly past a row's diagonal
        // leaves the running max as it was (alpha 1, P 0).
        const float m_new = fmaxf(m[r], mx[r]);
        alpha[r] = expf(m[r] - m_new);
        m[r] = m_new;
        l[r] *= alpha[r];
      }
#pragma unroll
      for (int n = 0; n < mma::kPartTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] = expf(s[n][e] - m[e >> 1]);
          l[e >> 1] += s[n][e];
        }
      }
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
      unsigned pa[mma::kPart / 16][4];
      mma::to_a_fragments<C>(pa, s);
      mma::accumulate_p_times_tile<HD>(o, pa, sv + part * mma::kPart * ld, ld);  // O += P V
    }
  }
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(kFullMask, l[r], 1);
    l[r] += __shfl_xor_sync(kFullMask, l[r], 2);
    inv[r] = 1.0f / l[r];
    if (t4 == 0 && row[r] < T) lse[int64_t(blockIdx.y) * T + row[r]] = m[r] + logf(l[r]);
  }
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] *= inv[0], o[n][1] *= inv[0], o[n][2] *= inv[1], o[n][3] *= inv[1];
  const int64_t at = int64_t(b) * T * d + h * HD;
  mma::store_rows<HD>(o, y ? y + at : nullptr, y16 ? y16 + at : nullptr, d, q0 + warp * 16, T, 1.0f);
}

// Backward. grid (ceil(T / 64), B H, 2); dqkv (B, T, 3d). The roles of the WMMA kernel: z = 0 a block
// of 64 keys walks the query tiles t >= s (dK, dV), z = 1 a block of 64 queries the key tiles s <= t (dQ).
template <typename In, typename Q, typename Y, typename C, int HD, int MinBlocks>
__global__ void __launch_bounds__(kThreads, MinBlocks) attention_bwd_mma(const In* __restrict__ dy, const Q* __restrict__ qkv,
                                                             const Y* __restrict__ y, const float* __restrict__ lse,
                                                             In* __restrict__ dqkv, C* __restrict__ dqkv16, int T,
                                                             int H, int d, float scale) {
  constexpr int ld = Strides<HD>::ld;
  extern __shared__ __align__(128) unsigned char raw[];
  const MmaSmem<C, HD> sm(raw);
  C *sq = sm.q, *sk = sm.k, *sv = sm.v, *sdo = sm.dout;
  float *slse = sm.lse, *sD = sm.D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int tile = blockIdx.x, tiles = (T + kTile - 1) / kTile;
  const int64_t width = 3 * int64_t(d);
  const auto [base, dy_b, y_b, lse_bh, out, out16] = HeadOperands<In, Q, Y, C, float>(dy, qkv, y, lse, dqkv, dqkv16, T, H, d, HD);
  float s[mma::kPartTiles][4], dp[mma::kPartTiles][4];
  unsigned pa[mma::kPart / 16][4];

  if (blockIdx.z == 0) {  // ---- keys role: this block's keys [k0, k0 + 64), the warp's 16 of them
    const int k0 = tile * kTile, key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
    load_tile<C, HD>(sk, base + d, width, k0, T);
    load_tile<C, HD>(sv, base + 2 * d, width, k0, T);
    float dk[HD / 8][4] = {}, dv[HD / 8][4] = {};
    unsigned a[HD / 16][4];  // the warp's K, then V rows as A fragments, reloaded per tile (fewer registers)
    for (int qt = tile; qt < tiles; ++qt) {
      const int q0 = qt * kTile;
      __syncthreads();  // the previous query tile is consumed
      load_tile<C, HD>(sq, base, width, q0, T);
      load_grad_tile<C, HD>(sdo, sD, slse, dy_b, y_b, lse_bh, d, q0, T);
      __syncthreads();
#pragma unroll
      for (int part = 0; part < kTile / mma::kPart; ++part) {  // queries q0 + part * kPart + [0, kPart)
        const int c0 = part * mma::kPart;
        mma::load_a<HD>(a, sk, warp * 16, ld);
        mma::rows_times_tile_t<HD>(s, a, sq + c0 * ld, ld);  // S^T (16 keys x kPart queries)
#pragma unroll
        for (int n = 0; n < mma::kPartTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = c0 + n * 8 + 2 * t4 + (e & 1), query = q0 + c;
            s[n][e] = (key[e >> 1] <= query && query < T) ? expf(s[n][e] * scale - slse[c]) : 0.0f;
          }
        }
        mma::to_a_fragments<C>(pa, s);
        mma::accumulate_p_times_tile<HD>(dv, pa, sdo + c0 * ld, ld);  // dV += P^T dO
        mma::load_a<HD>(a, sv, warp * 16, ld);
        mma::rows_times_tile_t<HD>(dp, a, sdo + c0 * ld, ld);  // dP^T (16 keys x kPart queries)
#pragma unroll
        for (int n = 0; n < mma::kPartTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] *= dp[n][e] - sD[c0 + n * 8 + 2 * t4 + (e & 1)];
        }
        mma::to_a_fragments<C>(pa, s);
        mma::accumulate_p_times_tile<HD>(dk, pa, sq + c0 * ld, ld);  // dK += dS^T Q
      }
    }
    mma::store_rows<HD>(dk, out ? out + d : nullptr, out16 ? out16 + d : nullptr, width, k0 + warp * 16, T, scale);
    mma::store_rows<HD>(dv, out ? out + 2 * d : nullptr, out16 ? out16 + 2 * d : nullptr, width, k0 + warp * 16, T, 1.0f);
  } else {  // ---- queries role: the block's queries [q0, q0 + 64) (the longest walks first), the warp's 16
    const int qtile = tiles - 1 - tile;
    const int q0 = qtile * kTile, r0 = warp * 16, query[2] = {q0 + r0 + g, q0 + r0 + g + 8};
    load_tile<C, HD>(sq, base, width, q0, T);
    load_grad_tile<C, HD>(sdo, sD, slse, dy_b, y_b, lse_bh, d, q0, T);
    __syncthreads();
    unsigned qa[HD / 16][4], doa[HD / 16][4];
    mma::load_a<HD>(qa, sq, r0, ld);
    mma::load_a<HD>(doa, sdo, r0, ld);
    const float row_lse[2] = {slse[r0 + g], slse[r0 + g + 8]}, row_D[2] = {sD[r0 + g], sD[r0 + g + 8]};
    float dq[HD / 8][4] = {};
    for (int kt = 0; kt <= qtile; ++kt) {
      const int k0 = kt * kTile;
      __syncthreads();  // the previous key tile is consumed
      load_tile<C, HD>(sk, base + d, width, k0, T);
      load_tile<C, HD>(sv, base + 2 * d, width, k0, T);
      __syncthreads();
#pragma unroll
      for (int part = 0; part < kTile / mma::kPart; ++part) {  // keys k0 + part * kPart + [0, kPart)
        const int c0 = part * mma::kPart;
        mma::rows_times_tile_t<HD>(s, qa, sk + c0 * ld, ld);    // S (16 queries x kPart keys)
        mma::rows_times_tile_t<HD>(dp, doa, sv + c0 * ld, ld);  // dP (16 queries x kPart keys)
#pragma unroll
        for (int n = 0; n < mma::kPartTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1, k = k0 + c0 + n * 8 + 2 * t4 + (e & 1);
            const float p = (k <= query[r] && query[r] < T) ? expf(s[n][e] * scale - row_lse[r]) : 0.0f;
            s[n][e] = p * (dp[n][e] - row_D[r]);
          }
        }
        mma::to_a_fragments<C>(pa, s);
        mma::accumulate_p_times_tile<HD>(dq, pa, sk + c0 * ld, ld);  // dQ += dS K
      }
    }
    mma::store_rows<HD>(dq, out, out16, width, q0 + r0, T, scale);
  }
}

// ====================================================================== row kernels

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

// Forward, one block per query row. grid (T, B H), shared memory T values of A. y or y16 may be null.
template <typename In, typename Q, typename C, typename A>
__global__ void attention_fwd_rows(const Q* qkv, In* y, C* y16, A* lse, int T, int H, int d, int hd, A scale) {
  extern __shared__ __align__(128) unsigned char raw[];
  A* score = reinterpret_cast<A*>(raw);
  const int t = blockIdx.x, b = blockIdx.y / H, h = blockIdx.y % H, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t width = 3 * int64_t(d);
  const Q* base = qkv + int64_t(b) * T * width + h * hd;
  for (int s = warp; s <= t; s += warps) {
    const A dot = warp_dot_rounded<C, A>(base + int64_t(t) * width, base + int64_t(s) * width + d, hd);
    if (threadIdx.x % 32 == 0) score[s] = dot * scale;
  }
  __syncthreads();
  A mx = A(-INFINITY);
  for (int s = threadIdx.x; s <= t; s += blockDim.x) mx = max(mx, score[s]);
  mx = block_max(mx);
  A part = 0;
  for (int s = threadIdx.x; s <= t; s += blockDim.x) {
    const A p = exp(score[s] - mx);
    score[s] = p;
    part += p;
  }
  const A l = block_sum(part);  // synchronises, so every p is in `score`
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    A acc = 0;
    for (int s = 0; s <= t; ++s) acc += round_c<C>(score[s]) * round_c<C>(A(to_acc(base[int64_t(s) * width + 2 * d + c])));
    const In v = from_acc<In>(acc / l);
    if (y) y[(int64_t(b) * T + t) * d + h * hd + c] = v;
    if (y16) y16[(int64_t(b) * T + t) * d + h * hd + c] = from_acc<C>(to_acc(v));
  }
  if (threadIdx.x == 0) lse[int64_t(blockIdx.y) * T + t] = mx + log(l);
}

// Backward, one block per row: z = 0 key row s (dk, dv), z = 1 query row t (dq).
// grid (T, B H, 2), shared memory 2 T values of A.
template <typename In, typename Q, typename Y, typename C, typename A>
__global__ void attention_bwd_rows(const In* dy, const Q* qkv, const Y* y, const A* lse, In* dqkv, C* dqkv16, int T,
                                   int H, int d, int hd, A scale) {
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
  // Partners: the queries t >= s of key row s, or the keys s <= t of query row t.
  const bool keys = blockIdx.z == 0;
  const int first = keys ? row : 0, last = keys ? T - 1 : row;
  for (int o = first + warp; o <= last; o += warps) {
    const int t = keys ? o : row, s = keys ? row : o;
    A D = 0;
    for (int c = lane; c < hd; c += 32) D += A(to_acc(g[int64_t(t) * d + c])) * A(to_acc(yo[int64_t(t) * d + c]));
    D = warp_sum(D);
    const A qk = warp_dot_rounded<C, A>(base + int64_t(t) * width, base + int64_t(s) * width + d, hd);
    const A dp = warp_dot_rounded<C, A>(g + int64_t(t) * d, base + int64_t(s) * width + 2 * d, hd);
    const A p = exp(qk * scale - l[t]);
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

// ====================================================================== launch

// Calls fn.template operator()<C>() with C the device type of the compute dtype: In itself, or a 16-bit
// type (only for f32/f16/bf16 In, as the schema allows).
template <typename In, typename Fn>
void visit_compute(DType compute, Fn&& fn) {
  if constexpr (std::is_same_v<In, double>) {
    fn.template operator()<double>();
  } else {
    if (compute == DType::bf16) fn.template operator()<__nv_bfloat16>();
    else if (compute == DType::f16) fn.template operator()<__half>();
    else fn.template operator()<In>();
  }
}

template <typename C>
constexpr bool kSixteenBit = std::is_same_v<C, __half> || std::is_same_v<C, __nv_bfloat16>;

// Calls fn.template operator()<HD>() when the tiled kernels take head size hd; false otherwise.
template <typename Fn>
bool visit_tiled_head(int hd, Fn&& fn) {
  switch (hd) {
    case 32: fn.template operator()<32>(); return true;
    case 64: fn.template operator()<64>(); return true;
    case 128: fn.template operator()<128>(); return true;
    default: return false;
  }
}

// Opts a kernel into its dynamic shared memory above the 48 KiB default, once per instantiation.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  REEL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// The row kernels keep a row's scores in shared memory: T values (two rows' worth in the backward).
constexpr size_t kMaxRowSmemBytes = 227 * 1024;  // an sm_90 block's opt-in limit
void check_row_smem(size_t bytes, int T, const char* op) {
  REEL_CHECK(bytes <= kMaxRowSmemBytes, op, ": a sequence of ", T, " positions needs ", bytes,
             " bytes of shared memory per row in the CUDA row kernels (at most ", kMaxRowSmemBytes,
             "); the tiled kernels (16-bit compute, head size 32, 64 or 128) take any length");
}

// An optional 16-bit copy of an output: its device pointer as C*, or null; it must be of the compute dtype.
template <typename C>
C* copy16_ptr(const Tensor& t, DType compute, const Shape& shape, const char* op) {
  if (!t.defined()) return nullptr;
  REEL_CHECK(t.dtype() == compute && t.shape() == shape && t.is_contiguous(), op, ": the 16-bit copy ",
             shape_str(t.shape()), " ", t.dtype(), " must be a contiguous ", shape_str(shape), " ",
             dtype_name(compute), " (the compute dtype)");
  return static_cast<C*>(t.data_ptr());
}
template <typename C>
C* copy16_ptr(const Tensor& t, DType compute, const AttentionGeometry& g, const char* op) {
  return copy16_ptr<C>(t, compute, Shape{g.B, g.T, g.d}, op);
}

// Calls fn.template operator()<T>() with T the device type operand t is stored in: In where t has the
// value dtype, or, for f32 values, C where t is in the 16-bit compute dtype (the compiler keeps qkv
// and the saved y in 16 bits when the kernels round them to C anyway: compile/fuse_attention_cast.h).
template <typename In, typename C, typename Fn>
void visit_operand(const Tensor& t, DType value, DType compute, const char* op, const char* what, Fn&& fn) {
  if (t.dtype() == value) return fn.template operator()<In>();
  if constexpr (std::is_same_v<In, float> && kSixteenBit<C>) {
    if (t.dtype() == compute) return fn.template operator()<C>();
  }
  throw Error(detail::cat(op, ": ", what, " ", shape_str(t.shape()), " is ", dtype_name(t.dtype()), "; expected ",
                          dtype_name(value), " (the value dtype)",
                          value == DType::f32 && compute != DType::f32 ? std::string(" or ") + dtype_name(compute) + " (the compute dtype)" : ""));
}

}  // namespace

void causal_attention_fwd_into(const Tensor& qkv_in, int64_t heads, DType compute, const Tensor& y, const Tensor& lse,
                               const Tensor& y16) {
  REEL_CHECK(y.defined() || y16.defined(), "causal_attention: neither y nor its 16-bit copy is asked for");
  Tensor qkv = contiguous_on_device(qkv_in);
  const AttentionGeometry g(qkv, Attrs().set("heads", heads));
  if (int64_t(g.B) * g.T * g.H == 0) return;
  cudaStream_t stream = stream_of(qkv);
  const DType value = y.defined() ? y.dtype() : DType::f32;  // the dtype y is computed in
  visit_float(value, "causal_attention", [&]<typename In>() {
    visit_compute<In>(compute, [&]<typename C>() {
      visit_operand<In, C>(qkv, value, compute, "causal_attention", "qkv", [&]<typename Q>() {
        using A = Acc<In>;
        In* py = y.defined() ? static_cast<In*>(y.data_ptr()) : nullptr;
        C* p16 = copy16_ptr<C>(y16, compute, g, "causal_attention");
        const Q* px = static_cast<const Q*>(qkv.data_ptr());
        bool tiled = false;
        if constexpr (kSixteenBit<C> && (std::is_same_v<In, float> || std::is_same_v<In, C>)) {
          tiled = visit_tiled_head(g.hd, [&]<int HD>() {
            const dim3 grid((g.T + kTile - 1) / kTile, g.B * g.H);
            float* pl = static_cast<float*>(lse.data_ptr());
            const float scale = 1.0f / std::sqrt(float(g.hd));
            if constexpr (HD <= 64) {  // the register-resident kernel
              auto kernel = attention_fwd_mma<In, Q, C, HD, 1>;
              if (more_than_one_wave(kernel, mma_smem_bytes<C, HD>(), grid, qkv.device().index))
                kernel = attention_fwd_mma<In, Q, C, HD, 4>;
              kernel<<<grid, kThreads, mma_smem_bytes<C, HD>(), stream>>>(px, py, p16, pl, g.T, g.H, g.d, scale);
            } else {
              constexpr size_t bytes = tiled_smem_bytes<C, HD>();
              static const bool ready = (allow_smem(attention_fwd_tiled<In, Q, C, HD>, bytes), true);
              (void)ready;
              attention_fwd_tiled<In, Q, C, HD><<<grid, kThreads, bytes, stream>>>(px, py, p16, pl, g.T, g.H, g.d,
                                                                                   scale);
            }
            REEL_CUDA_LAUNCH_CHECK();
          });
        }
        if (!tiled) {
          const size_t bytes = sizeof(A) * size_t(g.T);
          check_row_smem(bytes, g.T, "causal_attention");
          if (bytes > 48 * 1024) allow_smem(attention_fwd_rows<In, Q, C, A>, bytes);
          attention_fwd_rows<In, Q, C, A><<<dim3(g.T, g.B * g.H), kRowThreads, bytes, stream>>>(
              px, py, p16, static_cast<A*>(lse.data_ptr()), g.T, g.H, g.d, g.hd, A(1) / std::sqrt(A(g.hd)));
          REEL_CUDA_LAUNCH_CHECK();
        }
      });
    });
  });
}

void causal_attention_bwd_into(const Tensor& dy_in, const Tensor& qkv_in, const Tensor& y_in, const Tensor& lse_in,
                               int64_t heads, DType compute, const Tensor& dqkv, const Tensor& dqkv16) {
  Tensor dy = contiguous_on_device(dy_in), qkv = contiguous_on_device(qkv_in);
  Tensor y = contiguous_on_device(y_in), lse = contiguous_on_device(lse_in);
  const AttentionGeometry g(qkv, Attrs().set("heads", heads));
  if (int64_t(g.B) * g.T * g.H == 0) return;
  cudaStream_t stream = stream_of(qkv);
  REEL_CHECK(dqkv.defined() || dqkv16.defined(), "causal_attention_backward: neither dqkv nor its 16-bit copy is asked for");
  const DType value = dy.dtype();  // the dtype dy and dqkv are in
  REEL_CHECK(!dqkv.defined() || dqkv.dtype() == value, "causal_attention_backward: dy ", shape_str(dy.shape()), " is ",
             value, " but dqkv is ", dqkv.dtype());
  visit_float(value, "causal_attention_backward", [&]<typename In>() {
    visit_compute<In>(compute, [&]<typename C>() {
      visit_operand<In, C>(qkv, value, compute, "causal_attention_backward", "qkv", [&]<typename Q>() {
        visit_operand<In, C>(y, value, compute, "causal_attention_backward", "y", [&]<typename Y>() {
          using A = Acc<In>;
          const In* pdy = static_cast<const In*>(dy.data_ptr());
          const Q* px = static_cast<const Q*>(qkv.data_ptr());
          const Y* py = static_cast<const Y*>(y.data_ptr());
          In* pd = dqkv.defined() ? static_cast<In*>(dqkv.data_ptr()) : nullptr;
          C* p16 = copy16_ptr<C>(dqkv16, compute, qkv.shape(), "causal_attention_backward");
          bool tiled = false;
          if constexpr (kSixteenBit<C> && (std::is_same_v<In, float> || std::is_same_v<In, C>)) {
            tiled = visit_tiled_head(g.hd, [&]<int HD>() {
              const dim3 grid((g.T + kTile - 1) / kTile, g.B * g.H, 2);
              const float* pl = static_cast<const float*>(lse.data_ptr());
              const float scale = 1.0f / std::sqrt(float(g.hd));
              if constexpr (HD <= 64) {  // the register-resident kernel
                auto kernel = attention_bwd_mma<In, Q, Y, C, HD, 1>;
                if (more_than_one_wave(kernel, mma_smem_bytes<C, HD>(), grid, qkv.device().index))
                  kernel = attention_bwd_mma<In, Q, Y, C, HD, 3>;
                kernel<<<grid, kThreads, mma_smem_bytes<C, HD>(), stream>>>(pdy, px, py, pl, pd, p16, g.T, g.H, g.d,
                                                                            scale);
              } else {
                constexpr size_t bytes = tiled_smem_bytes<C, HD>();
                static const bool ready = (allow_smem(attention_bwd_tiled<In, Q, Y, C, HD>, bytes), true);
                (void)ready;
                attention_bwd_tiled<In, Q, Y, C, HD><<<grid, kThreads, bytes, stream>>>(pdy, px, py, pl, pd, p16, g.T,
                                                                                      g.H, g.d, scale);
              }
              REEL_CUDA_LAUNCH_CHECK();
            });
          }
          if (!tiled) {
            const size_t bytes = 2 * sizeof(A) * size_t(g.T);
            check_row_smem(bytes, g.T, "causal_attention_backward");
            if (bytes > 48 * 1024) allow_smem(attention_bwd_rows<In, Q, Y, C, A>, bytes);
            attention_bwd_rows<In, Q, Y, C, A><<<dim3(g.T, g.B * g.H, 2), kRowThreads, bytes, stream>>>(
                pdy, px, py, static_cast<const A*>(lse.data_ptr()), pd, p16, g.T, g.H, g.d, g.hd,
                A(1) / std::sqrt(A(g.hd)));
            REEL_CUDA_LAUNCH_CHECK();
          }
        });
      });
    });
  });
}

namespace {

void causal_attention_fwd(const KernelCall& c) {
  causal_attention_fwd_into(c.in[0], c.attrs.i("heads"), static_cast<DType>(c.attrs.i("compute")), c.out[0], c.out[1],
                            Tensor());
}

void causal_attention_bwd(const KernelCall& c) {
  causal_attention_bwd_into(c.in[0], c.in[1], c.in[2], c.in[3], c.attrs.i("heads"),
                            static_cast<DType>(c.attrs.i("compute")), c.out[0], Tensor());
}

}  // namespace
}  // namespace cuda

void register_attention_cuda_kernels() {
  using cuda::norm_detail::run_into_contiguous;
  constexpr DeviceType gpu = DeviceType::CUDA;
  register_kernel(gpu, OpKind::CausalAttention, [](const KernelCall& c) { run_into_contiguous(c, cuda::causal_attention_fwd); });
  register_kernel(gpu, OpKind::CausalAttentionBackward,
                  [](const KernelCall& c) { run_into_contiguous(c, cuda::causal_attention_bwd); });
}

}  // namespace reel
