// The register-resident builds of the tiled attention kernels (head sizes 32 and 64), on mma.sync.
// Scheme and rounding points: kernels/cuda/attention.cu. Each kernel is built per (Causal, Masked):
// causal walks stop at the diagonal tile, non-causal ones take every tile and hide keys >= T in the
// last one; only the Masked builds read the mask, and only they guard the online softmax against a
// row that has seen no unmasked key yet (running max -inf). The (true, false) build is the
// decoder's kernel as it was before these parameters, instruction for instruction.
#pragma once
#include <algorithm>

#include "kernels/cuda/attention_tiles.cuh"

namespace reel::cuda::attention_detail {

// ====================================================================== register-resident kernels
//
// The same two ops on mma.sync (m16n8k16, f32 accumulation) with the scores, P and dS kept in
// registers, as FlashAttention-2 does: the accumulator layout of two adjacent 16 x 8 score tiles is
// exactly the A-operand layout of a 16 x 16 slice, so P (rounded to C) feeds the next product
// without a trip through shared memory. Shared memory holds only the 64 x HD tiles, read into
// fragments with ldmatrix. Same tiles, roles and rounding points as the WMMA kernels (attention_wmma.cuh)
// (P and dS rounded to C, D = dy . y from the unrounded values, no atomics); head sizes 32 and 64,
// where the accumulators fit in registers. Unlike them, a block fetches the next walked tile by
// cp.async while it computes on the current one (attention_tiles.cuh), and the backward reads dO and
// D prepared once per call (attention_dout_prep) instead of rounding and summing them per block.
//
// Fragments of lane l (g = l / 4, t = l % 4): A (16 x 16) a0 = (g, 2t..2t+1), a1 = (g + 8, 2t..),
// a2 = (g, 2t + 8..), a3 = (g + 8, 2t + 8..); B (16 x 8) b0 = (k 2t..2t+1, n g), b1 = (k 2t + 8.., n g);
// C (16 x 8) c0, c1 = (g, 2t..2t+1), c2, c3 = (g + 8, 2t..2t+1).

namespace mma {

// Four 8 x 8 matrices of 16-bit values; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
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
  const int blocks = resident_blocks_per_sm(unbounded, kThreads, smem);
  return int64_t(grid.x) * grid.y * grid.z > int64_t(blocks) * multiprocessor_count(device);
}

// Shared memory of the register-resident kernels: the block's own tiles and two buffers of each walked
// tile (the next one is fetched while the current one is used), 64 x HD each, then lse and D per
// query row of the two walked (keys role) or the own (queries role) query tiles. The forward owns Q
// and walks K, V; the backward's keys role owns K, V and walks Q, dO; its queries role owns Q, dO and
// walks K, V.
template <int HD>
constexpr int mma_tile_elements() {
  return kTile * Strides<HD>::ld;
}
template <typename C, int HD>
constexpr size_t mma_fwd_smem_bytes() {
  return sizeof(C) * 5 * mma_tile_elements<HD>();
}
template <typename C, int HD>
constexpr size_t mma_bwd_smem_bytes() {
  return sizeof(C) * 6 * mma_tile_elements<HD>() + sizeof(float) * 4 * kTile;
}
// Pointers into that memory, computed from the buffer index (an array of pointers indexed by a
// loop-dependent buffer would be put in local memory). Own: 1 (forward) or 2 (backward) own tiles.
template <typename C, int HD, int Own>
struct MmaSmem {
  unsigned char* raw;
  static constexpr int tile = mma_tile_elements<HD>();
  __device__ C* own(int i) const { return reinterpret_cast<C*>(raw) + i * tile; }
  // walked tile j (0: K or Q, 1: V or dO) of buffer b
  __device__ C* walk(int b, int j) const { return reinterpret_cast<C*>(raw) + (Own + 2 * b + j) * tile; }
  __device__ float* lse(int b) const { return reinterpret_cast<float*>(own(Own + 4)) + b * kTile; }
  __device__ float* D(int b) const { return lse(2) + b * kTile; }
};

// K and V of key tile kt (rows kt * 64 + [0, 64) of the head's columns base + d, base + 2 d of qkv,
// rows of `width`) into walked buffer kt % 2, as one cp.async group.
template <typename C, int HD, int Own, typename Q>
__device__ __forceinline__ void fetch_key_tile(const MmaSmem<C, HD, Own>& sm, const Q* base, int d, int64_t width,
                                               int kt, int T) {
  copy_tile<C, HD>(sm.walk(kt % 2, 0), base + d, width, kt * kTile, T);
  copy_tile<C, HD>(sm.walk(kt % 2, 1), base + 2 * d, width, kt * kTile, T);
  cp_async_commit();
}

// The top of each step of a walk: once every thread is done with the buffer the next tile goes to
// (the previous step's), fetch_next() fetches it when `more`, and the current tile, fetched one step
// earlier, is waited for until it has landed for every thread.
template <typename Fetch>
__device__ __forceinline__ void next_walk_step(bool more, Fetch&& fetch_next) {
  __syncthreads();
  if (more) {
    fetch_next();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

// Block order of both kernels. Tile-fastest (grid.x over the tiles, grid.y over the B H (batch, head)
// pairs): a head's tiles run side by side. Heads-first (heads_first set: grid.x over the pairs, grid.y
// over the tiles, the longest walks first) for grids of more than one wave: the long walks start first
// and the short ones fill in behind them. Measured on the H200 (bench/gpu_bench.cpp): gpt-small's
// micro-batch (1024 backward blocks, about 2.6 waves) forward 20.5 -> 17.3 us, backward 59 -> 56 us;
// gpt-tiny's (one wave) backward went 18.0 -> 19.2 us heads-first, so one-wave grids keep tile-fastest.
__device__ __forceinline__ int block_pair(bool heads_first) { return heads_first ? blockIdx.x : blockIdx.y; }

// Forward. grid (ceil(T / 64), B H), or heads-first (B H, ceil(T / 64)) with query tile
// qt = tiles - 1 - blockIdx.y; qkv (B, T, 3d), y (B, T, d), lse (B, H, T). y or y16 may be null.
// qkv in C must be 16-byte aligned (cp.async fetches its tiles); in f32 it is rounded on the way.
template <typename In, typename Q, typename C, int HD, int MinBlocks, bool Causal, bool Masked>
__global__ void __launch_bounds__(kThreads, MinBlocks) attention_fwd_mma(const Q* __restrict__ qkv, In* __restrict__ y,
                                                             C* __restrict__ y16, float* __restrict__ lse, int T,
                                                             int H, int d, float scale, bool heads_first,
                                                             DeviceMask<float> mask) {
  grid_dependency_wait();
  constexpr int ld = Strides<HD>::ld;
  extern __shared__ __align__(128) unsigned char raw[];
  const MmaSmem<C, HD, 1> sm{raw};
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int bh = block_pair(heads_first), qt = heads_first ? gridDim.y - 1 - blockIdx.y : blockIdx.x;
  const int b = bh / H, h = bh % H, q0 = qt * kTile;
  const int64_t width = 3 * int64_t(d);
  const Q* base = qkv + int64_t(b) * T * width + h * HD;
  copy_tile<C, HD>(sm.own(0), base, width, q0, T);
  cp_async_commit();
  fetch_key_tile(sm, base, d, width, 0, T);
  cp_async_wait<1>();  // Q has landed (K, V may not have)
  __syncthreads();
  unsigned qa[HD / 16][4];
  mma::load_a<HD>(qa, sm.own(0), warp * 16, ld);
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  const auto m_head = mask.head(bh, H);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's part of the row sums
  float o[HD / 8][4] = {};
  const int last = Causal ? qt : (T + kTile - 1) / kTile - 1;  // the last key tile walked
  for (int kt = 0; kt <= last; ++kt) {
    next_walk_step(kt < last, [&] { fetch_key_tile(sm, base, d, width, kt + 1, T); });
    const C *sk = sm.walk(kt % 2, 0), *sv = sm.walk(kt % 2, 1);
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
          const bool visible = (!Causal || key <= row[r]) && key < T;
          float x = s[n][e] * scale;
          if constexpr (Masked) {
            if (visible && row[r] < T) x += m_head.at(row[r], key);
          }
          s[n][e] = visible ? x : -INFINITY;
          mx[r] = fmaxf(mx[r], s[n][e]);
        }
      }
      float alpha[2], mu[2];  // mu: the max P is taken against
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 2));
        // Finite without a mask: key 0 is visible in every row's first part; a later part wholly
        // past a row's diagonal leaves the running max as it was (alpha 1, P 0). With a mask a row
        // may have seen only -inf so far: P is then taken against 0, so exp(-inf - 0) = 0, not NaN.
        const float m_new = fmaxf(m[r], mx[r]);
        mu[r] = m_new;
        if constexpr (Masked) mu[r] = m_new == -INFINITY ? 0.0f : m_new;
        alpha[r] = expf(m[r] - mu[r]);
        m[r] = m_new;
        l[r] *= alpha[r];
      }
#pragma unroll
      for (int n = 0; n < mma::kPartTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] = expf(s[n][e] - mu[e >> 1]);
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
    float row_lse = m[r] + logf(l[r]);
    if constexpr (Masked) {  // no unmasked key (l = 0): y = 0, lse = +inf (the backward's P is then 0)
      if (l[r] == 0.0f) inv[r] = 0.0f, row_lse = INFINITY;
    }
    if (t4 == 0 && row[r] < T) lse[int64_t(bh) * T + row[r]] = row_lse;
  }
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] *= inv[0], o[n][1] *= inv[0], o[n][2] *= inv[1], o[n][3] *= inv[1];
  const int64_t at = int64_t(b) * T * d + h * HD;
  mma::store_rows<HD>(o, y ? y + at : nullptr, y16 ? y16 + at : nullptr, d, q0 + warp * 16, T, 1.0f);
}

// Backward. grid (ceil(T / 64), B H, 2); dqkv (B, T, 3d). The roles of the WMMA kernel: z = 0 a block
// of 64 keys s = blockIdx.x walks the query tiles t >= s (dK, dV; every query tile when not causal),
// z = 1 a block of 64 queries t = tiles - 1 - blockIdx.x the key tiles s <= t (dQ; every key tile). Heads-first: grid (B H, 2 ceil(T / 64)), the
// roles alternating in blockIdx.y (the longest walks of both first), tile y / 2.
// dout (B, T, d) and D (B H, T) come from attention_dout_prep; dout and qkv in C must be 16-byte aligned.
template <typename Q, typename C, typename Out, int HD, int MinBlocks, bool Causal, bool Masked>
__global__ void __launch_bounds__(kThreads, MinBlocks) attention_bwd_mma(const C* __restrict__ dout,
                                                             const float* __restrict__ D, const Q* __restrict__ qkv,
                                                             const float* __restrict__ lse, Out* __restrict__ dqkv,
                                                             C* __restrict__ dqkv16, int T, int H, int d,
                                                             float scale, bool heads_first, DeviceMask<float> mask) {
  grid_dependency_wait();
  constexpr int ld = Strides<HD>::ld;
  extern __shared__ __align__(128) unsigned char raw[];
  const MmaSmem<C, HD, 2> sm{raw};
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int tile = heads_first ? blockIdx.y / 2 : blockIdx.x, tiles = (T + kTile - 1) / kTile;
  const bool keys_role = heads_first ? blockIdx.y % 2 == 0 : blockIdx.z == 0;
  const int64_t width = 3 * int64_t(d);
  // This (batch, head)'s columns of qkv and dqkv (rows of 3d), of dO (rows of d), its lse and D rows.
  const int bh = block_pair(heads_first), b = bh / H, h = bh % H;
  const int64_t wide = int64_t(b) * T * width + h * HD;
  const Q* base = qkv + wide;
  const C* dout_b = dout + int64_t(b) * T * d + h * HD;
  const float *lse_bh = lse + int64_t(bh) * T, *D_bh = D + int64_t(bh) * T;
  Out* out = dqkv ? dqkv + wide : nullptr;
  C* out16 = dqkv16 ? dqkv16 + wide : nullptr;
  const auto m_head = mask.head(bh, H);
  // Query tile q0 / 64's Q, dO, lse and D into (q, dO) tiles q_dst, do_dst and floats lse_dst, D_dst.
  auto fetch_queries = [&](C* q_dst, C* do_dst, float* lse_dst, float* D_dst, int q0) {
    copy_tile<C, HD>(q_dst, base, width, q0, T);
    copy_tile<C, HD>(do_dst, dout_b, d, q0, T);
    copy_row_floats(lse_dst, lse_bh, q0, T);
    copy_row_floats(D_dst, D_bh, q0, T);
    cp_async_commit();
  };
  float s[mma::kPartTiles][4], dp[mma::kPartTiles][4];
  unsigned pa[mma::kPart / 16][4];

  if (keys_role) {  // ---- keys role: this block's keys [k0, k0 + 64), the warp's 16 of them
    const int k0 = tile * kTile, key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
    const int first = Causal ? tile : 0;  // the first query tile that sees these keys
    const C *sk = sm.own(0), *sv = sm.own(1);
    copy_tile<C, HD>(sm.own(0), base + d, width, k0, T);
    copy_tile<C, HD>(sm.own(1), base + 2 * d, width, k0, T);
    fetch_queries(sm.walk(0, 0), sm.walk(0, 1), sm.lse(0), sm.D(0), first * kTile);  // one group with K, V
    float dk[HD / 8][4] = {}, dv[HD / 8][4] = {};
    unsigned a[HD / 16][4];  // the warp's K, then V rows as A fragments, reloaded per part (fewer registers)
    for (int qt = first; qt < tiles; ++qt) {
      const int q0 = qt * kTile, buf = (qt - first) % 2;
      next_walk_step(qt + 1 < tiles, [&] {
        fetch_queries(sm.walk(1 - buf, 0), sm.walk(1 - buf, 1), sm.lse(1 - buf), sm.D(1 - buf), q0 + kTile);
      });
      const C *sq = sm.walk(buf, 0), *sdo = sm.walk(buf, 1);
      const float *slse = sm.lse(buf), *sD = sm.D(buf);
#pragma unroll
      for (int part = 0; part < kTile / mma::kPart; ++part) {  // queries q0 + part * kPart + [0, kPart)
        const int c0 = part * mma::kPart;
        mma::load_a<HD>(a, sk, warp * 16, ld);
        mma::rows_times_tile_t<HD>(s, a, sq + c0 * ld, ld);  // S^T (16 keys x kPart queries)
#pragma unroll
        for (int n = 0; n < mma::kPartTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = c0 + n * 8 + 2 * t4 + (e & 1), query = q0 + c, k = key[e >> 1];
            // visible: both in range, so the mask is read in bounds
            const bool visible = (Causal ? k <= query : k < T) && query < T;
            float x = s[n][e] * scale;
            if constexpr (Masked) {
              if (visible) x += m_head.at(query, k);
            }
            s[n][e] = visible ? expf(x - slse[c]) : 0.0f;
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
    fetch_queries(sm.own(0), sm.own(1), sm.lse(0), sm.D(0), q0);
    fetch_key_tile(sm, base, d, width, 0, T);
    cp_async_wait<1>();  // the own tiles have landed (key tile 0 may not have)
    __syncthreads();
    unsigned qa[HD / 16][4], doa[HD / 16][4];
    mma::load_a<HD>(qa, sm.own(0), r0, ld);
    mma::load_a<HD>(doa, sm.own(1), r0, ld);
    const float row_lse[2] = {sm.lse(0)[r0 + g], sm.lse(0)[r0 + g + 8]};
    const float row_D[2] = {sm.D(0)[r0 + g], sm.D(0)[r0 + g + 8]};
    float dq[HD / 8][4] = {};
    const int last = Causal ? qtile : tiles - 1;  // the last key tile these queries see
    for (int kt = 0; kt <= last; ++kt) {
      const int k0 = kt * kTile;
      next_walk_step(kt < last, [&] { fetch_key_tile(sm, base, d, width, kt + 1, T); });
      const C *sk = sm.walk(kt % 2, 0), *sv = sm.walk(kt % 2, 1);
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
            const bool visible = (Causal ? k <= query[r] : k < T) && query[r] < T;
            float x = s[n][e] * scale;
            if constexpr (Masked) {
              if (visible) x += m_head.at(query[r], k);
            }
            const float p = visible ? expf(x - row_lse[r]) : 0.0f;
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

}  // namespace reel::cuda::attention_detail
