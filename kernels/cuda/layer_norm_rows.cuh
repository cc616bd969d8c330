// Rows of layer norm in CUDA threads, shared by kernels/cuda/norm.cu's kernels (device code, included
// there alone): RowTeam, the threads that share one row, and the row-in-registers builds of the
// forward and backward for f32 rows of 128 k columns (k = 1..8) with 16-byte-aligned operands. The
// math and the launch rules are in norm.cu's opening comment.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/norm_common.cuh"

namespace reel::cuda::norm_detail {

// The threads that share one row: a warp (kWarp) or the whole block. Rows are walked grid-stride.
template <bool kWarp>
struct RowTeam {
  __device__ static int size() { return kWarp ? 32 : int(blockDim.x); }
  __device__ static int rank() { return kWarp ? int(threadIdx.x % 32) : int(threadIdx.x); }
  __device__ static int64_t first_row() {
    return kWarp ? int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32 : int64_t(blockIdx.x);
  }
  __device__ static int64_t row_step() { return kWarp ? int64_t(gridDim.x) * (blockDim.x / 32) : int64_t(gridDim.x); }
  template <typename A>
  __device__ static A sum(A v) {
    if constexpr (kWarp) return warp_sum(v);
    else return block_sum(v);
  }
};

// ---- row-in-registers builds
//
// A warp per row (RowTeam<true>), lane l holding columns 4 l + 128 i .. 4 l + 128 i + 3 (i < k) as
// float4, loaded once with 16-byte loads: the passes over the row then run on registers, and every
// load of a row is in flight at once (norm.cu's generic kernels issue one 4-byte load per lane and
// pass and wait on each). Same formulas; each lane sums its values in a different order than the generic
// kernels, so the statistics may differ from theirs in the last bit.
template <int K>
struct VecRow {
  static constexpr int cols = 128 * K;
  __device__ static int64_t col(int i) { return 128 * i + 4 * (threadIdx.x % 32); }
  __device__ static void load(float4 (&v)[K], const float* row) {
#pragma unroll
    for (int i = 0; i < K; ++i) v[i] = *reinterpret_cast<const float4*>(row + col(i));
  }
};
__device__ __forceinline__ float4 operator+(float4 a, float4 b) { return {a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w}; }
// Four values rounded to O, stored with one 16-byte (f32) or 8-byte (16-bit) store.
template <typename O>
__device__ __forceinline__ void store4(O* p, float a, float b, float c, float d) {
  if constexpr (std::is_same_v<O, float>) {
    *reinterpret_cast<float4*>(p) = float4{a, b, c, d};
  } else {
    struct alignas(8) Four { O v[4]; } out{{from_acc<O>(a), from_acc<O>(b), from_acc<O>(c), from_acc<O>(d)}};
    *reinterpret_cast<Four*>(p) = out;
  }
}
template <typename F>
__device__ __forceinline__ void for_each4(float4& v, F&& f) { f(v.x, 0), f(v.y, 1), f(v.z, 2), f(v.w, 3); }

// The forward of layer_norm_fwd_rows_kernel (with its addend and sum_out) for f32 x.
template <int K, typename O>
__global__ void __launch_bounds__(256) layer_norm_fwd_vec_kernel(const float* x, const float* addend, float* sum_out,
                                                                 const float* w, const float* b, O* y, float* mean,
                                                                 float* rstd, int64_t rows, float eps) {
  using Row = VecRow<K>;
  float4 wv[K], bv[K];
  if (w) Row::load(wv, w);
  if (b) Row::load(bv, b);
  for (int64_t r = RowTeam<true>::first_row(); r < rows; r += RowTeam<true>::row_step()) {
    float4 v[K];
    Row::load(v, x + r * Row::cols);
    if (addend) {
      float4 a[K];
      Row::load(a, addend + r * Row::cols);
#pragma unroll
      for (int i = 0; i < K; ++i) {
        v[i] = v[i] + a[i];
        if (sum_out) *reinterpret_cast<float4*>(sum_out + r * Row::cols + Row::col(i)) = v[i];
      }
    }
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < K; ++i) for_each4(v[i], [&](float e, int) { s += e; });
    const float mu = warp_sum(s) / float(Row::cols);
    float q = 0.0f;
#pragma unroll
    for (int i = 0; i < K; ++i) for_each4(v[i], [&](float e, int) { q += (e - mu) * (e - mu); });
    const float rs = inv_std(warp_sum(q) / float(Row::cols), eps);
    if (threadIdx.x % 32 == 0) mean[r] = mu, rstd[r] = rs;
#pragma unroll
    for (int i = 0; i < K; ++i) {
      float o[4];
      for_each4(v[i], [&](float e, int c) {
        float t = (e - mu) * rs;
        if (w) t *= (&wv[i].x)[c];
        if (b) t += (&bv[i].x)[c];
        o[c] = t;
      });
      store4(y + r * Row::cols + Row::col(i), o[0], o[1], o[2], o[3]);
    }
  }
}

// dx (+ residual; its 16-bit copy dx16 when given) of layer_norm_bwd_dx_rows_kernel for f32 rows, and
// in the same pass the block's partial dw, db: each warp sums g xhat and g of its rows per column in
// registers, the block adds its warps' sums in warp order through shared memory and writes them to
// part (gridDim.x, kSums, cols); layer_norm_param_finish_kernel adds the blocks' rows in a fixed order.
// kSums 3 (16-bit dx16 only) also sums dx16's values per column (as f32, the 16-bit values exactly):
// the bias gradient of the Linear whose output gradient dx16 is (compile/fuse_norm_backward_add.h).
template <int K, typename O, int kSums = 2>
__global__ void __launch_bounds__(256) layer_norm_bwd_vec_kernel(const float* g, const float* x, const float* w,
                                                                 const float* mean, const float* rstd,
                                                                 const float* residual, float* dx, O* dx16,
                                                                 float* part, int64_t rows) {
  static_assert(kSums == 2 || (kSums == 3 && !std::is_same_v<O, float>), "the third sum is of the 16-bit copy");
  using Row = VecRow<K>;
  __shared__ float4 block_sums[kSums][K][32];  // dw, db (and the sums of dx16) of the block, in the lanes' layout
  float4 wv[K], sums[kSums][K] = {};  // dw, db, dx16
  float4 (&dw)[K] = sums[0], (&db)[K] = sums[1];
  if (w) Row::load(wv, w);
  for (int64_t r = RowTeam<true>::first_row(); r < rows; r += RowTeam<true>::row_step()) {
    float4 gv[K], xh[K], res[K];
    Row::load(gv, g + r * Row::cols);
    Row::load(xh, x + r * Row::cols);
    if (residual) Row::load(res, residual + r * Row::cols);  // in flight with g and x
    const float mu = mean[r], rs = rstd[r];
    float s_gw = 0.0f, s_gwx = 0.0f;
#pragma unroll
    for (int i = 0; i < K; ++i) {
      for_each4(xh[i], [&](float& e, int c) {
        e = (e - mu) * rs;
        const float gj = (&gv[i].x)[c], gw = w ? gj * (&wv[i].x)[c] : gj;
        s_gw += gw;
        s_gwx += gw * e;
        (&dw[i].x)[c] += gj * e;
        (&db[i].x)[c] += gj;
      });
    }
    const float mean_gw = warp_sum(s_gw) / float(Row::cols), mean_gwx = warp_sum(s_gwx) / float(Row::cols);
#pragma unroll
    for (int i = 0; i < K; ++i) {
      float o[4];
      for_each4(xh[i], [&](float e, int c) {
        const float gj = (&gv[i].x)[c], gw = w ? gj * (&wv[i].x)[c] : gj;
        // dx rounded on its own before the residual is added (no fused multiply-add across the
        // two), as the unfused layer_norm_backward and add compute it: equal to the bit.
        const float v = __fmul_rn(rs, gw - mean_gw - e * mean_gwx);
        o[c] = residual ? v + (&res[i].x)[c] : v;
      });
      store4(dx + r * Row::cols + Row::col(i), o[0], o[1], o[2], o[3]);
      if (dx16) store4(dx16 + r * Row::cols + Row::col(i), o[0], o[1], o[2], o[3]);
      if constexpr (kSums == 3)
        for_each4(sums[2][i], [&](float& e, int c) { e += to_acc(from_acc<O>(o[c])); });
    }
  }
  // The block's sums, warp 0 first, then each warp adds its own in turn (a fixed order).
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int k = 0; k < warps; ++k) {
    if (warp == k) {
#pragma unroll
      for (int which = 0; which < kSums; ++which)
#pragma unroll
        for (int i = 0; i < K; ++i)
          block_sums[which][i][lane] = k == 0 ? sums[which][i] : block_sums[which][i][lane] + sums[which][i];
    }
    __syncthreads();
  }
  float* out = part + int64_t(blockIdx.x) * kSums * Row::cols;
  for (int t = threadIdx.x; t < kSums * K * 32; t += blockDim.x) {
    const int which = t / (K * 32), i = t / 32 % K, l = t % 32;
    *reinterpret_cast<float4*>(out + which * Row::cols + 128 * i + 4 * l) = block_sums[which][i][l];
  }
}

constexpr int kFinishRows = 32;  // threads per column of layer_norm_param_finish_kernel: block (32, kFinishRows)

// dw[j] = sum over p of part[p, 0, j], db[j] = sum of part[p, 1, j] (part: (parts, kSums, cols)), and
// with kSums 3 ds[j] = the sum of part[p, 2, j], or ds[j] += it with `accumulate` (a parameter's
// gradient over micro-batches: the bits of the sum and then an f32 add). Block (32, kFinishRows) per 32
// columns: thread (tx, ty) sums p = ty, ty + kFinishRows, ... of column 32 bx + tx (the lanes read
// adjacent columns), then the kFinishRows sums are added in ty order.
template <int kSums = 2>
__global__ void layer_norm_param_finish_kernel(const float* part, int64_t parts, int64_t cols, float* dw, float* db,
                                               float* ds = nullptr, bool accumulate = false) {
  __shared__ float s[kSums][kFinishRows][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = int64_t(blockIdx.x) * 32 + tx;
  float sum[kSums] = {};
  if (j < cols)
    for (int64_t p = ty; p < parts; p += kFinishRows)
#pragma unroll
      for (int which = 0; which < kSums; ++which) sum[which] += part[(p * kSums + which) * cols + j];
#pragma unroll
  for (int which = 0; which < kSums; ++which) s[which][ty][tx] = sum[which];
  __syncthreads();
  if (ty == 0 && j < cols) {
    for (int k = 1; k < kFinishRows; ++k)
#pragma unroll
      for (int which = 0; which < kSums; ++which) sum[which] += s[which][k][tx];
    dw[j] = sum[0], db[j] = sum[1];
    if constexpr (kSums == 3) ds[j] = accumulate ? ds[j] + sum[2] : sum[2];
  }
}

// Calls fn.template operator()<K>() when f32 rows of `cols` columns take the row-in-registers kernels
// (cols = 128 K, K <= 8, every pointer 16-byte aligned, 8 bytes for 16-bit outputs); false otherwise.
template <typename Fn>
bool visit_vec_row(int64_t cols, std::initializer_list<const void*> wide, const void* narrow, Fn&& fn) {
  if (cols % 128 != 0 || cols / 128 < 1 || cols / 128 > 8) return false;
  for (const void* p : wide)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  if (reinterpret_cast<uintptr_t>(narrow) % 8 != 0) return false;
  switch (cols / 128) {
    case 1: fn.template operator()<1>(); break;
    case 2: fn.template operator()<2>(); break;
    case 3: fn.template operator()<3>(); break;
    case 4: fn.template operator()<4>(); break;
    case 5: fn.template operator()<5>(); break;
    case 6: fn.template operator()<6>(); break;
    case 7: fn.template operator()<7>(); break;
    default: fn.template operator()<8>(); break;
  }
  return true;
}

}  // namespace reel::cuda::norm_detail
