// reel's own kernels for a stem convolution (kernels/cuda/conv2d_stem.h): its weight gradient on the
// tensor cores and its forward, where cuDNN's kernels for C = 3 are generic and slow.
#include <mma.h>

#include <algorithm>

#include "kernels/cuda/conv2d_stem.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/last_block.cuh"

namespace reel::cuda {

namespace {

// ---- the weight gradient of a stem convolution (few input channels) ----
//
// dw[o, i, j, c] = sum over m = (n, ho, wo) of dy[m, o] * x[n, ho*sh - ph + i, wo*sw - pw + j, c]
// is the GEMM dw (O, K) = dy^T (O, M) @ col (M, K), K = kH*kW*C, with dy NHWC seen as (M, O) and col
// the im2col of NHWC x, columns ordered (i, j, c), so that dw comes out in KRSC order. For an RGB
// stem (C = 3: K = 27, M = N*Ho*Wo = 32768 in cnn-small) the output is tiny and the sum is long:
// cuDNN pads C to 8 in two extra passes and runs a weight-gradient kernel built for wide channels
// (about 50 us a call on an H200, timed alone, the largest single item of cnn-small's step), and
// cuBLAS on an explicit im2col splits the 32768-long sum 256 ways and spends longer reducing than
// multiplying. So one kernel (about 21 us timed the same way):
//   - block b takes a run of positions; per slice of kStemRows positions its threads stage dy's rows
//     (contiguous in NHWC) and the gathered im2col rows in shared memory, 16-bit, K zero-padded to
//     Kp (a power of two);
//   - warp w < tiles owns one 16x16 tile of the (O, Kp) result and accumulates dy^T @ col on the
//     tensor cores (WMMA, f32 accumulators), then writes its tile to block b's partial;
//   - the last block to finish (kernels/cuda/last_block.cuh) adds the partials in block order, four
//     columns per load and two threads per column quad, and rounds once: the same bits every run.
// Taken for 16-bit NHWC calls with one group, C < 8, K <= 64 and O in {16, 32, 48, 64} (at most 16
// tiles, one warp each): stem_convolution, which also picks the forward below.

constexpr int kStemRows = 128;     // positions staged per slice
constexpr int kStemBlocks = 64;    // blocks (partials) at most: the last block's serial sum stays short
constexpr int kStemThreads = 512;  // 16 warps: one per output tile, all stage and sum
constexpr int kStemRowThreads = kStemThreads / kStemRows;  // 4 threads stage one position's row
constexpr int kStemDepthValues = 64;  // values a thread holds for the slices whose loads are in flight

// Kp: K rounded up to a power of two >= 16 (so a thread's share of a row is a fixed count).
int64_t stem_padded_k(int64_t K) { return K <= 16 ? 16 : K <= 32 ? 32 : 64; }

// Calls fn.template operator()<D, kO>() with D the device type of a 16-bit dtype and kO the output
// channels O (16, 32, 48 or 64): the instances both kernels are built for, which stem_convolution
// alone lets through (another dtype calls nothing).
template <typename Fn>
void visit_stem_instance(DType dtype, int64_t O, const char* op, Fn&& fn) {
  visit_float_dtype(dtype, op, [&]<typename T>() {
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      using D = Dev<T>;
      if (O == 16) fn.template operator()<D, 16>();
      else if (O == 32) fn.template operator()<D, 32>();
      else if (O == 48) fn.template operator()<D, 48>();
      else fn.template operator()<D, 64>();
    }
  });
}

}  // namespace

bool stem_convolution(const ConvGeom& g, DType dt) {
  const int64_t K = g.C * g.kH * g.kW;
  return (dt == DType::bf16 || dt == DType::f16) && g.format == MemoryFormat::ChannelsLast && g.G == 1 && g.C < 8 &&
         K <= 64 && g.O % 16 == 0 && g.O <= 64 && g.N * g.Ho * g.Wo < (int64_t(1) << 31) &&
         g.N * g.H * g.W * g.C < (int64_t(1) << 31);
}

namespace {

struct StemGeom {
  int H, W, C, kW, Ho, Wo, sh, sw, ph, pw;
  int K, M, rows_per_block;
  int counter;  // the finish counter of the launch: its stream's lane (last_block.cuh)
};

// The kernels' geometry of a stem convolution (rows_per_block and counter left for the launcher).
StemGeom stem_geom(const ConvGeom& geo) {
  StemGeom g{};
  g.H = int(geo.H), g.W = int(geo.W), g.C = int(geo.C), g.kW = int(geo.kW), g.Ho = int(geo.Ho), g.Wo = int(geo.Wo);
  g.sh = int(geo.sh), g.sw = int(geo.sw), g.ph = int(geo.ph), g.pw = int(geo.pw);
  g.K = int(geo.C * geo.kH * geo.kW), g.M = int(geo.N * geo.Ho * geo.Wo);
  return g;
}

// OP = O (a multiple of 16), KP = stem_padded_k(K). Thread t stages row t / 4 of a slice: a quarter of
// its dy row (OP / 4 contiguous values) and a quarter of its im2col row (KP / 4 gathered values, with
// (i, j, c) of each column from a table). The loads of kStemDepth slices (as many as 64 values a
// thread allow) are all issued before the first store: the staging is latency-bound (with one slice's
// loads in flight at a time the kernel waited on memory once a slice: 15.7 us a call in cnn-small on
// the H200), and per-element index division made it compute-bound before that.
template <typename T, int OP, int KP>
__global__ void __launch_bounds__(kStemThreads)
    conv2d_stem_wgrad_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dw,
                             float* __restrict__ partials, StemGeom g) {
  grid_dependency_wait();
  constexpr int kDyShare = OP / kStemRowThreads, kColShare = KP / kStemRowThreads;
  constexpr int kTilesK = KP / 16, kTiles = OP / 16 * kTilesK;
  constexpr int kStemDepth = kStemDepthValues / (kDyShare + kColShare);  // 4 slices with O = 32, K <= 32
  __shared__ __align__(32) T sdy[kStemRows * OP];   // [row][o]
  __shared__ __align__(32) T scol[kStemRows * KP];  // [row][(i, j, c)]
  __shared__ int col_code[KP];                       // (i << 20) | (j << 10) | c, or -1 for padding
  const int tid = threadIdx.x, warp = tid / 32, ot = warp / kTilesK, kt = warp % kTilesK;
  const int row = tid / kStemRowThreads, share = tid % kStemRowThreads;
  for (int k = tid; k < KP; k += kStemThreads) {
    const int ij = k / g.C, c = k - ij * g.C, i = ij / g.kW, j = ij - i * g.kW;
    col_code[k] = k < g.K ? (i << 20) | (j << 10) | c : -1;
  }
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc;
  nvcuda::wmma::fill_fragment(acc, 0.0f);
  const T zero = from_acc<T>(0.0f);
  const int m_begin = blockIdx.x * g.rows_per_block, m_end = min(g.M, m_begin + g.rows_per_block);
  // Row m's share of its dy row and of its im2col row into dv, cv (zeros past m_end).
  auto load_row = [&](int m, T(&dv)[kDyShare], T(&cv)[kColShare]) {
    if (m < m_end) {
      const T* dy_row = dy + int64_t(m) * OP + share * kDyShare;
#pragma unroll
      for (int u = 0; u < kDyShare; ++u) dv[u] = dy_row[u];
      const int t = m / g.Wo, wo = m - t * g.Wo, n = t / g.Ho, ho = t - n * g.Ho;
      const int top = ho * g.sh - g.ph, left = wo * g.sw - g.pw;
      const T* x_image = x + int64_t(n) * g.H * g.W * g.C;
#pragma unroll
      for (int u = 0; u < kColShare; ++u) {
        const int code = col_code[share * kColShare + u];
        const int h = top + (code >> 20), w = left + ((code >> 10) & 1023);
        cv[u] = (code >= 0 && h >= 0 && h < g.H && w >= 0 && w < g.W) ? x_image[(h * g.W + w) * g.C + (code & 1023)]
                                                                      : zero;
      }
    } else {
#pragma unroll
      for (int u = 0; u < kDyShare; ++u) dv[u] = zero;
#pragma unroll
      for (int u = 0; u < kColShare; ++u) cv[u] = zero;
    }
  };
  __syncthreads();  // col_code is written
  // kStemDepth slices' loads are issued before the first of them is staged: one memory latency per
  // kStemDepth slices instead of one per slice. The slices are then staged and multiplied in order,
  // as one at a time would: the same sums, the same bits.
  for (int m0 = m_begin; m0 < m_end; m0 += kStemDepth * kStemRows) {
    T dv[kStemDepth][kDyShare], cv[kStemDepth][kColShare];
#pragma unroll
    for (int d = 0; d < kStemDepth; ++d) load_row(m0 + d * kStemRows + row, dv[d], cv[d]);
#pragma unroll
    for (int d = 0; d < kStemDepth; ++d) {
      const int slice = m0 + d * kStemRows;
      if (slice >= m_end) break;  // the same for the whole block
      __syncthreads();            // the previous slice's fragments are loaded
#pragma unroll
      for (int u = 0; u < kDyShare; ++u) sdy[row * OP + share * kDyShare + u] = dv[d][u];
#pragma unroll
      for (int u = 0; u < kColShare; ++u) scol[row * KP + share * kColShare + u] = cv[d][u];
      __syncthreads();
      if (warp < kTiles) {
#pragma unroll
        for (int rs = 0; rs < kStemRows; rs += 16) {
          nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, nvcuda::wmma::col_major> a;
          nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, nvcuda::wmma::row_major> b;
          nvcuda::wmma::load_matrix_sync(a, sdy + rs * OP + ot * 16, OP);  // dy^T: (o, r) at sdy[r][o]
          nvcuda::wmma::load_matrix_sync(b, scol + rs * KP + kt * 16, KP);
          nvcuda::wmma::mma_sync(acc, a, b, acc);
        }
      }
    }
  }
  constexpr int kTile = OP * KP;
  if (warp < kTiles)
    nvcuda::wmma::store_matrix_sync(partials + int64_t(blockIdx.x) * kTile + ot * 16 * KP + kt * 16, acc, KP,
                                    nvcuda::wmma::mem_row_major);
  if (!arrive_last(finish_counter(g.counter), gridDim.x)) return;
  // Thread pair (2q, 2q + 1) sums column quad q (four consecutive k of one o) over the first and the
  // second half of the blocks, 16 float4 loads in flight (__ldcg: from L2, where the other blocks'
  // partials are); the pair's halves then meet in shared memory, first half first.
  __shared__ float4 half_sums[kStemThreads];
  constexpr int kQuads = kTile / 4;
  const int blocks = int(gridDim.x), half = (blocks + 1) / 2;
  for (int q0 = 0; q0 < kQuads; q0 += kStemThreads / 2) {
    const int q = q0 + tid / 2, side = tid % 2;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (q < kQuads) {
      const float4* p = reinterpret_cast<const float4*>(partials) + q;
      const int b_begin = side * half, b_end = min(blocks, b_begin + half);
      for (int b0 = b_begin; b0 < b_end; b0 += 16) {
        float4 v[16];
#pragma unroll
        for (int u = 0; u < 16; ++u)
          v[u] = b0 + u < b_end ? __ldcg(p + int64_t(b0 + u) * kQuads) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int u = 0; u < 16; ++u) sum.x += v[u].x, sum.y += v[u].y, sum.z += v[u].z, sum.w += v[u].w;
      }
    }
    half_sums[tid] = sum;
    __syncthreads();
    if (q < kQuads && side == 0) {
      const float4 a = half_sums[tid], b = half_sums[tid + 1];
      const float total[4] = {a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w};
      const int o = q * 4 / KP, k0 = q * 4 - o * KP;
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (k0 + u < g.K) dw[o * g.K + k0 + u] = from_acc<T>(total[u]);
    }
    __syncthreads();
  }
}

template <typename D, int OP>
void launch_stem_wgrad(int kp, int grid, cudaStream_t s, const D* x, const D* dy, D* dw, float* partials,
                       const StemGeom& g) {
  if (kp == 16)
    launch_kernel(conv2d_stem_wgrad_kernel<D, OP, 16>, grid, kStemThreads, 0, s, x, dy, dw, partials, g);
  else if (kp == 32)
    launch_kernel(conv2d_stem_wgrad_kernel<D, OP, 32>, grid, kStemThreads, 0, s, x, dy, dw, partials, g);
  else
    launch_kernel(conv2d_stem_wgrad_kernel<D, OP, 64>, grid, kStemThreads, 0, s, x, dy, dw, partials, g);
  REEL_CUDA_LAUNCH_CHECK();
}

}  // namespace

// dy NHWC dense, x NHWC dense, dw KRSC dense: dw as (O, K) row-major.
void stem_weight_gradient_into(const Tensor& dy, const Tensor& x, const Tensor& dw, const ConvGeom& geo) {
  StemGeom g = stem_geom(geo);
  const int kp = int(stem_padded_k(g.K)), O = int(geo.O);
  const int slices = (g.M + kStemRows - 1) / kStemRows, blocks = std::min(kStemBlocks, slices);
  g.rows_per_block = (slices + blocks - 1) / blocks * kStemRows;
  const int grid = (g.M + g.rows_per_block - 1) / g.rows_per_block;
  Tensor partials = Tensor::empty({int64_t(grid) * O * kp}, DType::f32, dw.device());
  const cudaStream_t s = stream_of(dw);
  g.counter = int(finish_counter_base(s, dw.device()));
  visit_stem_instance(dw.dtype(), O, "conv2d_backward_weight", [&]<typename D, int kO>() {
    launch_stem_wgrad<D, kO>(kp, grid, s, static_cast<const D*>(x.data_ptr()), static_cast<const D*>(dy.data_ptr()),
                             static_cast<D*>(dw.data_ptr()), static_cast<float*>(partials.data_ptr()), g);
  });
}

namespace {

// ---- the forward of a stem convolution ----
//
// y[n, ho, wo, o] = sum over k = (i, j, c) of x[n, ho*sh - ph + i, wo*sw - pw + j, c] * w[o, k]
// (NHWC x and y, KRSC w seen as (O, K)). For an RGB stem the sum is 27 long and the output has a few
// dozen channels: cuDNN runs a generic direct-convolution kernel for it (10.5 us a call in cnn-small
// on an H100, timed alone) rather than a tensor-core one, since C = 3 fits none of those. It is
// little work (27 x 32 multiply-adds an output pixel), so one thread per output pixel: the weights in
// shared memory as f32, (k, o)-major so that every thread of a warp reads the same one (a broadcast),
// the O sums in registers in k order (f32, one fused multiply-add a term; taps in the padding add
// nothing), each rounded once to 16 bits and stored 16 bytes at a time. Taken where the weight
// gradient's kernel is (stem_convolution).
constexpr int kStemForwardThreads = 256;

template <typename T, int O>
__global__ void __launch_bounds__(kStemForwardThreads)
    conv2d_stem_fwd_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, StemGeom g) {
  grid_dependency_wait();
  __shared__ float sw[64 * O];  // (K, O): K <= 64
  for (int t = threadIdx.x; t < g.K * O; t += blockDim.x) {
    const int o = t / g.K, k = t - o * g.K;  // reading w (O, K) in order
    sw[k * O + o] = to_acc(w[t]);
  }
  __syncthreads();
  const int m = int(blockIdx.x) * kStemForwardThreads + int(threadIdx.x);
  if (m >= g.M) return;
  const int t = m / g.Wo, wo = m - t * g.Wo, n = t / g.Ho, ho = t - n * g.Ho;
  const int top = ho * g.sh - g.ph, left = wo * g.sw - g.pw;
  const int kH = g.K / (g.kW * g.C);
  float acc[O];
#pragma unroll
  for (int o = 0; o < O; ++o) acc[o] = 0.0f;
  for (int i = 0; i < kH; ++i) {
    const int h = top + i;
    if (h < 0 || h >= g.H) continue;
    for (int j = 0; j < g.kW; ++j) {
      const int wc = left + j;
      if (wc < 0 || wc >= g.W) continue;
      const T* px = x + ((int64_t(n) * g.H + h) * g.W + wc) * g.C;
      const float* pw = sw + (i * g.kW + j) * g.C * O;
      for (int c = 0; c < g.C; ++c) {
        const float v = to_acc(px[c]);
#pragma unroll
        for (int o = 0; o < O; ++o) acc[o] = fmaf(v, pw[c * O + o], acc[o]);
      }
    }
  }
  T* py = y + int64_t(m) * O;
#pragma unroll
  for (int o = 0; o < O; o += 8) {
    struct alignas(16) Eight {
      T v[8];
    } out;
#pragma unroll
    for (int u = 0; u < 8; ++u) out.v[u] = from_acc<T>(acc[o + u]);
    *reinterpret_cast<Eight*>(py + o) = out;  // O is a multiple of 16 and y 16-byte aligned
  }
}

}  // namespace

// x NHWC dense, w KRSC dense, y NHWC dense and 16-byte aligned.
void stem_forward_into(const Tensor& x, const Tensor& w, const Tensor& y, const ConvGeom& geo) {
  StemGeom g = stem_geom(geo);
  const unsigned grid = unsigned((g.M + kStemForwardThreads - 1) / kStemForwardThreads);
  visit_stem_instance(y.dtype(), geo.O, "conv2d", [&]<typename D, int kO>() {
    launch_kernel(conv2d_stem_fwd_kernel<D, kO>, grid, kStemForwardThreads, 0, stream_of(y),
                  static_cast<const D*>(x.data_ptr()), static_cast<const D*>(w.data_ptr()),
                  static_cast<D*>(y.data_ptr()), g);
    REEL_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace reel::cuda
