// CUDA kernels of batch norm, forward and backward (registered from norm.cu's
// register_norm_cuda_kernels()).
//
// x: (N, C, *) viewed as (N, C, S); each channel c is a set of N*S values, N runs of S, C*S apart.
// The math is the CPU's (kernels/cpu/norm.cpp):
//   training: mean_c = sum(x) / n, var_c = sum((x - mean_c)^2) / n (biased, two passes), n = N*S;
//             rstd_c = 1 / sqrt(var_c + eps), computed in A = Acc<D> (f32, f64 for f64).
//             Running statistics (both or neither; any float dtype, any stride) are updated in place,
//             in double, with the UNBIASED variance, and rounded once into their own dtype:
//               running = (1 - momentum) running + momentum stat,   stat_var = var n / (n - 1)
//   eval:     save_mean = running_mean, save_rstd = 1 / sqrt(running_var + eps), in double then A.
//   y = x scale_c + shift_c,   scale_c = rstd_c w_c,   shift_c = b_c - mean_c scale_c
//   backward, xhat = (x - mean) rstd:  dw_c = sum(g xhat)   db_c = sum(g)
//     dx = w rstd (g - mean(g) - xhat mean(g xhat))   (training: the statistics depend on x)
//     dx = w rstd (g - 0 - xhat 0)                    (eval: they are constants; same expression, so
//                                                      inf/NaN propagate exactly as on the CPU)
// The "more than 1 value per channel" check is a shape check done by the schema on the host.
// Types: x is X, everything else D (g, w, b, y, dx, dw, db), statistics A = Acc<D>. X = D for a plain
// call; a bf16/f16 x read as f32 (attr dtype = f32, schema/norm.cpp) has X 16-bit and D = float:
// to_acc widens x exactly, so the results are the bits of x.to(f32) through the f32 kernels.
//
// Launch shapes. Channel reductions (statistics, backward sums) are two-stage and deterministic:
// each channel's N*S values are split into `parts` chunks so that even a few channels fill the GPU
// (about 1024 tiles, each at least 4096 values); a 512-thread block reduces one (channel, chunk) tile
// with a fixed-order block sum into a small (2, C, parts) temporary, and one thread per channel then
// combines its chunks in order (statistics by Chan's formula, which with one chunk is exactly the
// plain two-pass result) and also updates the running statistics. A tile walks its chunk of
// (N, C, S) with an incremental (n, s) position: no 64-bit division per value. y and dx are flat
// elementwise passes over (N, C, S), c = (i / S) % C in 32-bit arithmetic when the size allows,
// coalesced in i. No atomics: the same inputs give the same bits on every run.
//
// Channels-last operands. Under autocast a convolution writes its 16-bit result channels-last
// (N, H, W, C: element (p, c) at p C + c, p = n S + s the pixel), and the compiled step hands that to
// the norm as x (compile/passes/read_norm_input_16bit.cpp); in the backward g usually comes in
// (N, C, S) order and x channels-last. Rather than copying such operands into (N, C, S) order first
// (a transpose kernel per operand, as many as the norms themselves), the kernels then work on tiles
// of 128 pixels x 32 channels staged in shared memory: each operand is loaded along its own
// contiguous dim (pixels for (N, C, S), channels for channels-last), so every global access is
// coalesced whatever the mix of layouts, and the tile is then read across. The statistics, whose
// only operand is a channels-last x, need no staging: a warp reads 32 neighbouring channels of a
// pixel. The statistics and the backward's sums are one launch each: the last block of a channel
// tile to finish combines the tile's chunks (kernels/cuda/last_block.cuh), all its threads at once.
// The chunks of a channel's values are then chunks of pixels, summed in another order than the
// (N, C, S) kernels': the results agree to rounding, not to the bit, with those of the same values
// in (N, C, S) order.
#include "kernels/cuda/cuda_registry.h"
#include "kernels/cuda/last_block.cuh"
#include "kernels/cuda/norm_common.cuh"

namespace reel {
namespace cuda {
namespace {

using namespace norm_detail;

constexpr int kChannelThreads = 512;

// A running statistic: a 1-D tensor of any float dtype and stride, read and written as double.
struct RunningStat {
  void* data;
  int64_t stride;
  DType dtype;

  __device__ double load(int64_t c) const {
    const int64_t i = c * stride;
    switch (dtype) {
      case DType::f64: return static_cast<const double*>(data)[i];
      case DType::f16: return double(__half2float(static_cast<const __half*>(data)[i]));
      case DType::bf16: return double(__bfloat162float(static_cast<const __nv_bfloat16*>(data)[i]));
      default: return double(static_cast<const float*>(data)[i]);
    }
  }
  // Rounds like the CPU's store<R>(AccType<R>(v)): f64 keeps v, the others go through float.
  __device__ void store(int64_t c, double v) const {
    const int64_t i = c * stride;
    switch (dtype) {
      case DType::f64: static_cast<double*>(data)[i] = v; break;
      case DType::f16: static_cast<__half*>(data)[i] = __float2half_rn(float(v)); break;
      case DType::bf16: static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16_rn(float(v)); break;
      default: static_cast<float*>(data)[i] = float(v); break;
    }
  }
};

RunningStat running_stat(const Tensor& t) {
  REEL_CHECK(is_floating(t.dtype()), "batch_norm: running statistics must be float tensors, got ",
             dtype_name(t.dtype()));
  return {t.data_ptr(), t.strides()[0], t.dtype()};
}

// A channel's values are split into `parts` chunks of its flat index i in [0, N*S) so that small C
// still fills the GPU. Tile t of the grid is (channel t / parts, chunk t % parts).
struct ChannelSplit {
  int64_t C, S, count, parts, chunk;  // count = N*S values per channel, chunk = ceil(count / parts)
  __device__ int64_t begin(int64_t k) const { return min(count, k * chunk); }
  __device__ int64_t end(int64_t k) const { return min(count, (k + 1) * chunk); }
};

// Walks the values i = first, first + step, ... of channel c of x: (N, C, S), tracking the element
// offset (n C + c) S + s of i = n S + s without a 64-bit division per step.
struct ChannelWalk {
  int64_t s = 0, off = 0;             // position in the current run of S, element offset in x
  int64_t step_s = 0, step_off = 0;   // advance per step
  int64_t S = 0, wrap = 0;            // run length; extra offset when s wraps to the next n: (C - 1) S
  __device__ ChannelWalk(int64_t c, int64_t first, int64_t step, int64_t C, int64_t S_) : S(S_) {
    if (S == 0) return;  // no values: the caller's loop never runs
    const int64_t n = first / S, sn = step / S;
    s = first - n * S;
    off = (n * C + c) * S + s;
    step_s = step - sn * S;
    step_off = sn * C * S + step_s;
    wrap = (C - 1) * S;
  }
  __device__ void next() {
    s += step_s;
    off += step_off;
    if (s >= S) {
      s -= S;
      off += wrap;
    }
  }
};

// Training statistics, stage 1. x: (N, C, S). Each tile (c, k) sums its chunk of channel c and the
// squared deviations from the chunk's own mean (two passes; the chunk is hot in L1/L2 for the second).
// part: (2, C, parts) = chunk sums, then chunk M2s.
template <typename X, typename A>
__global__ void batch_norm_fwd_partial_kernel(const X* x, ChannelSplit sp, A* part) {
  for (int64_t t = blockIdx.x; t < sp.C * sp.parts; t += gridDim.x) {
    const int64_t c = t / sp.parts, k = t % sp.parts, i0 = sp.begin(k), i1 = sp.end(k);
    A s = 0;
    ChannelWalk w(c, i0 + threadIdx.x, blockDim.x, sp.C, sp.S);
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x, w.next()) s += to_acc(x[w.off]);
    s = block_sum(s);
    const A chunk_mean = i1 > i0 ? s / A(i1 - i0) : A(0);
    A q = 0;
    ChannelWalk v(c, i0 + threadIdx.x, blockDim.x, sp.C, sp.S);
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x, v.next()) {
      A d = to_acc(x[v.off]) - chunk_mean;
      q += d * d;
    }
    q = block_sum(q);
    if (threadIdx.x == 0) {
      part[t] = s;
      part[sp.C * sp.parts + t] = q;
    }
  }
}

// A channel's statistics from its mean and biased variance: mean, rstd: (C) and, when `update`, the
// running statistics.
template <typename A>
__device__ void store_channel_stats(int64_t c, A mu, A var, int64_t count, A eps, A* mean, A* rstd, bool update,
                                    RunningStat running_mean, RunningStat running_var, double momentum) {
  mean[c] = mu;
  rstd[c] = inv_std(var, eps);
  if (update) {
    // Explicit roundings keep nvcc from contracting into FMAs: the same bits as the CPU's loop.
    const double n = double(count), var_unbiased = __ddiv_rn(__dmul_rn(double(var), n), n - 1);
    const double keep = 1 - momentum;
    running_mean.store(c, __dadd_rn(__dmul_rn(keep, running_mean.load(c)), __dmul_rn(momentum, double(mu))));
    running_var.store(c, __dadd_rn(__dmul_rn(keep, running_var.load(c)), __dmul_rn(momentum, var_unbiased)));
  }
}

// Training statistics, stage 2: one thread per channel combines its chunks in order (Chan et al.):
//   mean = sum_k s_k / n      M2 = sum_k M2_k + n_k (mean_k - mean)^2      var = M2 / n   (biased)
// With one chunk this is exactly the plain two-pass mean and variance.
template <typename A>
__device__ void finalize_channel_stats(int64_t c, const A* part, const ChannelSplit& sp, A eps, A* mean, A* rstd,
                                       bool update, RunningStat running_mean, RunningStat running_var,
                                       double momentum) {
  const A *sums = part + c * sp.parts, *m2s = part + (sp.C + c) * sp.parts;
  A s = 0;
  for (int64_t k = 0; k < sp.parts; ++k) s += load_partial(sums + k);
  const A mu = s / A(sp.count);  // count == 0 gives NaN, as on the CPU
  A m2 = 0;
  for (int64_t k = 0; k < sp.parts; ++k) {
    const int64_t nk = sp.end(k) - sp.begin(k);
    if (nk == 0) continue;
    const A d = load_partial(sums + k) / A(nk) - mu;
    m2 += load_partial(m2s + k) + A(nk) * d * d;
  }
  store_channel_stats(c, mu, m2 / A(sp.count), sp.count, eps, mean, rstd, update, running_mean, running_var,
                      momentum);
}

template <typename A>
__global__ void batch_norm_fwd_finalize_kernel(const A* part, ChannelSplit sp, A eps, A* mean, A* rstd, bool update,
                                               RunningStat running_mean, RunningStat running_var, double momentum) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < sp.C; c += int64_t(gridDim.x) * blockDim.x)
    finalize_channel_stats(c, part, sp, eps, mean, rstd, update, running_mean, running_var, momentum);
}

// Eval statistics from the running ones: mean = running_mean, rstd = 1 / sqrt(running_var + eps).
template <typename A>
__global__ void batch_norm_fwd_eval_stats_kernel(RunningStat running_mean, RunningStat running_var, int64_t C,
                                                 double eps, A* mean, A* rstd) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x) {
    mean[c] = A(running_mean.load(c));
    rstd[c] = A(1.0 / sqrt(running_var.load(c) + eps));
  }
}

// y = x scale_c + shift_c. x, y: (N, C, S) flat, total = N*C*S; w, b: (C) or null; mean, rstd: (C).
// I is the index type: 32-bit when total fits, which makes c = (i / S) % C several times cheaper.
template <typename I, typename X, typename D, typename A = Acc<D>>
__global__ void batch_norm_fwd_apply_kernel(const X* x, const D* w, const D* b, const A* mean, const A* rstd, D* y,
                                            I total, I C, I S) {
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I c = (i / S) % C;
    A scale = rstd[c] * (w ? to_acc(w[c]) : A(1)), shift = (b ? to_acc(b[c]) : A(0)) - mean[c] * scale;
    y[i] = from_acc<D>(to_acc(x[i]) * scale + shift);
  }
}

// Backward, stage 1. g, x: (N, C, S); mean, rstd: (C). Each tile (c, k) sums g and g xhat over its
// chunk of channel c into part: (2, C, parts).
template <typename X, typename D, typename A = Acc<D>>
__global__ void batch_norm_bwd_partial_kernel(const D* g, const X* x, const A* mean, const A* rstd, ChannelSplit sp,
                                              A* part) {
  for (int64_t t = blockIdx.x; t < sp.C * sp.parts; t += gridDim.x) {
    const int64_t c = t / sp.parts, k = t % sp.parts, i0 = sp.begin(k), i1 = sp.end(k);
    const A mu = mean[c], rs = rstd[c];
    A s_g = 0, s_gx = 0;
    ChannelWalk w(c, i0 + threadIdx.x, blockDim.x, sp.C, sp.S);
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x, w.next()) {
      A gv = to_acc(g[w.off]);
      s_g += gv;
      s_gx += gv * (to_acc(x[w.off]) - mu) * rs;
    }
    s_g = block_sum(s_g);
    s_gx = block_sum(s_gx);
    if (threadIdx.x == 0) {
      part[t] = s_g;
      part[sp.C * sp.parts + t] = s_gx;
    }
  }
}

// Backward, stage 2: one thread per channel sums its chunks in order.
// dw = sum(g xhat), db = sum(g) (D, (C)) and the coefficients of dx, coef: (2, C) = mean(g),
// mean(g xhat) in training, zeros in eval.
template <typename D, typename A>
__device__ void store_channel_grads(int64_t c, A s_g, A s_gx, int64_t C, int64_t count, bool training, D* dw, D* db,
                                    A* coef) {
  dw[c] = from_acc<D>(s_gx);
  db[c] = from_acc<D>(s_g);
  coef[c] = training ? s_g / A(count) : A(0);
  coef[C + c] = training ? s_gx / A(count) : A(0);
}

template <typename D, typename A = Acc<D>>
__device__ void finalize_channel_grads(int64_t c, const A* part, const ChannelSplit& sp, bool training, D* dw, D* db,
                                       A* coef) {
  A s_g = 0, s_gx = 0;
  for (int64_t k = 0; k < sp.parts; ++k) {
    s_g += load_partial(part + c * sp.parts + k);
    s_gx += load_partial(part + (sp.C + c) * sp.parts + k);
  }
  store_channel_grads(c, s_g, s_gx, sp.C, sp.count, training, dw, db, coef);
}

template <typename D, typename A = Acc<D>>
__global__ void batch_norm_bwd_finalize_kernel(const A* part, ChannelSplit sp, bool training, D* dw, D* db, A* coef) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < sp.C; c += int64_t(gridDim.x) * blockDim.x)
    finalize_channel_grads(c, part, sp, training, dw, db, coef);
}

// dx = w rstd (g - mean(g) - xhat mean(g xhat)). g, x, dx: (N, C, S) flat; w: (C) or null; mean,
// rstd: (C); coef: (2, C) from stage 2. I as in the apply kernel.
template <typename I, typename X, typename D, typename O, typename A = Acc<D>>
__global__ void batch_norm_bwd_dx_kernel(const D* g, const X* x, const D* w, const A* mean, const A* rstd,
                                         const A* coef, O* dx, I total, I C, I S) {
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I c = (i / S) % C;
    const A rs = rstd[c], xh = (to_acc(x[i]) - mean[c]) * rs, wc = w ? to_acc(w[c]) : A(1);
    dx[i] = from_acc<O>(wc * rs * (to_acc(g[i]) - coef[c] - xh * coef[C + c]));
  }
}

// ---- tiles of 128 pixels x 32 channels, for channels-last operands ----

// A block is kTile x kTileRows threads (tx, ty): a warp per thread row, tx the channel within the
// tile. A tile holds tile_pixels<A> pixels (128 in f32), thread (tx, ty) taking pixel rows ty, ty + 8,
// ...: sixteen independent loads per thread are in flight at once, which is what keeps these kernels
// near memory bandwidth (with 32-pixel tiles each thread waited on four loads at a time, and the norms
// ran at a third of it). f64 tiles hold 64 pixels, to stay within a block's 48 KiB of static shared
// memory.
constexpr int kTile = 32, kTileRows = 8;
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

// A tile staged in shared memory, [pixel][channel] (the +1 keeps a column read free of bank
// conflicts): 128 x 33 x 4 bytes = 16.5 KiB in f32.
template <typename A>
using Tile = A[tile_pixels<A>][kTile + 1];

// One operand's tile (pixels p0.., channels c0..) into `tile` as A, zeros outside [0, P) x [0, C).
// Threads run along the operand's contiguous dim: channels for channels-last, pixels for (N, C, S);
// every global access is coalesced.
template <typename T, typename A>
__device__ void load_tile(Tile<A>& tile, const T* v, PlaneLayout L, int64_t P, int64_t p0, int64_t c0) {
  if (L.channels_last) {
    const int64_t c = c0 + threadIdx.x;
#pragma unroll
    for (int j = 0; j < pixels_per_thread<A>; ++j) {
      const int r = threadIdx.y + j * kTileRows;
      const int64_t p = p0 + r;
      tile[r][threadIdx.x] = p < P && c < L.C ? to_acc(v[p * L.C + c]) : A(0);
    }
  } else {
#pragma unroll
    for (int q = 0; q < tile_pixels<A> / kTile; ++q) {  // groups of 32 pixels: tx runs along the pixels
      const int64_t p = p0 + q * kTile + threadIdx.x, n = p / L.S, s = p - n * L.S;
#pragma unroll
      for (int j = 0; j < kTile / kTileRows; ++j) {
        const int r = threadIdx.y + j * kTileRows;  // the channel within the tile
        const int64_t c = c0 + r;
        tile[q * kTile + threadIdx.x][r] = p < P && c < L.C ? to_acc(v[(n * L.C + c) * L.S + s]) : A(0);
      }
    }
  }
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
#pragma unroll
    for (int q = 0; q < tile_pixels<A> / kTile; ++q) {
      const int64_t p = p0 + q * kTile + threadIdx.x, n = p / L.S, s = p - n * L.S;
#pragma unroll
      for (int j = 0; j < kTile / kTileRows; ++j) {
        const int r = threadIdx.y + j * kTileRows;
        const int64_t c = c0 + r;
        if (p < P && c < L.C) v[(n * L.C + c) * L.S + s] = from_acc<D>(tile[q * kTile + threadIdx.x][r]);
      }
    }
  }
}

// The 8 per-thread partial sums of each channel column (ty = 0..7) summed in ty order; every
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
// with all its threads: thread row ty takes chunks ty, ty + 8, ..., and the rows' sums are then added
// in row order (column_sum), a fixed order: the same bits on every run. (One thread per channel
// walking every chunk, as the stage-2 kernels above do, took tens of microseconds for a few hundred
// chunks.)

// Training statistics of channel tile c0.. from its chunks, as finalize_channel_stats combines them
// (Chan et al.) but in one pass over the partials: with K the first chunk's mean (an estimate of mu,
// so nothing cancels badly), sum_k n_k (mean_k - mu)^2 = sum_k n_k (mean_k - K)^2 - n (mu - K)^2.
// A thread row loads kCombineBatch chunks' partials at once (one L2 latency per batch); the results
// agree with the two-pass combination to rounding. Then stored as finalize_channel_stats stores them.
constexpr int kCombineBatch = 16;

template <typename A>
__device__ void combine_tile_stats(int64_t c0, const A* part, const ChannelSplit& sp, A (&scratch)[kTileRows][kTile],
                                   A eps, A* mean, A* rstd, bool update, RunningStat running_mean,
                                   RunningStat running_var, double momentum) {
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
  if (threadIdx.y == 0 && live)
    store_channel_stats(c, mu, (m2 - n * dk * dk) / n, sp.count, eps, mean, rstd, update, running_mean, running_var,
                        momentum);
}

// Training statistics, x channels-last (x[p C + c]): block (channel tile j, pixel chunk k); thread
// (tx, ty) holds channel c0 + tx of its 16 pixels of the chunk in registers, read straight from x (a
// warp reads 32 neighbouring channels of one pixel: coalesced, no staging needed), sums them, and
// after the block has the chunk mean, sums their squared deviations from it (the two-pass variance
// of the chunk, x read once). The last block of each channel tile to finish combines the tile's
// chunks (kernels/cuda/last_block.cuh): one launch.
template <typename X, typename A>
__global__ void __launch_bounds__(kTile * kTileRows, 4) batch_norm_fwd_stats_tiled_kernel(const X* x, ChannelSplit sp, A* part, A eps, A* mean, A* rstd,
                                                  bool update, RunningStat running_mean, RunningStat running_var,
                                                  double momentum) {
  __shared__ A scratch[kTileRows][kTile];
  const int64_t C = sp.C, tiles_c = (C + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < tiles_c * sp.parts; t += gridDim.x) {
    const int64_t j = t / sp.parts, k = t % sp.parts, i0 = sp.begin(k), i1 = sp.end(k);
    const int64_t c = j * kTile + threadIdx.x;
    const bool live = c < C;
    A v[pixels_per_thread<A>];  // pixels i0 + ty + 8 r of channel c; zeros past the chunk
#pragma unroll
    for (int r = 0; r < pixels_per_thread<A>; ++r) {
      const int64_t p = i0 + threadIdx.y + r * kTileRows;
      v[r] = live && p < i1 ? to_acc(x[p * C + c]) : A(0);
    }
    A s = 0;
#pragma unroll
    for (int r = 0; r < pixels_per_thread<A>; ++r) s += v[r];
    s = column_sum(s, scratch);
    const A chunk_mean = s / A(i1 - i0);
    A q = 0;
#pragma unroll
    for (int r = 0; r < pixels_per_thread<A>; ++r) {
      const A d = v[r] - chunk_mean;
      if (i0 + threadIdx.y + r * kTileRows < i1) q += d * d;
    }
    q = column_sum(q, scratch);
    if (threadIdx.y == 0 && live) {
      part[k * C + c] = s;
      part[(sp.parts + k) * C + c] = q;
    }
    if (arrive_last(finish_counter(j), unsigned(sp.parts)))
      combine_tile_stats(j * kTile, part, sp, scratch, eps, mean, rstd, update, running_mean, running_var, momentum);
  }
}

// y = x scale_c + shift_c, tiled: x in its layout, y (N, C, S). Block (pixel tile, channel tile).
template <typename X, typename D, typename A = Acc<D>>
__global__ void __launch_bounds__(kTile * kTileRows, 4) batch_norm_fwd_apply_tiled_kernel(const X* x, PlaneLayout Lx, const D* w, const D* b, const A* mean,
                                                  const A* rstd, D* y, int64_t P) {
  __shared__ Tile<A> tile;
  const int64_t tiles_p = (P + tile_pixels<A> - 1) / tile_pixels<A>, tiles_c = (Lx.C + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < tiles_p * tiles_c; t += gridDim.x) {
    const int64_t p0 = (t % tiles_p) * tile_pixels<A>, c0 = (t / tiles_p) * kTile;
    __syncthreads();
    load_tile(tile, x, Lx, P, p0, c0);
    __syncthreads();
    const int64_t c = c0 + threadIdx.x;
    if (c < Lx.C) {
      const A scale = rstd[c] * (w ? to_acc(w[c]) : A(1)), shift = (b ? to_acc(b[c]) : A(0)) - mean[c] * scale;
#pragma unroll
      for (int j = 0; j < pixels_per_thread<A>; ++j) {
        const int r = threadIdx.y + j * kTileRows;
        tile[r][threadIdx.x] = tile[r][threadIdx.x] * scale + shift;
      }
    }
    __syncthreads();
    store_tile(tile, y, PlaneLayout{Lx.C, Lx.S, false}, P, p0, c0);
  }
}

// The backward's sums of channel tile c0.. from its chunks, then dw, db and coef as
// finalize_channel_grads stores them.
template <typename D, typename A>
__device__ void combine_tile_grads(int64_t c0, const A* part, const ChannelSplit& sp, A (&scratch)[kTileRows][kTile],
                                   bool training, D* dw, D* db, A* coef) {
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
  if (threadIdx.y == 0 && live) store_channel_grads(c, s_g, s_gx, sp.C, sp.count, training, dw, db, coef);
}

// Backward, stage 1, tiled: g and x each in its layout, staged through tiles; sums of g and g xhat
// per (channel, chunk) into part (2, parts, C). The last block of each channel tile then combines the
// tile's chunks.
template <typename X, typename D, typename A = Acc<D>>
__global__ void __launch_bounds__(kTile * kTileRows, 4) batch_norm_bwd_sums_tiled_kernel(const D* g, PlaneLayout Lg, const X* x, PlaneLayout Lx, const A* mean,
                                                 const A* rstd, ChannelSplit sp, A* part, bool training, D* dw, D* db,
                                                 A* coef) {
  __shared__ Tile<A> tg, tx;
  __shared__ A scratch[kTileRows][kTile];
  const int64_t C = sp.C, tiles_c = (C + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < tiles_c * sp.parts; t += gridDim.x) {
    const int64_t j = t / sp.parts, c0 = j * kTile, k = t % sp.parts, i0 = sp.begin(k), i1 = sp.end(k);
    const int64_t c = c0 + threadIdx.x;
    const bool live = c < C;
    const A mu = live ? mean[c] : A(0), rs = live ? rstd[c] : A(0);
    __syncthreads();
    load_tile(tg, g, Lg, i1, i0, c0);
    load_tile(tx, x, Lx, i1, i0, c0);
    __syncthreads();
    A s_g = 0, s_gx = 0;
#pragma unroll
    for (int j = 0; j < pixels_per_thread<A>; ++j) {
      const int r = threadIdx.y + j * kTileRows;
      if (i0 + r >= i1) break;
      const A gv = tg[r][threadIdx.x];
      s_g += gv;
      s_gx += gv * (tx[r][threadIdx.x] - mu) * rs;
    }
    s_g = column_sum(s_g, scratch);
    s_gx = column_sum(s_gx, scratch);
    if (threadIdx.y == 0 && live) {
      part[k * C + c] = s_g;
      part[(sp.parts + k) * C + c] = s_gx;
    }
    if (arrive_last(finish_counter(j), unsigned(sp.parts)))
      combine_tile_grads(c0, part, sp, scratch, training, dw, db, coef);
  }
}

// dx = w rstd (g - mean(g) - xhat mean(g xhat)), tiled: g, x and dx (of type O: D, or 16 bits with
// attr dx_dtype) each in its layout.
template <typename X, typename D, typename O, typename A = Acc<D>>
__global__ void __launch_bounds__(kTile * kTileRows, 4) batch_norm_bwd_dx_tiled_kernel(const D* g, PlaneLayout Lg, const X* x, PlaneLayout Lx, const D* w,
                                               const A* mean, const A* rstd, const A* coef, O* dx, PlaneLayout Ldx,
                                               int64_t P) {
  __shared__ Tile<A> tg, tx;
  const int64_t C = Lx.C, tiles_p = (P + tile_pixels<A> - 1) / tile_pixels<A>, tiles_c = (C + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < tiles_p * tiles_c; t += gridDim.x) {
    const int64_t p0 = (t % tiles_p) * tile_pixels<A>, c0 = (t / tiles_p) * kTile;
    __syncthreads();
    load_tile(tg, g, Lg, P, p0, c0);
    load_tile(tx, x, Lx, P, p0, c0);
    __syncthreads();
    const int64_t c = c0 + threadIdx.x;
    if (c < C) {
      const A rs = rstd[c], mu = mean[c], wc = w ? to_acc(w[c]) : A(1), cg = coef[c], cgx = coef[C + c];
#pragma unroll
      for (int j = 0; j < pixels_per_thread<A>; ++j) {
        const int r = threadIdx.y + j * kTileRows;
        const A xh = (tx[r][threadIdx.x] - mu) * rs;
        tg[r][threadIdx.x] = wc * rs * (tg[r][threadIdx.x] - cg - xh * cgx);
      }
    }
    __syncthreads();
    store_tile(tg, dx, Ldx, P, p0, c0);
  }
}

int64_t channel_tiles(const NCS& d) { return (d.C + kTile - 1) / kTile; }

// An operand read in place when it is dense channels-last (and not also (N, C, S)-contiguous, as
// when C or S is 1), else (N, C, S)-contiguous: itself or a copy.
struct PlaneOperand {
  Tensor t;
  PlaneLayout layout;
};
PlaneOperand plane_operand(const Tensor& v, const NCS& d) {
  const bool counters = channel_tiles(d) <= kFinishCounterSlots;  // one per channel tile (last_block.cuh)
  if (counters && v.dim() == 4 && !v.is_contiguous() && v.is_contiguous(MemoryFormat::ChannelsLast))
    return {v, {d.C, d.S, true}};
  return {contiguous_on_device(v), {d.C, d.S, false}};
}

// Pixel chunks per channel tile for the tiled kernels: one tile of `pixels` each, so no chunk is
// empty; a large plane has thousands of blocks and the last block combines its tile's chunks with
// all its threads.
ChannelSplit split_pixels(const NCS& d, int64_t pixels) {
  const int64_t count = d.N * d.S, parts = std::max<int64_t>(1, (count + pixels - 1) / pixels);
  return {d.C, d.S, count, parts, pixels};
}

// Chunks per channel: about 1024 tiles in all, each at least 4096 values (8 per thread).
ChannelSplit split_channels(const NCS& d) {
  const int64_t count = d.N * d.S;
  const int64_t parts = std::max<int64_t>(1, std::min((1024 + d.C - 1) / d.C, count / 4096));
  return {d.C, d.S, count, parts, (count + parts - 1) / parts};
}

// Launches an elementwise (N, C, S) kernel with 32-bit indices when N*C*S fits.
template <typename Kernel32, typename Kernel64, typename... Args>
void launch_flat(Kernel32 k32, Kernel64 k64, int64_t total, const NCS& d, cudaStream_t s, Args... args) {
  if (total <= int64_t(UINT32_MAX) - 65536 * 8 * 256)  // i + grid stride never wraps
    k32<<<blocks_for(total), 256, 0, s>>>(args..., uint32_t(total), uint32_t(d.C), uint32_t(d.S));
  else
    k64<<<blocks_for(total), 256, 0, s>>>(args..., total, d.C, d.S);
  REEL_CUDA_LAUNCH_CHECK();
}

void batch_norm_fwd(const KernelCall& c) {
  const NCS d = ncs_of(c.in[0]);
  const PlaneOperand xo = plane_operand(c.in[0], d);
  const Tensor &x = xo.t, w = contiguous_on_device(c.in[1]), b = contiguous_on_device(c.in[2]);
  const Tensor &running_mean = c.in[3], &running_var = c.in[4];  // updated in place: not copied
  const Tensor &y = c.out[0], &mean = c.out[1], &rstd = c.out[2];
  if (d.C == 0) return;
  const bool training = c.attrs.b("training"), has_running = running_mean.defined();
  const bool tiled = xo.layout.channels_last;
  const double eps = c.attrs.f("eps");
  cudaStream_t s = stream_of(x);
  RunningStat rm{}, rv{};
  if (has_running) {
    rm = running_stat(running_mean);
    rv = running_stat(running_var);
  }
  visit_norm_input(x.dtype(), y.dtype(), "batch_norm", [&]<typename X, typename D>() {
    using A = Acc<D>;
    A *pm = out_ptr<A>(mean), *pr = out_ptr<A>(rstd);
    if (training) {
      const ChannelSplit sp = tiled ? split_pixels(d, tile_pixels<A>) : split_channels(d);
      const double momentum = has_running ? c.attrs.f("momentum") : 0.0;
      // Chunk sums, then chunk M2s: (2, C, parts), or (2, parts, C) for the tiles.
      Tensor part = Tensor::empty({2, d.C, sp.parts}, mean.dtype(), x.device());
      if (tiled) {
        batch_norm_fwd_stats_tiled_kernel<X, A><<<grid_for(channel_tiles(d) * sp.parts), dim3(kTile, kTileRows), 0,
                                                  s>>>(in_ptr<X>(x), sp, out_ptr<A>(part), A(eps), pm, pr,
                                                       has_running, rm, rv, momentum);
      } else {
        batch_norm_fwd_partial_kernel<X, A><<<grid_for(d.C * sp.parts), kChannelThreads, 0, s>>>(in_ptr<X>(x), sp,
                                                                                                  out_ptr<A>(part));
        REEL_CUDA_LAUNCH_CHECK();
        batch_norm_fwd_finalize_kernel<A><<<blocks_for(d.C), 256, 0, s>>>(in_ptr<A>(part), sp, A(eps), pm, pr,
                                                                          has_running, rm, rv, momentum);
      }
    } else {
      batch_norm_fwd_eval_stats_kernel<A><<<blocks_for(d.C), 256, 0, s>>>(rm, rv, d.C, eps, pm, pr);
    }
    REEL_CUDA_LAUNCH_CHECK();
    const int64_t total = x.numel();
    if (total == 0) return;
    if (tiled) {
      const int64_t P = d.N * d.S, tiles = (P + tile_pixels<A> - 1) / tile_pixels<A> * channel_tiles(d);
      batch_norm_fwd_apply_tiled_kernel<X, D><<<grid_for(tiles), dim3(kTile, kTileRows), 0, s>>>(
          in_ptr<X>(x), xo.layout, in_ptr<D>(w), in_ptr<D>(b), in_ptr<A>(mean), in_ptr<A>(rstd), out_ptr<D>(y), P);
      REEL_CUDA_LAUNCH_CHECK();
      return;
    }
    launch_flat(batch_norm_fwd_apply_kernel<uint32_t, X, D>, batch_norm_fwd_apply_kernel<int64_t, X, D>, total, d,
                s, in_ptr<X>(x), in_ptr<D>(w), in_ptr<D>(b), in_ptr<A>(mean), in_ptr<A>(rstd), out_ptr<D>(y));
  });
}

// Calls fn.template operator()<O>() with O the device type of dx: D's own, or bf16/f16 with attr
// dx_dtype (D = float then; the schema allows nothing else).
template <typename D, typename Fn>
void visit_dx_type(DType dx, DType d, Fn&& fn) {
  if (dx == d) return fn.template operator()<D>();
  if constexpr (std::is_same_v<D, float>) {
    if (dx == DType::bf16) return fn.template operator()<__nv_bfloat16>();
    if (dx == DType::f16) return fn.template operator()<__half>();
  }
  throw Error(detail::cat("batch_norm_backward: dx of dtype ", dtype_name(dx), " with outputs of dtype ",
                          dtype_name(d), " is not supported"));
}

// dx dense channels-last: written so by the tiles (it is the 16-bit gradient a channels-last
// convolution's backward reads, with attr dx_dtype), not through a temporary.
bool dx_channels_last(const Tensor& dx, const NCS& d) {
  return channel_tiles(d) <= kFinishCounterSlots && dx.dim() == 4 && !dx.is_contiguous() &&
         dx.is_contiguous(MemoryFormat::ChannelsLast);
}

void batch_norm_bwd(const KernelCall& c) {
  const NCS d = ncs_of(c.in[1]);
  const PlaneOperand go = plane_operand(c.in[0], d), xo = plane_operand(c.in[1], d);
  const Tensor &g = go.t, &x = xo.t, w = contiguous_on_device(c.in[2]);
  Tensor mean = contiguous_on_device(c.in[3]), rstd = contiguous_on_device(c.in[4]);
  const Tensor &dx = c.out[0], &dw = c.out[1], &db = c.out[2];
  if (d.C == 0) return;
  const PlaneLayout Ldx{d.C, d.S, dx_channels_last(dx, d)};
  const bool training = c.attrs.b("training");
  const bool tiled = go.layout.channels_last || xo.layout.channels_last || Ldx.channels_last;
  cudaStream_t s = stream_of(x);
  visit_norm_input(x.dtype(), dw.dtype(), "batch_norm_backward", [&]<typename X, typename D>() {
    using A = Acc<D>;
    const D* pg = in_ptr<D>(g);
    const X* px = in_ptr<X>(x);
    const A *pm = in_ptr<A>(mean), *pr = in_ptr<A>(rstd);
    const ChannelSplit sp = tiled ? split_pixels(d, tile_pixels<A>) : split_channels(d);
    // Chunk sums of g, then of g xhat: (2, C, parts), or (2, parts, C) for the tiles.
    Tensor part = Tensor::empty({2, d.C, sp.parts}, mean.dtype(), x.device());
    Tensor coef = Tensor::empty({2, d.C}, mean.dtype(), x.device());            // mean(g), mean(g xhat)
    if (tiled) {
      batch_norm_bwd_sums_tiled_kernel<X, D><<<grid_for(channel_tiles(d) * sp.parts), dim3(kTile, kTileRows), 0, s>>>(
          pg, go.layout, px, xo.layout, pm, pr, sp, out_ptr<A>(part), training, out_ptr<D>(dw), out_ptr<D>(db),
          out_ptr<A>(coef));
    } else {
      batch_norm_bwd_partial_kernel<X, D><<<grid_for(d.C * sp.parts), kChannelThreads, 0, s>>>(pg, px, pm, pr, sp,
                                                                                                out_ptr<A>(part));
      REEL_CUDA_LAUNCH_CHECK();
      batch_norm_bwd_finalize_kernel<D><<<blocks_for(d.C), 256, 0, s>>>(in_ptr<A>(part), sp, training,
                                                                        out_ptr<D>(dw), out_ptr<D>(db),
                                                                        out_ptr<A>(coef));
    }
    REEL_CUDA_LAUNCH_CHECK();
    const int64_t total = x.numel();
    if (total == 0) return;
    visit_dx_type<D>(dx.dtype(), dw.dtype(), [&]<typename O>() {
      if (tiled) {
        const int64_t P = d.N * d.S, tiles = (P + tile_pixels<A> - 1) / tile_pixels<A> * channel_tiles(d);
        batch_norm_bwd_dx_tiled_kernel<X, D, O><<<grid_for(tiles), dim3(kTile, kTileRows), 0, s>>>(
            pg, go.layout, px, xo.layout, in_ptr<D>(w), pm, pr, in_ptr<A>(coef), out_ptr<O>(dx), Ldx, P);
        REEL_CUDA_LAUNCH_CHECK();
        return;
      }
      launch_flat(batch_norm_bwd_dx_kernel<uint32_t, X, D, O>, batch_norm_bwd_dx_kernel<int64_t, X, D, O>, total, d,
                  s, pg, px, in_ptr<D>(w), pm, pr, in_ptr<A>(coef), out_ptr<O>(dx));
    });
  });
}

}  // namespace
}  // namespace cuda

void register_batch_norm_cuda_kernels() {
  using cuda::norm_detail::run_into_contiguous;
  constexpr DeviceType gpu = DeviceType::CUDA;
  register_kernel(gpu, OpKind::BatchNorm, [](const KernelCall& c) { run_into_contiguous(c, cuda::batch_norm_fwd); });
  register_kernel(gpu, OpKind::BatchNormBackward, [](const KernelCall& c) {
    const bool direct = cuda::dx_channels_last(c.out[0], cuda::norm_detail::ncs_of(c.in[1])) &&
                        c.out[1].is_contiguous() && c.out[2].is_contiguous();
    if (direct) return cuda::batch_norm_bwd(c);
    run_into_contiguous(c, cuda::batch_norm_bwd);
  });
}

}  // namespace reel
