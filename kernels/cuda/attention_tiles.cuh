// Shared pieces of the fused attention kernels: a block's tile geometry, the tile loaders (global ->
// shared memory, rounded to the compute dtype on the way, with dO's row sums D), one head's operands
// of the backward, and the optional additive mask as the kernels read it. The three kernel families build on it: attention_wmma.cuh (WMMA
// tiles, head size 128), attention_mma.cuh (mma.sync with scores in registers, head sizes 32 and 64)
// and attention_rows.cuh (a block per row, any head size). Device code, included by
// kernels/cuda/attention.cu alone, which opens with the math and picks a family per call.
#pragma once
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/norm_common.cuh"

namespace reel::cuda::attention_detail {

using norm_detail::block_sum;
using norm_detail::kFullMask;
using norm_detail::warp_sum;

// v rounded to the compute dtype C and back to the accumulation type.
template <typename C, typename A>
__device__ __forceinline__ A round_c(A v) {
  return A(to_acc(from_acc<C>(v)));
}

// The additive mask (kernels/attention_mask.h): element (b, h, t, s) at data + b sb + h sh + t st + s ss,
// a broadcast dimension with stride 0. Passed by value to every kernel; a kernel built without the
// mask (template parameter Masked false) never reads it, so the unmasked path makes no extra loads.
template <typename A>
struct DeviceMask {
  const A* data = nullptr;
  int64_t sb = 0, sh = 0, st = 0, ss = 0;
  // The (batch, head) pair bh = b H + h's (T, T) mask, as a row pointer and two strides.
  struct Head {
    const A* data;
    int64_t st, ss;
    __device__ __forceinline__ A at(int t, int s) const { return data[t * st + s * ss]; }
  };
  __device__ __forceinline__ Head head(int bh, int H) const {
    return {data ? data + int64_t(bh / H) * sb + int64_t(bh % H) * sh : nullptr, st, ss};
  }
};

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

constexpr int kTile = 64;  // rows of a block's own tile, and of each tile it walks
constexpr int kWarps = 4;  // each warp owns 16 rows of the block's tile
constexpr int kThreads = kWarps * 32;

// Shared-memory stride (in elements) of a 64 x HD tile: 8 extra 16-bit columns keep every row
// 16-byte aligned (ldmatrix, WMMA) and move consecutive rows off the same banks.
template <int HD>
struct Strides {
  static constexpr int ld = HD + 8;  // a 64 x HD tile of Q, K, V or dO
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

// D = dy . y over one head's row (HD columns, unrounded), from the 4-column chunks of HD / 4 consecutive
// lanes (a power of two dividing 32, aligned to it), summed by shuffles; every lane of the group gets it.
// One order of summation for every kernel that computes D, so they agree to the bit.
template <int HD, typename In, typename Y>
__device__ __forceinline__ float head_row_dot(const Vec4<In>& g, const Vec4<Y>& y) {
  static_assert(HD / 4 <= 32 && 32 % (HD / 4) == 0, "a head's row must lie within one warp");
  float dot = 0.0f;
#pragma unroll
  for (int e = 0; e < 4; ++e) dot += to_acc(g.v[e]) * to_acc(y.v[e]);
#pragma unroll
  for (int o = HD / 8; o > 0; o >>= 1) dot += __shfl_xor_sync(kFullMask, dot, o);
  return dot;
}

// The dO tile of query rows [row0, row0 + 64) rounded to C, with D = dy . y (unrounded) and lse per row.
// A row's chunks lie in per_row consecutive lanes (a power of two dividing 32), which sum D by shuffles.
// dout: the 64 x HD tile (stride Strides<HD>::ld); D_s, lse_s: 64 floats each.
template <typename C, int HD, typename In, typename Y>
__device__ void load_grad_tile(C* __restrict__ dout, float* __restrict__ D_s, float* __restrict__ lse_s,
                               const In* __restrict__ dy, const Y* __restrict__ y, const float* __restrict__ lse,
                               int64_t d, int row0, int T) {
  using K = TileChunks<HD>;
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
    const float dot = head_row_dot<HD>(g[i], yv[i]);
    if (threadIdx.x % K::per_row == 0) {
      D_s[r] = dot;
      lse_s[r] = row0 + r < T ? lse[row0 + r] : 0.0f;
    }
  }
}


// ---------------------------------------------------------------- asynchronous copies (cp.async)
//
// The register-resident kernels fetch the next walked tile while they compute on the current one:
// cp.async copies global -> shared memory without a trip through registers, and a block waits for it
// only when it needs the tile (double buffering). It copies bytes as they are, so it serves operands
// already in the compute dtype (16-bit qkv, the prepared dO, lse and D); others are rounded on the way
// by load_tile, which waits for its loads.

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// 16 bytes from src, or 16 zero bytes when !valid (src is not read then).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
// 4 bytes from src, or zero when !valid.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}
// Closes this thread's group of copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `Pending` of this thread's most recent groups are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

// Rows [row0, row0 + 64) x columns [0, HD) of a (B*T, width) tensor (src offset to batch and column)
// into a 64 x HD tile in C: by cp.async when src is already in C (16-byte aligned, the caller sees to
// it), else rounded through registers by load_tile. Rows past T are zero. A block-wide call; the copies
// land once cp_async_wait says so.
template <typename C, int HD, typename In>
__device__ __forceinline__ void copy_tile(C* __restrict__ dst, const In* __restrict__ src, int64_t width, int row0,
                                          int T) {
  if constexpr (std::is_same_v<In, C>) {
    constexpr int per_row = HD / 8;  // 16-byte chunks of a row
    static_assert(kTile * per_row % kThreads == 0, "a tile must split evenly over the block");
#pragma unroll
    for (int i = 0; i < kTile * per_row / kThreads; ++i) {
      const int chunk = int(threadIdx.x) + i * kThreads, r = chunk / per_row, c = chunk % per_row * 8;
      const bool valid = row0 + r < T;
      cp_async16(dst + r * Strides<HD>::ld + c, valid ? src + int64_t(row0 + r) * width + c : src, valid);
    }
  } else {
    load_tile<C, HD>(dst, src, width, row0, T);
  }
}

// Entries [row0, row0 + 64) of a row of T floats (lse or D of one head) into 64 floats of shared memory,
// zero past T.
__device__ __forceinline__ void copy_row_floats(float* __restrict__ dst, const float* __restrict__ src, int row0,
                                                int T) {
  for (int r = threadIdx.x; r < kTile; r += kThreads) cp_async4(dst + r, row0 + r < T ? src + row0 + r : src, row0 + r < T);
}

// Once per backward, before the register-resident kernels: dO = dy rounded to C (B, T, d), unless
// dout is null (dy is in C already), and D = dy . y per (b H + h, t) (B H, T), unrounded. Those kernels
// then fetch dO, lse and D as they are, instead of rounding dy and summing D again in every block
// that walks a query tile (up to T / 64 blocks per tile). Thread i takes the 4-column chunk i of the
// (B T, d) rows; a head's HD / 4 chunks lie in consecutive lanes of one warp.
template <typename C, int HD, typename In, typename Y>
__global__ void attention_dout_prep(const In* __restrict__ dy, const Y* __restrict__ y, C* __restrict__ dout,
                                    float* __restrict__ D, int64_t rows, int T, int H, int d) {
  grid_dependency_wait();
  const int64_t per_row = d / 4, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool live = i < rows * per_row;  // whole warps take part in the shuffles
  const int64_t row = live ? i / per_row : 0, at = row * d + (live ? i % per_row * 4 : 0);
  const Vec4<In> g = live ? load4(dy + at) : Vec4<In>{};
  const Vec4<Y> yv = live ? load4(y + at) : Vec4<Y>{};
  if (live && dout) store4_rounded(dout + at, g);
  const float dot = head_row_dot<HD>(g, yv);
  const int col = int(at - row * d);
  if (live && col % HD == 0) {
    const int64_t b = row / T, t = row % T;
    D[(b * H + col / HD) * T + t] = dot;
  }
}

}  // namespace reel::cuda::attention_detail
