// CUDA kernels of the reductions (sum, mean, max) and the global norm, and the registration of the
// whole reduce family (softmax-like ops: softmax.cu; cross-entropy: cross_entropy.cu). Schemas and
// formulas: kernels/schema/reduce.cpp; the CPU twin: kernels/cpu/reduce.cpp.
//
// Layout. As on the CPU, every reduction is brought to one layout over a contiguous buffer,
//   x: (outer, R, inner)  ->  out: (outer, inner),   out[o, i] = op over r of x[o, r, i]
// x is used as it is when it is contiguous and its reduced dims (ignoring size-1 dims) form one run;
// otherwise the reduced dims are permuted innermost and copied contiguous (inner = 1).
//
// Kernels (all accumulate in Acc: float for f32/f16/bf16, double for f64, int64 for i64):
//   reduce_rows_warp_kernel     inner == 1, 16 < R <= 1024: one warp per row, lanes stride the row
//                               (coalesced), then a shuffle tree.
//   reduce_rows_block_kernel    inner == 1, R > 1024: one block per (row, chunk of the row).
//   reduce_columns_kernel       inner > 1, or short rows (R <= 16): 32 x 8 thread tiles; threadIdx.x
//                               picks one of 32 consecutive outputs (a warp reads 32 neighbouring
//                               elements of x), threadIdx.y strides over r; the 8 partials are
//                               combined in order through shared memory.
//   column_sums_wide_load_kernel  sums and means into f32 of x (R, inner) (outer == 1), f32 or 16-bit,
//                               16-byte aligned, inner a multiple of the 16 bytes' 4 (f32) or 8
//                               (16-bit) columns: each thread reads its columns of a row with one
//                               16-byte load (a warp: 512 bytes of the row), a (32, 8) block covers
//                               128 or 256 columns. Used by Sum and Mean of f32 (bias gradients)
//                               and by column_sums_into (kernels/cuda/column_sums.h).
// Splitting. When a reduction has too few rows or column tiles to fill the GPU and R is long, R is
// cut into `splits` chunks: a first launch writes Acc partials (outer, splits) or (splits, outer *
// inner) to a workspace and a second launch reduces them (columns: one launch, in which the last
// block of each column tile to finish adds its tile's partials; kernels/cuda/last_block.cuh). The
// split count depends on the shape only (the wide-load kernel's: on the shape, the element size and
// the GPU's SM count), so results are bitwise reproducible from run to run; there are no atomics.
//
// Semantics mirror the CPU: the mean of an empty selection is 0/0 = NaN; max propagates NaN (once a
// partial result is NaN no comparison replaces it); i64 sums and maxima are exact.
//
// Global norm: per-input partial sums of squares (Acc per block, stored as double) into a workspace,
// up to kNormBatch inputs per launch (blockIdx.y picks the input), then one block adds every partial
// in double in a fixed order and writes sqrt (f32 for 16-bit/f32 inputs, f64 for f64).
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cuda/cuda_registry.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/reduce_layout.h"
#include "kernels/cuda/reduce_common.cuh"
#include "kernels/cuda/last_block.cuh"
#include "kernels/cuda/column_sums.h"

namespace reel {
namespace cuda {
namespace {

using namespace reduce_detail;

constexpr int kThreads = 256;
constexpr int kTileCols = 32;            // outputs per column tile (threadIdx.x)
constexpr int kTileRows = 8;             // threads along R per column tile (threadIdx.y)
constexpr int64_t kTargetBlocks = 1024;  // about 8 resident blocks on each of an H200's 132 SMs
constexpr int64_t kMinRowChunk = 8192;   // a split row chunk has at least this many elements
constexpr int64_t kMinColumnChunk = 256; // a split column chunk has at least this many rows (32 per thread)

// ---- reduction operators: identity, combine (also of two partial results), finish ----

template <typename A>
struct SumOp {
  __device__ static A identity() { return A(0); }
  __device__ static A combine(A a, A b) { return a + b; }
  __device__ static A finish(A acc, int64_t) { return acc; }
};

template <typename A>
struct MeanOp : SumOp<A> {
  // count == 0 gives 0/0 = NaN: the mean of nothing (the schema refuses integer means).
  __device__ static A finish(A acc, int64_t count) { return acc / A(count); }
};

template <typename A>
struct MaxOp {
  __device__ static A identity() {
    if constexpr (std::is_floating_point_v<A>) return A(-INFINITY);
    else return INT64_MIN;
  }
  // NaN wins, as in PyTorch and on the CPU: once acc is NaN neither test replaces it (v != v is NaN).
  __device__ static A combine(A acc, A v) {
    if constexpr (std::is_floating_point_v<A>) return (v > acc || v != v) ? v : acc;
    else return v > acc ? v : acc;
  }
  __device__ static A finish(A acc, int64_t) { return acc; }
};

// The stored value: Op::finish(acc, count) for a final result, acc itself for a partial one.
template <typename Op, typename Out, typename A>
__device__ __forceinline__ Out result(A acc, int64_t count, bool finish) {
  return from_acc<Out>(finish ? Op::finish(acc, count) : acc);
}

// ---- kernels ----

// x: (rows, R) contiguous; out: (rows). One warp per row, kThreads / 32 rows per block.
template <typename Op, typename In, typename Out>
__global__ void reduce_rows_warp_kernel(const In* x, Out* out, int64_t rows, int64_t R, int64_t count, bool finish) {
  grid_dependency_wait();
  using A = Acc<In>;
  using Team = RowTeam<false>;
  for (int64_t row = Team::first_row(); row < rows; row += Team::row_stride()) {
    const In* xr = x + row * R;
    const A acc = warp_row_fold<Op, A>(R, [&](int64_t r) { return to_acc(xr[r]); });
    if (Team::rank() == 0) out[row] = result<Op, Out>(acc, count, finish);
  }
}

// x: (rows, R) contiguous; out: (rows, splits). Block item (row, s) reduces the chunk
// [s * chunk, min(R, (s + 1) * chunk)) of its row; with splits == 1 that is the whole row.
template <typename Op, typename In, typename Out>
__global__ void reduce_rows_block_kernel(const In* x, Out* out, int64_t rows, int64_t R, int64_t splits, int64_t chunk,
                                         int64_t count, bool finish) {
  grid_dependency_wait();
  using A = Acc<In>;
  for (int64_t item = blockIdx.x; item < rows * splits; item += gridDim.x) {
    const int64_t row = item / splits, s = item % splits;
    const int64_t lo = s * chunk, hi = lo + chunk < R ? lo + chunk : R;
    const In* xr = x + row * R;
    A acc = strided_fold<Op, A>(lo + threadIdx.x, hi, blockDim.x, combine_fn<Op, A>(),
                                [&](int64_t r) { return to_acc(xr[r]); });
    acc = block_reduce<Op>(acc);
    if (threadIdx.x == 0) out[item] = result<Op, Out>(acc, count, finish);
  }
}

// x: (outer, R, inner) contiguous; out: (splits, M) with M = outer * inner, out[s, j] for output
// j = o * inner + i and chunk s = blockIdx.y of R ([s * chunk, min(R, (s + 1) * chunk))).
// Blocks are kTileCols x kTileRows threads; a tile covers outputs [tile * 32, tile * 32 + 32).
template <typename Op, typename In, typename Out>
__global__ void reduce_columns_kernel(const In* x, Out* out, int64_t outer, int64_t R, int64_t inner, int64_t chunk,
                                      int64_t count, bool finish) {
  grid_dependency_wait();
  using A = Acc<In>;
  __shared__ A partial[kTileRows][kTileCols];
  const int64_t M = outer * inner, tiles = (M + kTileCols - 1) / kTileCols;
  const int64_t s = blockIdx.y, lo = s * chunk, hi = lo + chunk < R ? lo + chunk : R;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t j = tile * kTileCols + threadIdx.x;
    A acc = Op::identity();
    if (j < M) {
      const In* xc = x + (j / inner) * R * inner + j % inner;  // output j's column: element r at r * inner
      acc = strided_fold<Op, A>(lo + threadIdx.y, hi, kTileRows, combine_fn<Op, A>(),
                                [&](int64_t r) { return to_acc(xc[r * inner]); });
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < M) {
      A v = partial[0][threadIdx.x];
      for (int y = 1; y < kTileRows; ++y) v = Op::combine(v, partial[y][threadIdx.x]);
      out[s * M + j] = result<Op, Out>(v, count, finish);
    }
    __syncthreads();  // the tile's partials are read before the next tile overwrites them
  }
}

// The split column reduction in one launch. grid (tiles, splits): block (tile, s) folds chunk s of R
// for the tile's 32 outputs into partial[s, j], and the last of the tile's blocks to finish combines
// the splits' partials in order s = 0, 1, ... and writes out[j].
template <typename Op, typename In, typename Out>
__global__ void reduce_columns_split_kernel(const In* x, Acc<In>* partial, Out* out, int64_t outer, int64_t R,
                                            int64_t inner, int64_t chunk, int64_t count, int64_t counters) {
  grid_dependency_wait();
  using A = Acc<In>;
  __shared__ A part[kTileRows][kTileCols];
  const int64_t M = outer * inner, tile = blockIdx.x, s = blockIdx.y, splits = gridDim.y;
  const int64_t lo = s * chunk, hi = lo + chunk < R ? lo + chunk : R, j = tile * kTileCols + threadIdx.x;
  A acc = Op::identity();
  if (j < M) {
    const In* xc = x + (j / inner) * R * inner + j % inner;
    acc = strided_fold<Op, A>(lo + threadIdx.y, hi, kTileRows, combine_fn<Op, A>(),
                              [&](int64_t r) { return to_acc(xc[r * inner]); });
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < M) {
    A v = part[0][threadIdx.x];
    for (int y = 1; y < kTileRows; ++y) v = Op::combine(v, part[y][threadIdx.x]);
    partial[s * M + j] = v;
  }
  if (!arrive_last(finish_counter(counters + tile), unsigned(splits))) return;
  if (threadIdx.y == 0 && j < M) {
    A v = load_partial(partial + j);
    for (int64_t k = 1; k < splits; ++k) v = Op::combine(v, load_partial(partial + k * M + j));
    out[j] = result<Op, Out>(v, count, true);
  }
}

// Column sums (and means) of an (R, N) matrix with 16-byte loads, for f32 and 16-bit x into f32:
// each thread reads kWideColumns adjacent columns (8 of a 16-bit x, 4 of an f32 one) with one
// 16-byte load per row, so a warp reads 512 contiguous bytes of a row where reduce_columns_kernel's
// warp reads 32 elements (128 bytes of f32, 64 of a 16-bit x). x is 16-byte aligned and N a multiple
// of kWideColumns. Block (tile, s) of the (32, 8) blocks covers the tile's 32 * kWideColumns columns
// (256 or 128) and folds rows [s chunk, min(R, (s + 1) chunk)), threadIdx.y striding by 8; each
// column's 8 row partials are added in order y = 0..7 through shared memory into partial[s, j], and
// the tile's last block to finish adds the chunks in order s = 0, 1, ... (last_block.cuh) and writes
// Op::finish of it. Every column is summed in one fixed order: the same bits on every run.
constexpr int kWideLoadBytes = 16;
template <typename In>
constexpr int kWideColumns = kWideLoadBytes / int(sizeof(In));  // columns per thread
template <typename In>
constexpr int kWideTileColumns = kTileCols * kWideColumns<In>;  // columns per block
// Rows a thread loads before adding them: 4 for f32 (on an H200 15-35% faster than one at a time);
// 1 for 16-bit x, where batching by hand measured 5-30% slower than the plain loop.
template <typename In>
constexpr int kWideRowsInFlight = sizeof(In) == 4 ? 4 : 1;

template <typename Op, typename In>
__global__ void __launch_bounds__(kThreads)
    column_sums_wide_load_kernel(const In* __restrict__ x, float* __restrict__ partial, float* __restrict__ out,
                                 int64_t R, int64_t N, int64_t chunk, int64_t count, bool accumulate,
                                 int64_t counters) {
  grid_dependency_wait();
  constexpr int kCols = kWideColumns<In>, kTile = kWideTileColumns<In>, kInFlight = kWideRowsInFlight<In>;
  __shared__ float part[kTileRows][kTile + 1];
  const int64_t tile = blockIdx.x, s = blockIdx.y, splits = gridDim.y;
  const int64_t c0 = tile * kTile + threadIdx.x * kCols;  // N % kCols == 0: all kCols columns exist or none
  const int64_t lo = s * chunk, hi = lo + chunk < R ? lo + chunk : R;
  float acc[kCols];
#pragma unroll
  for (int k = 0; k < kCols; ++k) acc[k] = Op::identity();
  const auto add_row = [&](const uint4& v) {  // one row's kCols columns
    const In* e = reinterpret_cast<const In*>(&v);
#pragma unroll
    for (int k = 0; k < kCols; ++k) acc[k] = Op::combine(acc[k], to_acc(e[k]));
  };
  // Rows in increasing order, kInFlight rows' loads issued before the first of them is added.
  if (c0 < N) {
    int64_t r = lo + threadIdx.y;
    for (; r + (kInFlight - 1) * kTileRows < hi; r += kInFlight * kTileRows) {
      uint4 v[kInFlight];
#pragma unroll
      for (int q = 0; q < kInFlight; ++q)
        v[q] = __ldg(reinterpret_cast<const uint4*>(x + (r + q * kTileRows) * N + c0));
#pragma unroll
      for (int q = 0; q < kInFlight; ++q) add_row(v[q]);
    }
    for (; r < hi; r += kTileRows) add_row(__ldg(reinterpret_cast<const uint4*>(x + r * N + c0)));
  }
#pragma unroll
  for (int k = 0; k < kCols; ++k) part[threadIdx.y][threadIdx.x * kCols + k] = acc[k];
  __syncthreads();
  const int t = threadIdx.y * kTileCols + threadIdx.x;  // one column of the tile per thread from here
  const int64_t j = tile * kTile + t;
  const bool mine = t < kTile && j < N;
  if (mine) {
    float v = part[0][t];
    for (int y = 1; y < kTileRows; ++y) v = Op::combine(v, part[y][t]);
    partial[s * N + j] = v;
  }
  if (!arrive_last(finish_counter(counters + tile), unsigned(splits))) return;
  if (mine) {
    // The chunks' partials in order, kPartialsInFlight loads issued before the first is added: the
    // last block walks up to 64 of them from L2, one latency per batch rather than per partial.
    constexpr int kPartialsInFlight = 8;
    float v = load_partial(partial + j);
    int64_t k = 1;
    for (; k + kPartialsInFlight <= splits; k += kPartialsInFlight) {
      float p[kPartialsInFlight];
#pragma unroll
      for (int q = 0; q < kPartialsInFlight; ++q) p[q] = load_partial(partial + (k + q) * N + j);
#pragma unroll
      for (int q = 0; q < kPartialsInFlight; ++q) v = Op::combine(v, p[q]);
    }
    for (; k < splits; ++k) v = Op::combine(v, load_partial(partial + k * N + j));
    const float result = Op::finish(v, count);
    out[j] = accumulate ? out[j] + result : result;  // accumulate: out += the sums, as an add would
  }
}

// out[i] += v[i] for i < n (column_sums_into's accumulation where the wide-load kernel does not apply).
__global__ void add_into_kernel(float* __restrict__ out, const float* __restrict__ v, int64_t n) {
  grid_dependency_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = out[i] + v[i];
}

// ---- launchers ----

// out (outer * inner) = op over R of x (outer, R, inner), one launch, finished with `count`.
template <typename Op, typename In, typename Out>
void reduce_direct(const In* x, Out* out, int64_t outer, int64_t R, int64_t inner, int64_t count, cudaStream_t st) {
  if (inner == 1 && R > kShortRow && R <= kWarpRow) {
    launch_kernel(reduce_rows_warp_kernel<Op, In, Out>, grid_for(ceil_div(outer, kThreads / kWarp)), kThreads, 0, st, x,
                  out, outer, R, count, true);
  } else if (inner == 1 && R > kWarpRow) {
    launch_kernel(reduce_rows_block_kernel<Op, In, Out>, grid_for(outer), kThreads, 0, st, x, out, outer, R, 1, R,
                  count, true);
  } else {
    dim3 block(kTileCols, kTileRows);
    launch_kernel(reduce_columns_kernel<Op, In, Out>, grid_for(ceil_div(outer * inner, kTileCols)), block, 0, st, x,
                  out, outer, R, inner, R, count, true);
  }
  REEL_CUDA_LAUNCH_CHECK();
}

// Sums and means of f32 or 16-bit x into f32 can take column_sums_wide_load_kernel.
template <typename Op, typename In, typename Out>
constexpr bool kWideLoadOp = std::is_same_v<Out, float> && std::is_same_v<Acc<In>, float> &&
                             std::is_base_of_v<SumOp<float>, Op> && kWideLoadBytes % sizeof(In) == 0;

// out (N) = op over R of x (R, N) through column_sums_wide_load_kernel (its conditions there). The
// split count depends on the shape, the dtype's size and the SM count only, so a GPU gives the same
// bits on every run: enough chunks for about two blocks per SM, each of at least min_rows rows. Short
// chunks make the tile's last block, which adds every chunk's partial in order, the longest part of
// the launch (f32 (4096, 128) on an H200: 256 chunks of 16 rows 10.5 us, 64 chunks of 64 rows 5.4
// us; bf16 bias gradients, 100 launches in a graph: (4096, 512) 6.9 -> 6.2 us and (2048, 256)
// 6.2 -> 4.9 us going from 16 rows to 64, the others level; more blocks per SM or more rows in
// flight per thread measured slower). Both take 64 rows.
template <typename Op, typename In>
void column_sums_wide_load(const In* x, float* out, int64_t R, int64_t N, Device dev, cudaStream_t st,
                           bool accumulate = false) {
  const int64_t tiles = ceil_div(N, kWideTileColumns<In>), min_rows = 64;
  const int64_t want = ceil_div(2 * int64_t(multiprocessor_count(dev.index)), tiles);
  const int64_t chunk =
      ceil_div(R, std::max<int64_t>(1, std::min({want, ceil_div(R, min_rows), int64_t(65535)})));
  const int64_t splits = ceil_div(R, chunk);  // every chunk non-empty
  Tensor ws = workspace(size_t(splits * N) * sizeof(float), dev);
  const dim3 grid{unsigned(tiles), unsigned(splits)}, block{kTileCols, kTileRows};
  launch_kernel(column_sums_wide_load_kernel<Op, In>, grid, block, 0, st, x, static_cast<float*>(ws.data_ptr()), out, R,
                N, chunk, R, accumulate, finish_counter_base(st, dev));
  REEL_CUDA_LAUNCH_CHECK();
}

// Whether op over R of x (outer, R, inner) takes column_sums_wide_load (given kWideLoadOp).
template <typename In>
bool wide_load_fits(const In* x, int64_t outer, int64_t R, int64_t inner) {
  return outer == 1 && R > 0 && inner % kWideColumns<In> == 0 && reinterpret_cast<uintptr_t>(x) % kWideLoadBytes == 0 &&
         ceil_div(inner, kWideTileColumns<In>) <= kFinishCounterLaneSlots;
}

// out (outer * inner) = op over R of x (outer, R, inner); splits long reductions that would leave
// the GPU idle into two launches through an Acc workspace. Out is In's type, or f32 for a 16-bit In
// (the compiler's bias-gradient sums of a 16-bit gradient: compile/passes/fuse_bias_grad_cast.cpp).
template <typename Op, typename In, typename Out>
void reduce_into(const In* x, Out* out, int64_t outer, int64_t R, int64_t inner, Device dev, cudaStream_t st) {
  using A = Acc<In>;
  if (inner == 1 && R > kWarpRow) {
    const int64_t splits = std::max<int64_t>(1, std::min(ceil_div(R, kMinRowChunk), kTargetBlocks / outer));
    if (splits == 1) return reduce_direct<Op, In, Out>(x, out, outer, R, inner, R, st);
    // partial: (outer, splits), then reduced as rows of length splits (<= kTargetBlocks).
    const int64_t chunk = ceil_div(R, splits);
    Tensor ws = workspace(size_t(outer * splits) * sizeof(A), dev);
    A* partial = static_cast<A*>(ws.data_ptr());
    launch_kernel(reduce_rows_block_kernel<Op, In, A>, grid_for(outer * splits), kThreads, 0, st, x, partial, outer, R,
                  splits, chunk, R, false);
    REEL_CUDA_LAUNCH_CHECK();
    return reduce_direct<Op, A, Out>(partial, out, outer, splits, 1, R, st);
  }
  if (inner == 1 && R > kShortRow) return reduce_direct<Op, In, Out>(x, out, outer, R, inner, R, st);
  if constexpr (kWideLoadOp<Op, In, Out>) {
    if (inner > 1 && wide_load_fits(x, outer, R, inner)) return column_sums_wide_load<Op, In>(x, out, R, inner, dev, st);
  }
  // Columns (or short rows).
  const int64_t M = outer * inner, tiles = ceil_div(M, kTileCols);
  const int64_t splits =
      std::max<int64_t>(1, std::min({ceil_div(R, kMinColumnChunk), kTargetBlocks / tiles, int64_t(65535)}));
  if (splits == 1) return reduce_direct<Op, In, Out>(x, out, outer, R, inner, R, st);
  // partial: (splits, M), combined by each tile's last block. splits > 1 means tiles < kTargetBlocks.
  const int64_t chunk = ceil_div(R, splits);
  REEL_ASSERT(tiles <= kFinishCounterLaneSlots, "reduce: ", tiles, " column tiles exceed the finish counters");
  Tensor ws = workspace(size_t(splits * M) * sizeof(A), dev);
  A* partial = static_cast<A*>(ws.data_ptr());
  const dim3 grid{unsigned(tiles), unsigned(splits)}, block{kTileCols, kTileRows};
  launch_kernel(reduce_columns_split_kernel<Op, In, Out>, grid, block, 0, st, x, partial, out, outer, R, inner, chunk,
                R, finish_counter_base(st, dev));
  REEL_CUDA_LAUNCH_CHECK();
}

// x as (outer, reduced, inner) over a contiguous buffer (see the file comment); same rules as the CPU.
Tensor densify_on_device(const Tensor& t) { return contiguous_on_device(t); }

ReduceLayout reduce_layout(const Tensor& x, const std::vector<int64_t>& dims_attr) {
  return reel::reduce_layout(x, dims_attr, densify_on_device);
}

template <template <typename> class OpT>
void reduce_kernel(const KernelCall& c) {
  const Tensor& x = c.in[0];
  if (c.out[0].numel() == 0) return;
  ReduceLayout L = reduce_layout(x, c.attrs.has("dims") ? c.attrs.ints("dims") : std::vector<int64_t>{});
  DenseOut out(c.out[0]);
  visit_dtype(x.dtype(), [&]<typename T>() {
    using D = Dev<T>;
    if constexpr (std::is_same_v<D, int64_t> && std::is_same_v<OpT<int64_t>, MeanOp<int64_t>>) {
      throw Error("mean: dtype i64 is not supported (expected f32, f64, f16 or bf16)");
    } else {
      reduce_into<OpT<Acc<D>>, D, D>(in_ptr<D>(L.src), out_ptr<D>(out.buf), L.outer, L.reduced, L.inner, x.device(),
                                     stream_of(x));
    }
  });
  out.commit();
}

// ---- global norm ----

constexpr int kNormBatch = 32;           // inputs per partial-sum launch (pointers passed by value)
constexpr int64_t kNormMaxBlocks = 128;  // partial sums per input at most
constexpr int64_t kNormPerBlock = int64_t(kThreads) * 16;  // elements per block before another is added

template <typename D>
struct NormBatch {
  const D* x[kNormBatch];
  int64_t n[kNormBatch];
};

// partial: (inputs, blocks_per_input) doubles; block (b, k) writes partial[k, b], the sum of squares
// (in Acc) of input k's elements b * blockDim.x + t, stepping by gridDim.x * blockDim.x. With
// found_inf (attr check_finite), a block whose sum is not finite walks its elements again and sets
// the flag if one is inf or NaN (a finite sum has none; a sum that is not may be an overflow of
// finite squares): no cost to a step whose gradients are finite.
template <typename D>
__global__ void global_norm_partial_kernel(NormBatch<D> batch, double* partial, float* found_inf) {
  grid_dependency_wait();
  using A = Acc<D>;
  const int k = blockIdx.y;
  const D* x = batch.x[k];
  const int64_t n = batch.n[k];
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  A acc = strided_fold<AddOp<A>, A>(first, n, stride, combine_fn<AddOp<A>, A>(), [&](int64_t i) {
    const A v = to_acc(x[i]);
    return v * v;
  });
  acc = block_reduce<AddOp<A>>(acc);
  __shared__ bool rescan;
  if (threadIdx.x == 0) {
    partial[int64_t(k) * gridDim.x + blockIdx.x] = double(acc);
    rescan = found_inf && !isfinite(acc);
  }
  __syncthreads();
  if (!rescan) return;
  bool bad = false;
  for (int64_t i = first; i < n; i += stride) bad = bad || !isfinite(to_acc(x[i]));
  if (bad) *found_inf = 1.f;
}

// out (0-dim) = sqrt(sum of partial[0 .. n)), added in double by one block in a fixed order: thread t
// adds partial[t], partial[t + blockDim], ... in turn. Its loads go kFinalLoads at a time, all in
// flight before the adds (one at a time, each add waited on an L2 round trip: 17.5 us for gpt-small's
// 12928 partials); the adds keep their order, and a missing load adds +0.0, which leaves a sum of
// squares (>= +0 or NaN) as it was: the same bits.
constexpr int kFinalLoads = 8;
template <typename Out>
__global__ void global_norm_final_kernel(const double* partial, int64_t n, Out* out) {
  grid_dependency_wait();
  double acc = 0;
  for (int64_t i0 = threadIdx.x; i0 < n; i0 += int64_t(kFinalLoads) * blockDim.x) {
    double v[kFinalLoads];
#pragma unroll
    for (int j = 0; j < kFinalLoads; ++j) {
      const int64_t i = i0 + int64_t(j) * blockDim.x;
      v[j] = i < n ? partial[i] : 0.0;
    }
#pragma unroll
    for (int j = 0; j < kFinalLoads; ++j) acc += v[j];
  }
  acc = block_reduce<AddOp<double>>(acc);
  if (threadIdx.x == 0) *out = Out(sqrt(acc));
}

void global_norm_kernel(const KernelCall& c) {
  const Tensor& out = c.out[0];  // 0-dim: one element, whatever its strides
  const Device dev = out.device();
  cudaStream_t st = stream_of(out);
  const bool check = c.attrs.b("check_finite", false);  // then the last input is found_inf, c.out[1] in place
  float* found_inf = check ? static_cast<float*>(c.out[1].data_ptr()) : nullptr;
  std::vector<Tensor> xs;  // the non-empty inputs, contiguous
  int64_t largest = 0;
  for (size_t j = 0; j < c.in.size() - (check ? 1 : 0); ++j) {
    const Tensor& t = c.in[j];
    if (t.numel() > 0) {
      xs.push_back(contiguous_on_device(t));
      largest = std::max(largest, t.numel());
    }
  }
  const int64_t blocks = std::clamp<int64_t>(ceil_div(largest, kNormPerBlock), 1, kNormMaxBlocks);
  Tensor ws = workspace(std::max<size_t>(xs.size(), 1) * size_t(blocks) * sizeof(double), dev);
  double* partial = static_cast<double*>(ws.data_ptr());
  visit_float(c.in[0].dtype(), "global_norm", [&]<typename D>() {
    for (size_t k0 = 0; k0 < xs.size(); k0 += kNormBatch) {
      NormBatch<D> batch{};
      const int nb = int(std::min<size_t>(kNormBatch, xs.size() - k0));
      for (int k = 0; k < nb; ++k) {
        batch.x[k] = in_ptr<D>(xs[k0 + size_t(k)]);
        batch.n[k] = xs[k0 + size_t(k)].numel();
      }
      launch_kernel(global_norm_partial_kernel<D>, dim3(unsigned(blocks), unsigned(nb)), kThreads, 0, st, batch,
                    partial + int64_t(k0) * blocks, found_inf);
      REEL_CUDA_LAUNCH_CHECK();
    }
  });
  const int64_t n = int64_t(xs.size()) * blocks;
  if (out.dtype() == DType::f64)
    launch_kernel(global_norm_final_kernel<double>, 1, kThreads, 0, st, partial, n,
                  static_cast<double*>(out.data_ptr()));
  else
    launch_kernel(global_norm_final_kernel<float>, 1, kThreads, 0, st, partial, n, static_cast<float*>(out.data_ptr()));
  REEL_CUDA_LAUNCH_CHECK();
}

}  // namespace

void column_sums_into(const Tensor& x, const Tensor& out, bool accumulate) {
  const int64_t n = out.numel();
  REEL_CHECK(x.is_contiguous() && out.is_contiguous() && out.dtype() == DType::f32 && x.dim() >= 1 &&
                 x.shape().back() == n && n > 0,
             "column_sums_into: x ", shape_str(x.shape()), " ", dtype_name(x.dtype()), " and out ",
             shape_str(out.shape()), " ", dtype_name(out.dtype()),
             ": expected contiguous x (..., N) and a contiguous f32 out of N elements");
  // The Sum op's own route (reduce_into, outer = 1): an f32 x gives the Sum op's bits.
  visit_float(x.dtype(), "column_sums_into", [&]<typename D>() {
    if constexpr (std::is_same_v<Acc<D>, float>) {
      const D* px = static_cast<const D*>(x.data_ptr());
      float* po = static_cast<float*>(out.data_ptr());
      const int64_t R = x.numel() / n;
      const Device dev = x.device();
      cudaStream_t st = stream_of(x);
      if (!accumulate) return reduce_into<SumOp<float>, D, float>(px, po, 1, R, n, dev, st);
      // out += the sums: in the wide-load kernel's last write, else the sums first and then an add.
      if (n > 1 && wide_load_fits(px, 1, R, n)) return column_sums_wide_load<SumOp<float>, D>(px, po, R, n, dev, st, true);
      Tensor sums = workspace(sizeof(float) * size_t(n), dev);
      float* ps = static_cast<float*>(sums.data_ptr());
      reduce_into<SumOp<float>, D, float>(px, ps, 1, R, n, dev, st);
      launch_kernel(add_into_kernel, blocks_for(n), 256, 0, st, po, ps, n);
      REEL_CUDA_LAUNCH_CHECK();
    } else {
      throw Error("column_sums_into: x is f64; expected f32, f16 or bf16");
    }
  });
}

// softmax.cu, masked_softmax.cu and cross_entropy.cu
void register_softmax_cuda_kernels();
void register_masked_softmax_cuda_kernels();
void register_cross_entropy_cuda_kernels();

namespace {
// The fused column_sums op (schema in kernels/schema/reduce.cpp): out (=|+=) the sums of x's rows.
void column_sums_kernel(const KernelCall& c) {
  column_sums_into(contiguous_on_device(c.in[0]), c.out[0], c.attrs.b("accumulate", false));
}
}  // namespace

}  // namespace cuda

void register_reduce_cuda_kernels() {
  using namespace cuda;
  constexpr DeviceType gpu = DeviceType::CUDA;
  register_kernel(gpu, OpKind::Sum, reduce_kernel<SumOp>);
  register_kernel(gpu, OpKind::Mean, reduce_kernel<MeanOp>);
  register_kernel(gpu, OpKind::Max, reduce_kernel<MaxOp>);
  register_kernel(gpu, OpKind::GlobalNorm, global_norm_kernel);
  register_kernel(gpu, OpKind::ColumnSums, column_sums_kernel);
  register_softmax_cuda_kernels();
  register_masked_softmax_cuda_kernels();
  register_cross_entropy_cuda_kernels();
}

}  // namespace reel
