// Batch norm on channels-last operands: the statistics, the apply, the backward's sums and dx over
// tiles of pixels x 32 channels staged in shared memory (the layout story is at the top of
// kernels/cuda/batch_norm.cu, which includes this file and launches these kernels).
#pragma once
#include "kernels/cuda/batch_norm_common.cuh"
#include "kernels/cuda/group_barrier.cuh"
#include "kernels/cuda/last_block.cuh"

namespace reel::cuda::batch_norm_detail {

// A block is kTile x kTileRows threads (tx, ty): a warp per thread row, tx the channel within the
// tile. A tile holds tile_pixels<A> pixels (128 in f32), thread (tx, ty) taking pixel rows ty, ty + 16,
// ...: eight independent loads per thread, a whole tile's loads in flight at once (with 32-pixel tiles
// each thread waited on four loads at a time, and the norms ran at a third of memory bandwidth). 16
// warps a block rather than 8: a small plane (cnn-small's: 128-256 tiles, one or two a
// multiprocessor) is bound by the latency of each warp's instructions, and twice the warps with half
// the work each hide it better; a large plane keeps the same warps a multiprocessor (two blocks of 16,
// not four of 8). f64 tiles hold 64 pixels, to stay within a block's 48 KiB of static shared memory.
constexpr int kTile = 32, kTileRows = 16;
template <typename A>
constexpr int tile_pixels = sizeof(A) > 4 ? 64 : 128;
template <typename A>
constexpr int pixels_per_thread = tile_pixels<A> / kTileRows;

// Where element (pixel p, channel c) of an (N, C, S) tensor lies: p C + c channels-last, else
// (n C + c) S + s with p = n S + s.
struct PlaneLayout {
  int64_t C, S;
  bool channels_last;
};

// Pixel p = n S + s of an (N, C, S) operand, walked in steps: one division where a tile starts, then
// each step of a few pixels carries s into n (with 64-bit p and S a division costs dozens of
// instructions, and the tiles' loads and stores are bound by instruction latency, not by memory).
struct PixelPos {
  int64_t n, s;
  __device__ void advance(int64_t by, int64_t S) {
    for (s += by; s >= S; s -= S) ++n;
  }
};
__device__ inline PixelPos pixel_pos(int64_t p, int64_t S) {
  const int64_t n = p <= UINT32_MAX && S <= UINT32_MAX ? int64_t(uint32_t(p) / uint32_t(S)) : p / S;
  return {n, p - n * S};
}

// A tile staged in shared memory, [pixel][channel] (the +1 keeps a column read free of bank
// conflicts): 128 x 33 x 4 bytes = 16.5 KiB in f32.
template <typename A>
using Tile = A[tile_pixels<A>][kTile + 1];

// One operand's tile (pixels p0.., channels c0..) into `tile`, each value through `conv` (E(0) outside
// [0, P) x [0, C)). Threads run along the operand's contiguous dim: channels for channels-last, pixels
// for (N, C, S); every global access is coalesced.
template <typename T, typename E, int R, typename Conv>
__device__ void load_tile_as(E (&tile)[R][kTile + 1], const T* v, PlaneLayout L, int64_t P, int64_t p0, int64_t c0,
                             Conv conv) {
  if (L.channels_last) {
    const int64_t c = c0 + threadIdx.x;
#pragma unroll
    for (int j = 0; j < R / kTileRows; ++j) {
      const int r = threadIdx.y + j * kTileRows;
      const int64_t p = p0 + r;
      tile[r][threadIdx.x] = p < P && c < L.C ? conv(v[p * L.C + c]) : E(0);
    }
  } else {
    PixelPos at = pixel_pos(p0 + threadIdx.x, L.S);
#pragma unroll
    for (int q = 0; q < R / kTile; ++q) {  // groups of 32 pixels: tx runs along the pixels
      const int64_t p = p0 + q * kTile + threadIdx.x, first = (at.n * L.C + c0) * L.S + at.s;  // channel c0's
#pragma unroll
      for (int j = 0; j < kTile / kTileRows; ++j) {
        const int r = threadIdx.y + j * kTileRows;  // the channel within the tile
        tile[q * kTile + threadIdx.x][r] = p < P && c0 + r < L.C ? conv(v[first + r * L.S]) : E(0);
      }
      at.advance(kTile, L.S);
    }
  }
}

// An operand's tile as A.
template <typename T, typename A>
__device__ void load_tile(Tile<A>& tile, const T* v, PlaneLayout L, int64_t P, int64_t p0, int64_t c0) {
  load_tile_as(tile, v, L, P, p0, c0, [](T x) { return A(to_acc(x)); });
}

// A fused relu's mask beside the gradient's tile: 1 where its output y > 0. Loaded with g's and x's
// tiles (one round trip to memory, not two), applied as g is read: relu_backward(g, y).
template <typename A>
using MaskTile = uint8_t[tile_pixels<A>][kTile + 1];

template <typename D, typename A>
__device__ void load_relu_mask(MaskTile<A>& mask, const D* y, PlaneLayout Ly, int64_t P, int64_t p0, int64_t c0) {
  load_tile_as(mask, y, Ly, P, p0, c0, [](D v) { return uint8_t(to_acc(v) > decltype(to_acc(v))(0)); });
}

// Element (r, tx) of the gradient: g, or with a relu (has_mask) relu_backward(g, y) = y > 0 ? g : 0.
template <typename A>
__device__ __forceinline__ A grad_in_tile(const Tile<A>& tg, const MaskTile<A>& mask, bool has_mask, int r) {
  return has_mask && !mask[r][threadIdx.x] ? A(0) : tg[r][threadIdx.x];
}

// `tile` out to a D tensor in layout L, threads along its contiguous dim: coalesced.
template <typename D, typename A>
__device__ void store_tile(const Tile<A>& tile, D* v, PlaneLayout L, int64_t P, int64_t p0, int64_t c0) {
  if (L.channels_last) {
    const int64_t c = c0 + threadIdx.x;
#pragma unroll
    for (int j = 0; j < pixels_per_thread<A>; ++j) {
      const int r = threadIdx.y + j * kTileRows;
      const int64_t p = p0 + r;
      if (p < P && c < L.C) v[p * L.C + c] = from_acc<D>(tile[r][threadIdx.x]);
    }
  } else {
    PixelPos at = pixel_pos(p0 + threadIdx.x, L.S);
#pragma unroll
    for (int q = 0; q < tile_pixels<A> / kTile; ++q) {
      const int64_t p = p0 + q * kTile + threadIdx.x, first = (at.n * L.C + c0) * L.S + at.s;
#pragma unroll
      for (int j = 0; j < kTile / kTileRows; ++j) {
        const int r = threadIdx.y + j * kTileRows;
        if (p < P && c0 + r < L.C) v[first + r * L.S] = from_acc<D>(tile[q * kTile + threadIdx.x][r]);
      }
      at.advance(kTile, L.S);
    }
  }
}

// The kTileRows per-thread partial sums of each channel column (ty = 0..15) summed in ty order; every
// thread gets its column's total. Synchronises.
template <typename A>
__device__ A column_sum(A v, A (&scratch)[kTileRows][kTile]) {
  __syncthreads();
  scratch[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  A s = 0;
  for (int r = 0; r < kTileRows; ++r) s += scratch[r][threadIdx.x];
  return s;
}

// The statistics and the backward's sums split each channel's pixels into chunks of one tile
// (tile_pixels<A>), so block (channel tile j, chunk k) reduces one tile. Their chunk partials are laid
// out (2, parts, C), partial k of channel c at k C + c, so that a warp (32 neighbouring channels)
// reads or writes 128 contiguous bytes. The last block of a channel tile combines the tile's chunks
// with all its threads: thread row ty takes chunks ty, ty + 16, ..., and the rows' sums are then added
// in row order (column_sum), a fixed order: the same bits on every run. (One thread per channel
// walking every chunk, as batch_norm.cu's stage-2 kernels do, took tens of microseconds for a few
// hundred chunks.)

// Training statistics of channel tile c0.. from its chunks, as finalize_channel_stats combines them
// (Chan et al.) but in one pass over the partials: with K the first chunk's mean (an estimate of mu,
// so nothing cancels badly), sum_k n_k (mean_k - mu)^2 = sum_k n_k (mean_k - K)^2 - n (mu - K)^2.
// A thread row loads kCombineBatch chunks' partials at once (one L2 latency per batch); the results
// agree with the two-pass combination to rounding. Every thread gets its channel's mean and biased
// variance.
constexpr int kCombineBatch = 16;

template <typename A>
struct Moments {
  A mean, var;
};

template <typename A>
__device__ Moments<A> combine_chunk_moments(int64_t c0, const A* part, const ChannelSplit& sp,
                                            A (&scratch)[kTileRows][kTile]) {
  const int64_t c = c0 + threadIdx.x;
  const bool live = c < sp.C;
  const A* sums = part + c;                   // chunk k's sum at sums[k C]
  const A* m2s = part + sp.parts * sp.C + c;  // chunk k's M2 at m2s[k C]
  A s = 0, m2 = 0, K = 0;
  if (live) {
    K = load_partial(sums) / A(sp.end(0));
    for (int64_t k0 = threadIdx.y; k0 < sp.parts; k0 += kCombineBatch * kTileRows) {
      A sk[kCombineBatch], mk[kCombineBatch];
#pragma unroll
      for (int u = 0; u < kCombineBatch; ++u) {
        const int64_t k = k0 + u * kTileRows;
        sk[u] = k < sp.parts ? load_partial(sums + k * sp.C) : A(0);
        mk[u] = k < sp.parts ? load_partial(m2s + k * sp.C) : A(0);
      }
#pragma unroll
      for (int u = 0; u < kCombineBatch; ++u) {
        const int64_t k = k0 + u * kTileRows;
        if (k >= sp.parts) break;
        const A nk = A(sp.end(k) - sp.begin(k)), d = sk[u] / nk - K;  // chunks are never empty (split_pixels)
        s += sk[u];
        m2 += mk[u] + nk * d * d;
      }
    }
  }
  s = column_sum(s, scratch);
  m2 = column_sum(m2, scratch);
  const A n = A(sp.count), mu = s / n, dk = mu - K;  // count == 0 gives NaN, as on the CPU
  return {mu, (m2 - n * dk * dk) / n};
}

// Where the training statistics go once combined (batch_norm_common.cuh's store_channel_stats).
template <typename A>
struct StatsOut {
  A eps;
  A *mean, *rstd;  // (C)
  bool update;     // the running statistics too
  RunningStat running_mean, running_var;
  double momentum;
};

// Channel tile c0's statistics from its chunks' partials (combine_chunk_moments); with `store`, thread
// row 0 stores them as finalize_channel_stats does. Returns channel c0 + tx's moments to every thread.
template <typename A>
__device__ Moments<A> combine_tile_stats(int64_t c0, const A* part, const ChannelSplit& sp,
                                         A (&scratch)[kTileRows][kTile], const StatsOut<A>& out, bool store) {
  const int64_t c = c0 + threadIdx.x;
  const bool live = c < sp.C;
  // Loaded now, not after the combination: their latency overlaps the partials'.
  const bool store_running = store && out.update && live && threadIdx.y == 0;
  const double old_mean = store_running ? out.running_mean.load(c) : 0.0;
  const double old_var = store_running ? out.running_var.load(c) : 0.0;
  const Moments<A> m = combine_chunk_moments(c0, part, sp, scratch);
  if (store && threadIdx.y == 0 && live)
    store_channel_stats(c, m.mean, m.var, sp.count, out.eps, out.mean, out.rstd, out.update, out.running_mean,
                        out.running_var, old_mean, old_var, out.momentum);
  return m;
}

// Training statistics, x channels-last (x[p C + c]): block (channel tile j, pixel chunk k: one tile);
// thread (tx, ty) holds channel c0 + tx of its 8 pixels of the chunk in registers, read straight from
// x (a warp reads 32 neighbouring channels of one pixel: coalesced, no staging needed), sums them, and
// after the block has the chunk mean, sums their squared deviations from it (the two-pass variance of
// the chunk, x read once), into part. With `combine`, the last block of each channel tile to finish
// combines the tile's chunks (kernels/cuda/last_block.cuh): one launch. Without, the apply kernel
// below combines them (batch_norm.cu's stats_in_apply says which).
template <typename X, typename A>
__global__ void __launch_bounds__(kTile* kTileRows, 2)
    batch_norm_fwd_stats_tiled_kernel(const X* x, ChannelSplit sp, A* part, bool combine, StatsOut<A> out) {
  grid_dependency_wait();
  constexpr int R = pixels_per_thread<A>;  // pixels a thread holds
  __shared__ A scratch[kTileRows][kTile];
  const int64_t C = sp.C, tiles_c = (C + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < tiles_c * sp.parts; t += gridDim.x) {
    const int64_t j = t / sp.parts, k = t % sp.parts, i0 = sp.begin(k), i1 = sp.end(k);
    const int64_t c = j * kTile + threadIdx.x;
    const bool live = c < C;
    A v[R];  // pixels i0 + ty + 16 r of channel c; zeros past the chunk
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t p = i0 + threadIdx.y + r * kTileRows;
      v[r] = live && p < i1 ? to_acc(x[p * C + c]) : A(0);
    }
    A s = 0;
#pragma unroll
    for (int r = 0; r < R; ++r) s += v[r];
    s = column_sum(s, scratch);
    const A chunk_mean = s / A(i1 - i0);
    A q = 0;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const A d = v[r] - chunk_mean;
      if (i0 + threadIdx.y + r * kTileRows < i1) q += d * d;
    }
    q = column_sum(q, scratch);
    if (threadIdx.y == 0 && live) {
      part[k * C + c] = s;
      part[(sp.parts + k) * C + c] = q;
    }
    if (combine && arrive_last(finish_counter(sp.counters + j), unsigned(sp.parts)))
      combine_tile_stats(j * kTile, part, sp, scratch, out, true);
  }
}

// The statistics the apply kernel combines itself (its Combine instantiation): the chunks' partials of
// the statistics kernel, their split, and where the combined statistics go.
template <typename A>
struct ApplyStats {
  const A* part;
  ChannelSplit sp;
  StatsOut<A> out;
};

// y = x scale_c + shift_c, tiled: x in its layout, y (N, C, S). Block (pixel tile, channel tile).
// With a fused relu y = relu(x scale_c + shift_c), and y16 (non-null: attr cast_dtype) gets y's 16-bit
// copy in its layout L16, both from the tile. With Combine, each block first combines its channel
// tile's statistics from st's chunk partials, and the blocks of the first pixel tile store them;
// without, mean and rstd are read (a separate instantiation: the kernel of the last block's path is
// the code it was before the option).
template <typename X, typename D, typename Y16, bool Combine, typename A = Acc<D>>
__global__ void __launch_bounds__(kTile* kTileRows, 2)
    batch_norm_fwd_apply_tiled_kernel(const X* x, PlaneLayout Lx, const D* w, const D* b, const A* mean, const A* rstd,
                                      D* y, int64_t P, bool relu, Y16* y16, PlaneLayout L16, ApplyStats<A> st) {
  grid_dependency_wait();
  __shared__ Tile<A> tile;
  const int64_t tiles_p = (P + tile_pixels<A> - 1) / tile_pixels<A>, tiles_c = (Lx.C + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < tiles_p * tiles_c; t += gridDim.x) {
    const int64_t p0 = (t % tiles_p) * tile_pixels<A>, c0 = (t / tiles_p) * kTile;
    __syncthreads();
    load_tile(tile, x, Lx, P, p0, c0);
    __syncthreads();
    const int64_t c = c0 + threadIdx.x;
    A mu = 0, rs = 0;
    if constexpr (Combine) {
      // Every block of the channel tile combines the same partials in the same order (the same
      // values); the one of its first pixel tile stores them.
      __shared__ A scratch[kTileRows][kTile];
      const Moments<A> m = combine_tile_stats(c0, st.part, st.sp, scratch, st.out, p0 == 0);
      mu = m.mean;
      rs = inv_std(m.var, st.out.eps);
    } else if (c < Lx.C) {
      mu = mean[c];
      rs = rstd[c];
    }
    if (c < Lx.C) {
      const A scale = rs * (w ? to_acc(w[c]) : A(1)), shift = (b ? to_acc(b[c]) : A(0)) - mu * scale;
#pragma unroll
      for (int j = 0; j < pixels_per_thread<A>; ++j) {
        const int r = threadIdx.y + j * kTileRows;
        const A v = tile[r][threadIdx.x] * scale + shift;
        tile[r][threadIdx.x] = relu ? math::unary<OpKind::Relu>(v, A(0)) : v;
      }
    }
    __syncthreads();
    store_tile(tile, y, PlaneLayout{Lx.C, Lx.S, false}, P, p0, c0);
    if (y16) store_tile(tile, y16, L16, P, p0, c0);
  }
}

// The backward's sums of channel tile c0.. from its chunks, then dw, db and coef as
// finalize_channel_grads stores them.
template <typename D, typename A>
__device__ void combine_tile_grads(int64_t c0, const A* part, const ChannelSplit& sp, A (&scratch)[kTileRows][kTile],
                                   bool training, const ParamGrads<D>& grads, A* coef) {
  const int64_t c = c0 + threadIdx.x;
  const bool live = c < sp.C;
  A s_g = 0, s_gx = 0;
  if (live) {
    for (int64_t k0 = threadIdx.y; k0 < sp.parts; k0 += kCombineBatch * kTileRows) {
      A gk[kCombineBatch], gxk[kCombineBatch];  // loaded together: one L2 latency per batch
#pragma unroll
      for (int u = 0; u < kCombineBatch; ++u) {
        const int64_t k = k0 + u * kTileRows;
        gk[u] = k < sp.parts ? load_partial(part + k * sp.C + c) : A(0);
        gxk[u] = k < sp.parts ? load_partial(part + (sp.parts + k) * sp.C + c) : A(0);
      }
#pragma unroll
      for (int u = 0; u < kCombineBatch; ++u) {
        s_g += gk[u];
        s_gx += gxk[u];
      }
    }
  }
  s_g = column_sum(s_g, scratch);
  s_gx = column_sum(s_gx, scratch);
  if (threadIdx.y == 0 && live) store_channel_grads(c, s_g, s_gx, sp.C, sp.count, training, grads, coef);
}

// The operands of the backward's tile (pixels p0 .. P, channels c0 ..): g, x and a fused relu's mask,
// each loaded along its own layout into shared memory (with the synchronisations around them).
template <typename X, typename D, typename G, typename A>
__device__ void load_grad_tiles(Tile<A>& tg, Tile<A>& tx, MaskTile<A>& mask, const G* g, PlaneLayout Lg, const D* yr,
                                PlaneLayout Ly, const X* x, PlaneLayout Lx, int64_t P, int64_t p0, int64_t c0) {
  __syncthreads();
  load_tile(tg, g, Lg, P, p0, c0);
  load_tile(tx, x, Lx, P, p0, c0);
  if (yr) load_relu_mask<D, A>(mask, yr, Ly, P, p0, c0);
  __syncthreads();
}

// Chunk k of channel tile j, its tiles loaded: the sums of g and g xhat over the chunk into part
// (2, parts, C). Synchronises.
template <typename A>
__device__ void chunk_grad_sums(const Tile<A>& tg, const Tile<A>& tx, const MaskTile<A>& mask, bool has_mask,
                                const A* mean, const A* rstd, const ChannelSplit& sp, int64_t j, int64_t k, A* part,
                                A (&scratch)[kTileRows][kTile]) {
  const int64_t C = sp.C, c = j * kTile + threadIdx.x, i0 = sp.begin(k), i1 = sp.end(k);
  const bool live = c < C;
  const A mu = live ? mean[c] : A(0), rs = live ? rstd[c] : A(0);
  A s_g = 0, s_gx = 0;
#pragma unroll
  for (int q = 0; q < pixels_per_thread<A>; ++q) {
    const int r = threadIdx.y + q * kTileRows;
    if (i0 + r >= i1) break;
    const A gv = grad_in_tile<A>(tg, mask, has_mask, r);
    s_g += gv;
    s_gx += gv * (tx[r][threadIdx.x] - mu) * rs;
  }
  s_g = column_sum(s_g, scratch);
  s_gx = column_sum(s_gx, scratch);
  if (threadIdx.y == 0 && live) {
    part[k * C + c] = s_g;
    part[(sp.parts + k) * C + c] = s_gx;
  }
}

// Backward, stage 1, tiled: g and x each in its layout, staged through tiles; sums of g and g xhat
// per (channel, chunk) into part (2, parts, C). The last block of each channel tile then combines the
// tile's chunks.
template <typename X, typename D, typename G, typename A = Acc<D>>
__global__ void __launch_bounds__(kTile* kTileRows, 2)
    batch_norm_bwd_sums_tiled_kernel(const G* g, PlaneLayout Lg, const D* yr, PlaneLayout Ly, const X* x,
                                     PlaneLayout Lx, const A* mean, const A* rstd, ChannelSplit sp, A* part,
                                     bool training, ParamGrads<D> grads, A* coef) {
  grid_dependency_wait();
  __shared__ Tile<A> tg, tx;
  __shared__ MaskTile<A> mask;
  __shared__ A scratch[kTileRows][kTile];
  const int64_t tiles_c = (sp.C + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < tiles_c * sp.parts; t += gridDim.x) {
    const int64_t j = t / sp.parts, k = t % sp.parts;
    load_grad_tiles(tg, tx, mask, g, Lg, yr, Ly, x, Lx, sp.end(k), sp.begin(k), j * kTile);
    chunk_grad_sums(tg, tx, mask, yr != nullptr, mean, rstd, sp, j, k, part, scratch);
    if (arrive_last(finish_counter(sp.counters + j), unsigned(sp.parts)))
      combine_tile_grads(j * kTile, part, sp, scratch, training, grads, coef);
  }
}

// dx = w rstd (g - mean(g) - xhat mean(g xhat)) of channel c over a loaded tile, into tg. Its
// multiply-add is explicit: a product feeding a subtraction is otherwise left to ptxas to contract or
// not, per kernel, and the one-launch and two-kernel paths must give the same bits.
template <typename D, typename A>
__device__ void dx_in_tile(Tile<A>& tg, const Tile<A>& tx, const MaskTile<A>& mask, bool has_mask, const D* w, A mu,
                           A rs, A cg, A cgx, int64_t c) {
  const A wc = w ? to_acc(w[c]) : A(1);
#pragma unroll
  for (int j = 0; j < pixels_per_thread<A>; ++j) {
    const int r = threadIdx.y + j * kTileRows;
    const A xh = (tx[r][threadIdx.x] - mu) * rs;
    tg[r][threadIdx.x] = wc * rs * fma(-xh, cgx, grad_in_tile<A>(tg, mask, has_mask, r) - cg);
  }
}

// dx = w rstd (g - mean(g) - xhat mean(g xhat)), tiled: g (with a fused relu relu_backward(g, yr)), x
// and dx (of type O: D, or 16 bits with attr dx_dtype) each in its layout.
template <typename X, typename D, typename O, typename G, typename A = Acc<D>>
__global__ void __launch_bounds__(kTile* kTileRows, 2)
    batch_norm_bwd_dx_tiled_kernel(const G* g, PlaneLayout Lg, const D* yr, PlaneLayout Ly, const X* x, PlaneLayout Lx,
                                   const D* w, const A* mean, const A* rstd, const A* coef, O* dx, PlaneLayout Ldx,
                                   int64_t P) {
  grid_dependency_wait();
  __shared__ Tile<A> tg, tx;
  __shared__ MaskTile<A> mask;
  const int64_t C = Lx.C, tiles_p = (P + tile_pixels<A> - 1) / tile_pixels<A>, tiles_c = (C + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < tiles_p * tiles_c; t += gridDim.x) {
    const int64_t p0 = (t % tiles_p) * tile_pixels<A>, c0 = (t / tiles_p) * kTile;
    load_grad_tiles(tg, tx, mask, g, Lg, yr, Ly, x, Lx, P, p0, c0);
    const int64_t c = c0 + threadIdx.x;
    if (c < C) dx_in_tile(tg, tx, mask, yr != nullptr, w, mean[c], rstd[c], coef[c], coef[C + c], c);
    __syncthreads();
    store_tile(tg, dx, Ldx, P, p0, c0);
  }
}

// ---- the backward's sums and dx in one launch
// A small plane's grid fits on the GPU at once (cnn-small's: 128-256 blocks of one chunk each, two a
// multiprocessor), and dx's tiles are the chunks the sums reduce. Then one kernel does both halves:
// each block loads its chunk's g, x (and relu mask) tiles and sums them, the last block of its channel
// tile combines the tile's chunks into dw, db and dx's coefficients, and every block waits for that
// (group_barrier.cuh's wait_for_result) and computes dx from the tiles it still holds in shared memory.
// g and x are read once instead of twice, and the second launch and the gap before it go away. The
// grid is exactly the chunks, every block resident: the launcher (batch_norm.cu) checks the
// occupancy, and otherwise runs the two kernels above. The values are theirs, computed by the same
// device functions: the same bits either way. A channel tile's counters: arrivals at finish counter
// sp.counters + j (as the two-kernel path's) and its result's generation at generation counter
// sp.counters + j. (The forward's statistics and apply, joined the same way with x kept in registers,
// made cnn-small's step 0.9-1.0% slower on an H100, where this one made it 1.4-3.4% faster:
// bench/RESULTS.md, fifteenth step. The forward stays two launches.)

template <typename X, typename D, typename O, typename G, typename A = Acc<D>>
__global__ void __launch_bounds__(kTile* kTileRows, 2)
    batch_norm_bwd_one_launch_kernel(const G* g, PlaneLayout Lg, const D* yr, PlaneLayout Ly, const X* x,
                                     PlaneLayout Lx, const A* mean, const A* rstd, ChannelSplit sp, A* part,
                                     bool training, ParamGrads<D> grads, A* coef, const D* w, O* dx,
                                     PlaneLayout Ldx) {
  grid_dependency_wait();
  __shared__ Tile<A> tg, tx;
  __shared__ MaskTile<A> mask;
  __shared__ A scratch[kTileRows][kTile];
  const int64_t j = blockIdx.x / sp.parts, k = blockIdx.x % sp.parts;
  const int64_t c0 = j * kTile, c = c0 + threadIdx.x;
  unsigned* generation = result_generation_counter(sp.counters + j);
  const unsigned seen = result_generation(generation);
  load_grad_tiles(tg, tx, mask, g, Lg, yr, Ly, x, Lx, sp.end(k), sp.begin(k), c0);
  chunk_grad_sums(tg, tx, mask, yr != nullptr, mean, rstd, sp, j, k, part, scratch);
  if (arrive_last(finish_counter(sp.counters + j), unsigned(sp.parts))) {
    combine_tile_grads(c0, part, sp, scratch, training, grads, coef);
    publish_result(generation);
  }
  wait_for_result(generation, seen);
  if (c < sp.C)
    dx_in_tile(tg, tx, mask, yr != nullptr, w, mean[c], rstd[c], load_partial(coef + c), load_partial(coef + sp.C + c),
               c);
  __syncthreads();
  store_tile(tg, dx, Ldx, sp.end(k), sp.begin(k), c0);
}

}  // namespace reel::cuda::batch_norm_detail
