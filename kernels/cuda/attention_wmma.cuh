// The WMMA builds of the tiled attention kernels (head size 128, where 16 x 128 accumulators per warp
// would not fit in registers): scores and dP go from WMMA's accumulators to a per-warp f32 scratch
// tile in shared memory, because the per-row softmax needs them by row and WMMA's fragment layout is
// opaque. 70 KiB of shared memory per block. Scheme and rounding points: kernels/cuda/attention.cu.
// Built per (Causal, Masked) as the mma.sync kernels are (attention_mma.cuh): the walks' ends, the
// hiding of keys >= T without causality, and the mask's loads and -inf guards are compile-time.
#pragma once
#include <mma.h>

#include "kernels/cuda/attention_tiles.cuh"

namespace reel::cuda::attention_detail {

namespace wm = nvcuda::wmma;

// The WMMA kernels' per-warp tiles: f32 scratch gets 4 extra columns, which keeps WMMA's 32-byte
// alignment and moves consecutive rows off the same banks.
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
template <typename In, typename Q, typename C, int HD, bool Causal, bool Masked>
__global__ void __launch_bounds__(kThreads) attention_fwd_tiled(const Q* __restrict__ qkv, In* __restrict__ y,
                                                               C* __restrict__ y16, float* __restrict__ lse, int T,
                                                               int H, int d, float scale, DeviceMask<float> mask) {
  grid_dependency_wait();
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
  const auto m_head = mask.head(blockIdx.y, H);
  float m = -INFINITY, l = 0.0f;
  const int last = Causal ? qt : (T + kTile - 1) / kTile - 1;  // the last key tile walked
  for (int kt = 0; kt <= last; ++kt) {
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
      const bool visible = (!Causal || s <= t) && s < T;
      float v = sm.s[r * S::lds + c] * scale;
      if constexpr (Masked) {
        if (visible && t < T) v += m_head.at(t, s);
      }
      x[j] = visible ? v : -INFINITY;
      mx = fmaxf(mx, x[j]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
    // Finite without a mask: key 0 is visible in every row's first tile. With one, a row that has
    // seen only -inf so far takes P against 0 (exp(-inf - 0) = 0, not NaN).
    const float m_new = fmaxf(m, mx);
    float mu = m_new;
    if constexpr (Masked) mu = m_new == -INFINITY ? 0.0f : m_new;
    const float alpha = expf(m - mu);
    float psum = 0.0f;
#pragma unroll
    for (int j = 0; j < kTile / 2; ++j) {
      const float p = expf(x[j] - mu);
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
  float inv_l = 1.0f / l, row_lse = m + logf(l);
  if constexpr (Masked) {  // no unmasked key (l = 0): y = 0, lse = +inf (the backward's P is then 0)
    if (l == 0.0f) inv_l = 0.0f, row_lse = INFINITY;
  }
  for (int c = half; c < HD; c += 2) sm.o[r * S::lds + c] *= inv_l;
  if (half == 0 && t < T) lse[int64_t(blockIdx.y) * T + t] = row_lse;
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
template <typename In, typename Q, typename Y, typename C, int HD, bool Causal, bool Masked>
__global__ void __launch_bounds__(kThreads, HD <= 64 ? 3 : 1) attention_bwd_tiled(const In* __restrict__ dy, const Q* __restrict__ qkv,
                                                               const Y* __restrict__ y, const float* __restrict__ lse,
                                                               In* __restrict__ dqkv, C* __restrict__ dqkv16, int T,
                                                               int H, int d, float scale, DeviceMask<float> mask) {
  grid_dependency_wait();
  using S = WmmaStrides<HD>;
  extern __shared__ __align__(128) unsigned char raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TiledSmem<C, HD> sm(raw, warp);
  const int tile = blockIdx.x, tiles = (T + kTile - 1) / kTile;
  const int64_t width = 3 * int64_t(d);
  const auto [base, dy_b, y_b, lse_bh, out, out16] = HeadOperands<In, Q, Y, C, float>(dy, qkv, y, lse, dqkv, dqkv16, T, H, d, HD);
  // This lane's share of a 16 x 64 tile: row r of the warp's 16, columns c = 2 j + half.
  const int r = lane % 16, half = lane / 16;
  const auto m_head = mask.head(blockIdx.y, H);
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
    for (int qt = Causal ? tile : 0; qt < tiles; ++qt) {
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
        const bool visible = (Causal ? s <= t : s < T) && t < T;  // both in range: the mask is read in bounds
        float v = sm.s[r * S::lds + c] * scale;
        if constexpr (Masked) {
          if (visible) v += m_head.at(t, s);
        }
        p[j] = visible ? expf(v - sm.lse[c]) : 0.0f;
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
    const int last = Causal ? tile : tiles - 1;  // the last key tile these queries see
    for (int kt = 0; kt <= last; ++kt) {
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
        const bool visible = (Causal ? s <= t : s < T) && t < T;
        float v = sm.s[r * S::lds + c] * scale;
        if constexpr (Masked) {
          if (visible) v += m_head.at(t, s);
        }
        p[j] = visible ? expf(v - row_lse) : 0.0f;
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

}  // namespace reel::cuda::attention_detail
