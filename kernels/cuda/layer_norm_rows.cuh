// The row-in-registers layer norm kernels of kernels/cuda/layer_norm.cu (f32 rows of 128 k columns,
// k <= 8, 16-byte-aligned operands; 16-bit addend / g widened as they load) and what they share with
// its generic kernels: RowTeam (the threads of one row), RowDropout (a fused op's dropout mask drawn
// where the operand is read), the partial-sum finish kernel and visit_vec_row, which says when these
// kernels apply. The math and launch shapes are described at the top of layer_norm.cu.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/norm_common.cuh"
#include "kernels/philox_args.h"
#include "tensor/rng.h"

// ---------------------------------------------------------------- rows in CUDA threads
// RowTeam, the threads that share one row, and the row-in-registers builds of the forward and
// backward for f32 rows of 128 k columns (k = 1..8) with 16-byte-aligned operands.

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

// ---- a fused op's dropout (kernels/philox_args.h): dropout's mask over one (rows, cols) operand,
// drawn where the operand is read. Element e (row-major) is kept iff the uniform of Philox word e % 4
// at counter start + e / 4 is >= threshold; kept elements are multiplied by `keep` (1/(1-p) rounded
// to f32, as dropout's mask holds it), the others by 0: the bits of mul(v, dropout_mask), the
// product rounded on its own (__fmul_rn: never contracted with the add after it into an FMA).
struct RowDropout {
  PhiloxArgs rng;
  float threshold = 0.0f, keep = 1.0f;
  bool on = false;

  __device__ static float uniform(uint32_t w) { return float(w >> 8) * (1.0f / 16777216.0f); }
  __device__ float mask_of(uint32_t w) const { return uniform(w) >= threshold ? keep : 0.0f; }
  __device__ float mask(int64_t e) const {
    const Philox4 r = philox4x32_10(rng.key(), rng.start() + uint64_t(e) / 4);
    return mask_of(r.w[uint64_t(e) % 4]);
  }
  // Elements e0 .. e0 + 3 (e0 a multiple of 4: one Philox block) times their masks.
  __device__ void apply4(int64_t e0, float (&v)[4]) const {
    const Philox4 r = philox4x32_10(rng.key(), rng.start() + uint64_t(e0) / 4);
#pragma unroll
    for (int c = 0; c < 4; ++c) v[c] = __fmul_rn(v[c], mask_of(r.w[c]));
  }
  __device__ void apply4(int64_t e0, float4& v) const {
    const Philox4 r = philox4x32_10(rng.key(), rng.start() + uint64_t(e0) / 4);
    v.x = __fmul_rn(v.x, mask_of(r.w[0])), v.y = __fmul_rn(v.y, mask_of(r.w[1]));
    v.z = __fmul_rn(v.z, mask_of(r.w[2])), v.w = __fmul_rn(v.w, mask_of(r.w[3]));
  }
  // a * (element e's mask) in A, rounded on its own.
  template <typename A>
  __device__ A times_mask(A a, int64_t e) const {
    if constexpr (std::is_same_v<A, double>) return __dmul_rn(a, double(mask(e)));
    else return __fmul_rn(a, mask(e));
  }
};

// The call's dropout, off when its attrs have none.
inline RowDropout row_dropout_of(const KernelCall& c) {
  RowDropout d;
  if (!has_fused_dropout(c.attrs)) return d;
  const double p = c.attrs.f("dropout_p");
  d.rng = fused_dropout_args(c);
  d.threshold = float(p);
  d.keep = float(dropout_kept_value(DType::f32, p));
  d.on = true;
  return d;
}

// ---- row-in-registers builds
//
// A warp per row (RowTeam<true>), lane l holding columns 4 l + 128 i .. 4 l + 128 i + 3 (i < k) as
// float4, loaded once with 16-byte loads: the passes over the row then run on registers, and every
// load of a row is in flight at once (norm.cu's generic kernels issue one 4-byte load per lane and
// pass and wait on each). Same formulas; each lane sums its values in a different order than the generic
// kernels, so the statistics may differ from theirs in the last bit.
// A 16-bit operand (T = __nv_bfloat16 or __half: a GEMM's result that the norm reads as its f32
// widening) is loaded 8 bytes a lane and widened exactly, to the same float4s.
template <int K>
struct VecRow {
  static constexpr int cols = 128 * K;
  __device__ static int64_t col(int i) { return 128 * i + 4 * (threadIdx.x % 32); }
  template <typename T>
  __device__ static void load(float4 (&v)[K], const T* row) {
#pragma unroll
    for (int i = 0; i < K; ++i) {
      if constexpr (std::is_same_v<T, float>) {
        v[i] = *reinterpret_cast<const float4*>(row + col(i));
      } else {
        struct alignas(8) Four {
          T v[4];
        };
        const Four f = *reinterpret_cast<const Four*>(row + col(i));
        v[i] = float4{to_acc(f.v[0]), to_acc(f.v[1]), to_acc(f.v[2]), to_acc(f.v[3])};
      }
    }
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

// The forward of layer_norm_fwd_rows_kernel (with its addend and sum_out) for f32 x; the addend f32 or
// 16-bit (Ad), widened as it is loaded, of addend_rows rows (row r of x adds row r % addend_rows).
template <int K, typename O, typename Ad = float>
__global__ void __launch_bounds__(256)
    layer_norm_fwd_vec_kernel(const float* x, const Ad* addend, int64_t addend_rows, float* sum_out, const float* w,
                              const float* b, O* y, float* mean, float* rstd, int64_t rows, float eps,
                              RowDropout drop) {
  grid_dependency_wait();
  using Row = VecRow<K>;
  float4 wv[K], bv[K];
  if (w) Row::load(wv, w);
  if (b) Row::load(bv, b);
  for (int64_t r = RowTeam<true>::first_row(); r < rows; r += RowTeam<true>::row_step()) {
    float4 v[K];
    Row::load(v, x + r * Row::cols);
    if (addend) {
      float4 a[K];
      Row::load(a, addend + (r % addend_rows) * Row::cols);
#pragma unroll
      for (int i = 0; i < K; ++i) {
        if (drop.on) drop.apply4(r * Row::cols + Row::col(i), a[i]);
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
// the bias gradient of the Linear whose output gradient dx16 is (compile/passes/fuse_norm_backward_add.cpp).
// g is f32 or 16-bit (G: a GEMM's input gradient), widened as it is loaded.
template <int K, typename O, int kSums = 2, typename G = float>
__global__ void __launch_bounds__(256)
    layer_norm_bwd_vec_kernel(const G* g, const float* x, const float* w, const float* mean, const float* rstd,
                              const float* residual, float* dx, O* dx16, float* part, int64_t rows, RowDropout drop) {
  grid_dependency_wait();
  static_assert(kSums == 2 || (kSums == 3 && !std::is_same_v<O, float>), "the third sum is of the 16-bit copy");
  using Row = VecRow<K>;
  __shared__ float4 block_sums[kSums][K][32];  // dw, db (and the sums of dx16) of the block, in the lanes' layout
  float4 wv[K], sums[kSums][K] = {};  // dw, db, dx16
  float4 (&dw)[K] = sums[0], (&db)[K] = sums[1];
  if (w) Row::load(wv, w);
  // Row r's operands in registers, and (K <= 4) the next row's loads issued before row r is computed,
  // so that a warp keeps its next row in flight through the reductions and stores of this one: the
  // kernel runs at one or two blocks per SM, so its registers, not its warps, hide the memory's
  // latency (gpt-small's (4096, 512) rows: see layer_norm_bwd_vec). Past K = 4 the second row's
  // registers would spill, and each row is loaded when its turn comes.
  constexpr bool kPrefetch = K <= 4;
  struct RowIn {
    float4 g[K], x[K], res[K];
    float mu, rs;
  };
  auto load_row = [&](int64_t r, RowIn& in) {
    Row::load(in.g, g + r * Row::cols);
    Row::load(in.x, x + r * Row::cols);
    if (residual) Row::load(in.res, residual + r * Row::cols);
    in.mu = mean[r], in.rs = rstd[r];
  };
  const int64_t step = RowTeam<true>::row_step();
  RowIn cur, next;
  if (kPrefetch && RowTeam<true>::first_row() < rows) load_row(RowTeam<true>::first_row(), cur);
  for (int64_t r = RowTeam<true>::first_row(); r < rows; r += step) {
    if constexpr (kPrefetch) {
      if (r + step < rows) load_row(r + step, next);
    } else {
      load_row(r, cur);
    }
    float4 (&gv)[K] = cur.g, (&xh)[K] = cur.x, (&res)[K] = cur.res;
    const float mu = cur.mu, rs = cur.rs;
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
      if (drop.on) drop.apply4(r * Row::cols + Row::col(i), o);  // the 16-bit copy's dropout
      if (dx16) store4(dx16 + r * Row::cols + Row::col(i), o[0], o[1], o[2], o[3]);
      if constexpr (kSums == 3)
        for_each4(sums[2][i], [&](float& e, int c) { e += to_acc(from_acc<O>(o[c])); });
    }
    if constexpr (kPrefetch) cur = next;
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

constexpr int kFinishRows = 32;  // threads per column of layer_norm_param_finish_kernel
// Columns per block of it: block (kFinishCols, kFinishRows). 8, not 32, so that gpt-small's 512
// columns take 64 blocks rather than 16 (3.37 -> 3.18 us a launch on the H200; the same sums in the
// same order).
constexpr int kFinishCols = 8;

// dw[j] = sum over p of part[p, 0, j], db[j] = sum of part[p, 1, j] (part: (parts, kSums, cols)), and
// with kSums 3 ds[j] = the sum of part[p, 2, j], or ds[j] += it with `accumulate` (a parameter's
// gradient over micro-batches: the bits of the sum and then an f32 add). Block (kFinishCols,
// kFinishRows) per kFinishCols columns: thread (tx, ty) sums p = ty, ty + kFinishRows, ... of column
// kFinishCols bx + tx (neighbouring lanes read adjacent columns), then the kFinishRows sums are added
// in ty order.
template <int kSums = 2>
__global__ void layer_norm_param_finish_kernel(const float* part, int64_t parts, int64_t cols, float* dw, float* db,
                                               float* ds = nullptr, bool accumulate = false) {
  grid_dependency_wait();
  __shared__ float s[kSums][kFinishRows][kFinishCols + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = int64_t(blockIdx.x) * kFinishCols + tx;
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
// (cols = 128 K, K <= 8, every f32 pointer (`wide`) 16-byte aligned, every 16-bit one (`narrow`) 8
// bytes); false otherwise.
template <typename Fn>
bool visit_vec_row(int64_t cols, std::initializer_list<const void*> wide, std::initializer_list<const void*> narrow,
                   Fn&& fn) {
  if (cols % 128 != 0 || cols / 128 < 1 || cols / 128 > 8) return false;
  for (const void* p : wide)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  for (const void* p : narrow)
    if (reinterpret_cast<uintptr_t>(p) % 8 != 0) return false;
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
