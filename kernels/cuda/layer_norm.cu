// CUDA kernels of layer norm: forward and backward, and the fused variants the compiler writes
// (layer_norm_cast: the residual add + the norm + the cast of its result to 16 bits;
// layer_norm_backward_add: the backward + the residual's gradient + its 16-bit copy + that copy's
// column sums, the bias gradient of the Linear before; in both, the dropout of the residual branch,
// its mask drawn in the kernel: RowDropout), with their registration.
//
// The math is the CPU's (kernels/cpu/norm.cpp), term by term:
//   mean = sum(x) / n      var = sum((x - mean)^2) / n   (biased, two passes: stable for large means)
//   rstd = 1 / sqrt(var + eps)     xhat = (x - mean) rstd     y = xhat w + b   (w = 1, b = 0 if absent)
//   backward, gw = g w, means over the same set of n values:
//   dx = rstd (gw - mean(gw) - xhat mean(gw xhat))     dw = sum(g xhat)     db = sum(g)
// Statistics accumulate in A = Acc<D> (f32 for f32/f16/bf16, f64 for f64); mean and rstd outputs are A.
// dw and db are always produced; without w they are the gradients w = 1 would get.
// Inputs of any strides are first made contiguous on the device; strided outputs are computed into
// temporaries and copied (norm_common.cuh). The fused variants give the unfused chain's bits (the
// column sums: up to f32 rounding, in a fixed order). Their addend (forward) and g (backward) may be
// 16-bit with f32 x, a GEMM's result read as its exact f32 widening (the bits of the f32 copy).
//
// Launch shapes, x viewed as (rows, cols):
//   a team of threads per row, a warp (8 rows per 256-thread block) when cols <= 1024, else a
//     512-thread block per row. The team reads its row three times (sum, squared deviations,
//     output); the row is hot in L1/L2 after the first pass.
//   f32 rows of 128 k columns (k <= 8) with 16-byte-aligned operands: a warp per row that loads its
//     row once into registers as float4 (layer_norm_*_vec_kernel, below);
//     the backward also sums each column's g xhat and g over the rows of its block there (warps
//     added in order through shared memory), and layer_norm_param_finish_kernel adds the blocks'
//     partials: dw, db without reading g and x again. The backward's grid is one wave of resident
//     blocks, each warp with its next row's loads in flight while it computes the current one.
//   dw, db otherwise: a deterministic two-stage column reduction in one launch (the last block of a
//     column tile does stage 2 for it: kernels/cuda/last_block.cuh). Stage 1 tiles (rows, cols) into
//     blocks of 32 columns x one chunk of rows (32 x 8 threads; the 32 lanes read 32 adjacent columns,
//     so loads are coalesced) and writes partial sums (chunks, cols); stage 2 sums the chunks of each
//     column in order. No float atomics, so results do not change from run to run.
#include <cstdint>
#include <initializer_list>
#include <optional>

#include "kernels/cuda/column_sums.h"
#include "kernels/cuda/last_block.cuh"
#include "kernels/cuda/layer_norm_rows.cuh"
#include "kernels/cuda/norm_common.cuh"
#include "kernels/philox_args.h"
#include "tensor/rng.h"

namespace reel {
namespace cuda {
namespace {

using namespace norm_detail;

// x, y: (rows, cols); w, b: (cols) or null; mean, rstd: (rows). One RowTeam per row. y is of x's dtype
// D, or 16-bit (O) when the compiler fused autocast's cast of y into the norm (layer_norm_cast).
// With `addend` (addend_rows, cols) the norm is of x + addend, row r of x adding row r % addend_rows
// (the addend broadcast over x's leading dims: a position table over the batch), rounded to D as an
// add op would store it, and that sum is also written to sum_out (the residual stream a block passes on).
template <bool kWarp, typename D, typename O = D, typename A = Acc<D>>
__global__ void layer_norm_fwd_rows_kernel(const D* x, const D* addend, int64_t addend_rows, D* sum_out, const D* w,
                                           const D* b, O* y, A* mean, A* rstd, int64_t rows, int64_t cols, A eps,
                                           RowDropout drop) {
  grid_dependency_wait();
  using Team = RowTeam<kWarp>;
  for (int64_t r = Team::first_row(); r < rows; r += Team::row_step()) {
    const D* xr = x + r * cols;
    const D* ar = addend ? addend + (r % addend_rows) * cols : nullptr;
    O* yr = y + r * cols;
    // The addend, times its dropout mask (as mul stores it) when the op has one.
    auto add = [&](int64_t j) -> A {
      return drop.on ? to_acc(from_acc<D>(drop.times_mask(to_acc(ar[j]), r * cols + j))) : to_acc(ar[j]);
    };
    auto xin = [&](int64_t j) -> A { return ar ? to_acc(from_acc<D>(to_acc(xr[j]) + add(j))) : to_acc(xr[j]); };
    A s = 0;
    for (int64_t j = Team::rank(); j < cols; j += Team::size()) {
      const A v = xin(j);
      if (sum_out) sum_out[r * cols + j] = from_acc<D>(v);
      s += v;
    }
    const A mu = Team::sum(s) / A(cols);  // cols == 0 gives NaN, as on the CPU
    A q = 0;
    for (int64_t j = Team::rank(); j < cols; j += Team::size()) {
      A d = xin(j) - mu;
      q += d * d;
    }
    const A rs = inv_std(Team::sum(q) / A(cols), eps);
    if (Team::rank() == 0) {
      mean[r] = mu;
      rstd[r] = rs;
    }
    for (int64_t j = Team::rank(); j < cols; j += Team::size()) {
      A v = (xin(j) - mu) * rs;
      if (w) v *= to_acc(w[j]);
      if (b) v += to_acc(b[j]);
      yr[j] = from_acc<O>(v);
    }
  }
}

// dx of each row, plus `residual` when given, and also rounded to O into dx16 when given
// (layer_norm_bwd_add). g, x, dx, residual, dx16: (rows, cols); w: (cols) or null; mean, rstd: (rows).
template <bool kWarp, typename D, typename O = D, typename A = Acc<D>>
__global__ void layer_norm_bwd_dx_rows_kernel(const D* g, const D* x, const D* w, const A* mean, const A* rstd,
                                              const D* residual, D* dx, O* dx16, int64_t rows, int64_t cols,
                                              RowDropout drop) {
  grid_dependency_wait();
  using Team = RowTeam<kWarp>;
  for (int64_t r = Team::first_row(); r < rows; r += Team::row_step()) {
    const D *gr = g + r * cols, *xr = x + r * cols;
    D* dxr = dx + r * cols;
    const A mu = mean[r], rs = rstd[r];
    A s_gw = 0, s_gwx = 0;
    for (int64_t j = Team::rank(); j < cols; j += Team::size()) {
      A gj = to_acc(gr[j]), xh = (to_acc(xr[j]) - mu) * rs, gw = w ? gj * to_acc(w[j]) : gj;
      s_gw += gw;
      s_gwx += gw * xh;
    }
    const A mean_gw = Team::sum(s_gw) / A(cols), mean_gwx = Team::sum(s_gwx) / A(cols);
    for (int64_t j = Team::rank(); j < cols; j += Team::size()) {
      A gj = to_acc(gr[j]), xh = (to_acc(xr[j]) - mu) * rs, gw = w ? gj * to_acc(w[j]) : gj;
      const D v = from_acc<D>(rs * (gw - mean_gw - xh * mean_gwx));
      const D out = residual ? from_acc<D>(to_acc(v) + to_acc(residual[r * cols + j])) : v;
      dxr[j] = out;
      if (dx16) dx16[r * cols + j] = from_acc<O>(drop.on ? drop.times_mask(to_acc(out), r * cols + j) : to_acc(out));
    }
  }
}

constexpr int kColTile = 32;   // columns per block of the partial kernel (one per lane)
constexpr int kColRowThreads = 8;  // threads along the rows of a chunk

// dw, db of layer norm in one launch. Block (blockIdx.x, blockIdx.y) = (columns 32 bx .. 32 bx + 31,
// chunk by of rows_per_chunk rows); thread (tx, ty) sums rows ty, ty + 8, ... of the chunk in column
// 32 bx + tx into the chunk's partials, and the last of a column tile's chunks to finish adds the
// tile's partials in chunk order (kernels/cuda/last_block.cuh).
// g, x: (rows, cols); mean, rstd: (rows); dw_part, db_part: (chunks, cols); dw, db: (cols).
template <typename D, typename A = Acc<D>>
__global__ void layer_norm_bwd_param_kernel(const D* g, const D* x, const A* mean, const A* rstd, int64_t rows,
                                            int64_t cols, int64_t rows_per_chunk, A* dw_part, A* db_part, D* dw,
                                            D* db) {
  grid_dependency_wait();
  __shared__ A s_dw[kColRowThreads][kColTile + 1], s_db[kColRowThreads][kColTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = int64_t(blockIdx.x) * kColTile + tx, chunk = blockIdx.y, chunks = gridDim.y;
  const int64_t r0 = chunk * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
  A sw = 0, sb = 0;
  if (j < cols) {
    for (int64_t r = r0 + ty; r < r1; r += kColRowThreads) {
      A gv = to_acc(g[r * cols + j]);
      sw += gv * ((to_acc(x[r * cols + j]) - mean[r]) * rstd[r]);
      sb += gv;
    }
  }
  s_dw[ty][tx] = sw;
  s_db[ty][tx] = sb;
  __syncthreads();
  if (ty == 0 && j < cols) {
    for (int k = 1; k < kColRowThreads; ++k) {
      sw += s_dw[k][tx];
      sb += s_db[k][tx];
    }
    if (chunks == 1) {  // the block's sums are the results
      dw[j] = from_acc<D>(sw);
      db[j] = from_acc<D>(sb);
    } else {
      dw_part[chunk * cols + j] = sw;
      db_part[chunk * cols + j] = sb;
    }
  }
  if (chunks == 1 || !arrive_last(finish_counter(blockIdx.x), unsigned(chunks))) return;
  if (ty == 0 && j < cols) {
    A tw = 0, tb = 0;
    for (int64_t p = 0; p < chunks; ++p) {
      tw += load_partial(dw_part + p * cols + j);
      tb += load_partial(db_part + p * cols + j);
    }
    dw[j] = from_acc<D>(tw);
    db[j] = from_acc<D>(tb);
  }
}

// Launches a rows kernel with a warp per row for short rows, else a block per row.
constexpr int64_t kWarpRowMaxCols = 1024;
constexpr int kRowsThreads = 256, kBlockRowThreads = 512;

template <typename WarpKernel, typename BlockKernel, typename... Args>
void launch_rows(WarpKernel warp_kernel, BlockKernel block_kernel, int64_t rows, int64_t cols, cudaStream_t s,
                 Args... args) {
  if (cols <= kWarpRowMaxCols) {
    constexpr int rows_per_block = kRowsThreads / 32;
    launch_kernel(warp_kernel, grid_for((rows + rows_per_block - 1) / rows_per_block), kRowsThreads, 0, s, args...);
  } else {
    launch_kernel(block_kernel, grid_for(rows), kBlockRowThreads, 0, s, args...);
  }
  REEL_CUDA_LAUNCH_CHECK();
}

// Layer norm's forward of x (rows, cols) into y (O), by the row-in-registers kernel where it applies.
template <typename D, typename O, typename A = Acc<D>>
void launch_layer_norm_fwd(const D* x, const D* addend, int64_t addend_rows, D* sum_out, const D* w, const D* b, O* y,
                           A* mean, A* rstd, int64_t rows, int64_t cols, A eps, cudaStream_t s, RowDropout drop = {}) {
  if constexpr (std::is_same_v<D, float>) {
    const bool vec =
        rows > 0 &&
        visit_vec_row(cols, {x, addend, sum_out, w, b, sizeof(O) == 4 ? y : nullptr}, {sizeof(O) == 2 ? y : nullptr},
                      [&]<int K>() {
                        launch_kernel(layer_norm_fwd_vec_kernel<K, O>, grid_for((rows + 7) / 8), 256, 0, s, x, addend,
                                      addend_rows, sum_out, w, b, y, mean, rstd, rows, eps, drop);
                      });
    if (vec) {
      REEL_CUDA_LAUNCH_CHECK();
      return;
    }
  }
  launch_rows(layer_norm_fwd_rows_kernel<true, D, O>, layer_norm_fwd_rows_kernel<false, D, O>, rows, cols, s, x, addend,
              addend_rows, sum_out, w, b, y, mean, rstd, rows, cols, eps, drop);
}

void layer_norm_fwd(const KernelCall& c) {
  Tensor x = contiguous_on_device(c.in[0]), w = contiguous_on_device(c.in[1]), b = contiguous_on_device(c.in[2]);
  const Tensor &y = c.out[0], &mean = c.out[1], &rstd = c.out[2];
  const int64_t rows = mean.numel(), cols = rows ? x.numel() / rows : 0;
  if (rows == 0) return;
  visit_float(x.dtype(), "layer_norm", [&]<typename D>() {
    using A = Acc<D>;
    launch_layer_norm_fwd<D, D>(in_ptr<D>(x), nullptr, 1, nullptr, in_ptr<D>(w), in_ptr<D>(b), out_ptr<D>(y),
                                out_ptr<A>(mean), out_ptr<A>(rstd), rows, cols, A(c.attrs.f("eps")), stream_of(x));
  });
}

// Chunks of rows for stage 1 of dw, db: enough blocks to fill the GPU (about 1024), each chunk at
// least 32 rows so that the partials stay small next to the input.
int64_t param_chunks(int64_t rows, int64_t cols) {
  int64_t col_tiles = (cols + kColTile - 1) / kColTile;
  int64_t want = std::max<int64_t>(1, 1024 / col_tiles);
  return std::max<int64_t>(1, std::min(want, (rows + 31) / 32));
}

// The operands of the row-in-registers backward (layer_norm_rows.cuh), as raw pointers: null for an
// absent one, and for every one of a call the compiler plans without memory (meta tensors, whose
// blocks the plan's arena aligns to 256 bytes).
struct VecBackwardOperands {
  const void* g;  // f32, or 16-bit (g16: a GEMM's input gradient, widened as it is loaded)
  bool g16;
  const float *x, *w, *residual;
  float* dx;
  void* dx16;                      // the 16-bit copy
  std::optional<DType> dtype16;    // its dtype, none without a copy
  bool sums16;                     // also dx16's column sums (the bias gradient of the Linear before)
};

// Calls fn.template operator()<K, O, kSums, G>() for the row-in-registers backward kernel that takes
// these operands (O the copy's type, float without one; kSums 3 with the copy's sums), when it
// applies (visit_vec_row: f32 rows of 128 K columns, aligned operands); false, calling nothing,
// otherwise.
template <typename G, typename Fn>
bool visit_vec_backward(const VecBackwardOperands& o, int64_t cols, Fn&& fn) {
  auto run = [&]<typename O>() {
    const O* p16 = static_cast<const O*>(o.dx16);
    return visit_vec_row(cols, {o.g16 ? nullptr : o.g, o.x, o.w, o.residual, o.dx}, {p16, o.g16 ? o.g : nullptr},
                         [&]<int K>() {
                           if constexpr (std::is_same_v<O, float>) fn.template operator()<K, O, 2, G>();
                           else if (o.sums16) fn.template operator()<K, O, 3, G>();
                           else fn.template operator()<K, O, 2, G>();
                         });
  };
  if (!o.dtype16) return run.template operator()<float>();
  return *o.dtype16 == DType::bf16 ? run.template operator()<__nv_bfloat16>() : run.template operator()<__half>();
}

// Its grid: one wave of resident blocks (as many per SM as the kernel's registers allow, a row per
// warp at most), each block adding one row of partial sums. A second wave would leave the first
// wave's SMs idle while it runs (gpt-small's rows, 150 registers a thread: one block per SM).
template <int K, typename O, int kSums, typename G>
int64_t vec_backward_blocks(int64_t rows, int device) {
  const int per_sm = resident_blocks_per_sm(layer_norm_bwd_vec_kernel<K, O, kSums, G>, 256);
  return std::max<int64_t>(1, std::min<int64_t>((rows + 7) / 8, int64_t(per_sm) * multiprocessor_count(device)));
}

template <int K, typename O, int kSums, typename G>
void launch_vec_backward(const VecBackwardOperands& o, const float* pm, const float* pr, float* part, int64_t blocks,
                         int64_t rows, cudaStream_t s, RowDropout drop) {
  launch_kernel(layer_norm_bwd_vec_kernel<K, O, kSums, G>, unsigned(blocks), 256, 0, s, static_cast<const G*>(o.g),
                o.x, o.w, pm, pr, o.residual, o.dx, static_cast<O*>(o.dx16), part, rows, drop);
  REEL_CUDA_LAUNCH_CHECK();
}

// dw[j], db[j] (and sums16[j], added to it with `accumulate`) from `parts` rows of partial sums
// part (parts, kSums, cols).
template <int kSums>
void launch_param_finish(const float* part, int64_t parts, int64_t cols, float* dw, float* db, float* sums16,
                         bool accumulate, cudaStream_t s) {
  launch_kernel(layer_norm_param_finish_kernel<kSums>, unsigned((cols + kFinishCols - 1) / kFinishCols),
                dim3(kFinishCols, kFinishRows), 0, s, part, parts, cols, dw, db, sums16, accumulate);
  REEL_CUDA_LAUNCH_CHECK();
}

// dx (+ residual) and dw, db of f32 rows in one pass, with the row-in-registers kernel
// (layer_norm_rows.cuh) and the finish kernel that adds its blocks' partials; false, with nothing
// launched, where those kernels do not apply (see visit_vec_row). With sums16 (cols, f32; dx16 given)
// the same pass also sums dx16's values per column into it (added to it with `accumulate`).
// g is f32 or 16-bit (G), widened as it is loaded.
template <typename G>
bool layer_norm_bwd_vec(const G* pg, const float* px, const float* pw, const float* pm, const float* pr,
                        const float* presidual, const Tensor& dx, const Tensor& dx16, const Tensor& dw,
                        const Tensor& db, const Tensor& sums16, bool accumulate, int64_t rows, int64_t cols,
                        cudaStream_t s, RowDropout drop) {
  if (rows == 0) return false;
  const VecBackwardOperands o{pg,
                              !std::is_same_v<G, float>,
                              px,
                              pw,
                              presidual,
                              out_ptr<float>(dx),
                              dx16.defined() ? dx16.data_ptr() : nullptr,
                              dx16.defined() ? std::optional<DType>(dx16.dtype()) : std::nullopt,
                              sums16.defined()};
  return visit_vec_backward<G>(o, cols, [&]<int K, typename O, int kSums, typename>() {
    const int64_t blocks = vec_backward_blocks<K, O, kSums, G>(rows, dx.device().index);
    Tensor part = workspace(sizeof(float) * size_t(blocks * kSums * cols), dx.device());
    float* pp = out_ptr<float>(part);
    launch_vec_backward<K, O, kSums, G>(o, pm, pr, pp, blocks, rows, s, drop);
    launch_param_finish<kSums>(pp, blocks, cols, out_ptr<float>(dw), out_ptr<float>(db),
                               kSums == 3 ? out_ptr<float>(sums16) : nullptr, accumulate, s);
  });
}

// A 16-bit tensor's exact f32 widening, in a new contiguous tensor on its device.
Tensor widened_on_device(const Tensor& t) {
  Tensor w = Tensor::empty(t.shape(), DType::f32, t.device());
  copy_on_device(w, t);
  return w;
}

// dx (+ residual, when defined) into dx (and its 16-bit copy into dx16, when defined), and dw, db;
// with sums16, dx16's column sums into it (added to it with `accumulate`). dx, dx16, dw, db, sums16
// contiguous. g is of x's dtype, or 16-bit with an f32 x (read as its widening: by the
// row-in-registers kernel as it loads, elsewhere through an f32 copy).
void layer_norm_bwd_into(const Tensor& g_in, const Tensor& x_in, const Tensor& w_in, const Tensor& mean_in,
                         const Tensor& rstd_in, const Tensor& residual_in, const Tensor& dx, const Tensor& dx16,
                         const Tensor& dw, const Tensor& db, const Tensor& sums16 = Tensor(),
                         bool accumulate = false, RowDropout drop = {}) {
  Tensor g = contiguous_on_device(g_in), x = contiguous_on_device(x_in), w = contiguous_on_device(w_in);
  Tensor mean = contiguous_on_device(mean_in), rstd = contiguous_on_device(rstd_in);
  Tensor residual = contiguous_on_device(residual_in);
  // k = x.dim() - mean.dim() trailing dims are normalised: rows = numel(mean), cols = numel(dw).
  const int64_t rows = mean.numel(), cols = dw.numel();
  if (cols == 0) return;
  cudaStream_t s = stream_of(x);
  if (g.dtype() != x.dtype()) {  // a 16-bit g for an f32 x (layer_norm_backward_add)
    REEL_CHECK(x.dtype() == DType::f32 && (g.dtype() == DType::bf16 || g.dtype() == DType::f16),
               "layer_norm_backward: gradient ", shape_str(g.shape()), " ", g.dtype(), " for x ", shape_str(x.shape()),
               " ", x.dtype(), ": a gradient of another dtype than x's must be bf16/f16 with an f32 x");
    auto vec = [&]<typename G>() {
      return layer_norm_bwd_vec(in_ptr<G>(g), in_ptr<float>(x), in_ptr<float>(w), in_ptr<float>(mean),
                                in_ptr<float>(rstd), in_ptr<float>(residual), dx, dx16, dw, db, sums16, accumulate,
                                rows, cols, s, drop);
    };
    if (g.dtype() == DType::bf16 ? vec.template operator()<__nv_bfloat16>() : vec.template operator()<__half>()) return;
    g = widened_on_device(g);
  }
  visit_float(x.dtype(), "layer_norm_backward", [&]<typename D>() {
    using A = Acc<D>;
    const D *pg = in_ptr<D>(g), *px = in_ptr<D>(x);
    const A *pm = in_ptr<A>(mean), *pr = in_ptr<A>(rstd);
    if constexpr (std::is_same_v<D, float>) {  // dx and the partial dw, db in one pass, where it applies
      if (layer_norm_bwd_vec(pg, px, in_ptr<float>(w), pm, pr, in_ptr<float>(residual), dx, dx16, dw, db, sums16,
                             accumulate, rows, cols, s, drop))
        return;
    }
    auto launch_dx = [&]<typename O>(O* p16) {
      launch_rows(layer_norm_bwd_dx_rows_kernel<true, D, O>, layer_norm_bwd_dx_rows_kernel<false, D, O>, rows, cols,
                  s, pg, px, in_ptr<D>(w), pm, pr, in_ptr<D>(residual), out_ptr<D>(dx), p16, rows, cols, drop);
    };
    if (rows > 0) {
      if (!dx16.defined()) launch_dx(static_cast<D*>(nullptr));
      else if (dx16.dtype() == DType::bf16) launch_dx(out_ptr<__nv_bfloat16>(dx16));
      else launch_dx(out_ptr<__half>(dx16));
    }
    // Past the finish counters (over 131072 columns) every column tile takes all rows in one block.
    const int64_t chunks = (cols + kColTile - 1) / kColTile > kFinishCounterLaneSlots ? 1 : param_chunks(rows, cols);
    const int64_t rows_per_chunk = std::max<int64_t>(1, (rows + chunks - 1) / chunks);
    // part: (2, chunks, cols) = dw partials, then db partials.
    Tensor part = Tensor::empty({2, chunks, cols}, mean.dtype(), x.device());
    A* pp = out_ptr<A>(part);
    const int64_t col_tiles = (cols + kColTile - 1) / kColTile;
    const dim3 grid{unsigned(col_tiles), unsigned(chunks)}, block{kColTile, kColRowThreads};
    launch_kernel(layer_norm_bwd_param_kernel<D>, grid, block, 0, s, pg, px, pm, pr, rows, cols, rows_per_chunk, pp,
                  pp + chunks * cols, out_ptr<D>(dw), out_ptr<D>(db));
    REEL_CUDA_LAUNCH_CHECK();
    // Outside the row-in-registers kernel, dx16's column sums are a launch of their own: over its
    // rows of cols normalised values, as that kernel sums them (the last dim alone when
    // normalized_ndim is 1).
    if (sums16.defined()) column_sums_into(dx16.view({rows, cols}), sums16, accumulate);
  });
}

void layer_norm_bwd(const KernelCall& c) {
  layer_norm_bwd_into(c.in[0], c.in[1], c.in[2], c.in[3], c.in[4], Tensor(), c.out[0], Tensor(), c.out[1], c.out[2]);
}

// ---------------------------------------------------------------- fused variants

void layer_norm_fwd_16(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, double eps, const Tensor& y16,
                       const Tensor& mean, const Tensor& rstd, const Tensor& addend_in, const Tensor& sum_out,
                       RowDropout drop) {
  REEL_CHECK(x_in.dtype() == DType::f32 && (y16.dtype() == DType::bf16 || y16.dtype() == DType::f16) &&
                 y16.is_contiguous() && mean.is_contiguous() && rstd.is_contiguous() && y16.numel() == x_in.numel(),
             "layer_norm_fwd_16: x ", shape_str(x_in.shape()), " ", x_in.dtype(), " into y ", shape_str(y16.shape()),
             " ", y16.dtype(), ": expects f32 x and a contiguous 16-bit y of its size");
  const bool addend16 = addend_in.defined() && addend_in.dtype() != DType::f32;
  const int64_t rows = mean.numel(), cols = rows ? x_in.numel() / rows : 0;
  // The addend's rows: x's (its shape), or fewer that x's rows repeat (a suffix of x's shape: broadcast
  // over the leading dims, without dropout, whose mask is over x's elements).
  const int64_t addend_rows = addend_in.defined() && cols > 0 ? addend_in.numel() / cols : rows;
  const bool suffix = addend_in.defined() && addend_in.dim() <= x_in.dim() &&
                      is_trailing_suffix(addend_in.shape(), x_in.shape()) && addend_rows > 0 &&
                      rows % addend_rows == 0 && (addend_rows == rows || !drop.on);
  REEL_CHECK(addend_in.defined() == sum_out.defined() &&
                 (!addend_in.defined() || (suffix &&
                                           (addend_in.dtype() == DType::f32 || addend_in.dtype() == DType::bf16 ||
                                            addend_in.dtype() == DType::f16) &&
                                           !(addend16 && drop.on) && sum_out.shape() == x_in.shape() &&
                                           sum_out.dtype() == DType::f32 && sum_out.is_contiguous())),
             "layer_norm_fwd_16: addend ", shape_str(addend_in.shape()), " ", addend_in.dtype(), " and sum ",
             shape_str(sum_out.shape()), " must both be given, the addend of x's shape ", shape_str(x_in.shape()),
             " or a suffix of it (f32, or bf16/f16, without dropout unless of x's shape), the sum f32, contiguous, "
             "of x's shape");
  Tensor x = contiguous_on_device(x_in), w = contiguous_on_device(w_in), b = contiguous_on_device(b_in);
  Tensor addend = contiguous_on_device(addend_in);
  if (rows == 0) return;
  auto launch = [&]<typename O>() {
    if (addend16) {
      // A 16-bit addend (a GEMM's result): the row-in-registers kernel widens it as it loads it;
      // elsewhere it is widened into an f32 copy first.
      const float *px = in_ptr<float>(x), *pw = in_ptr<float>(w), *pb = in_ptr<float>(b);
      float* ps = out_ptr<float>(sum_out);
      O* py = out_ptr<O>(y16);
      auto vec = [&]<typename Ad>() {
        const Ad* pa = in_ptr<Ad>(addend);
        return visit_vec_row(cols, {px, pw, pb, ps}, {py, pa}, [&]<int K>() {
          launch_kernel(layer_norm_fwd_vec_kernel<K, O, Ad>, grid_for((rows + 7) / 8), 256, 0, stream_of(x), px, pa,
                        addend_rows, ps, pw, pb, py, out_ptr<float>(mean), out_ptr<float>(rstd), rows, float(eps),
                        drop);
        });
      };
      if (addend.dtype() == DType::bf16 ? vec.template operator()<__nv_bfloat16>()
                                        : vec.template operator()<__half>()) {
        REEL_CUDA_LAUNCH_CHECK();
        return;
      }
      addend = widened_on_device(addend);
    }
    launch_layer_norm_fwd<float, O>(in_ptr<float>(x), in_ptr<float>(addend), addend_rows,
                                    sum_out.defined() ? out_ptr<float>(sum_out) : nullptr, in_ptr<float>(w),
                                    in_ptr<float>(b), out_ptr<O>(y16), out_ptr<float>(mean), out_ptr<float>(rstd), rows,
                                    cols, float(eps), stream_of(x), drop);
  };
  if (y16.dtype() == DType::bf16) launch.template operator()<__nv_bfloat16>();
  else launch.template operator()<__half>();
}

void layer_norm_bwd_add(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                        const Tensor& residual, const Tensor& out, const Tensor& dw, const Tensor& db,
                        const Tensor& out16, const Tensor& sums16, bool accumulate, RowDropout drop) {
  REEL_CHECK(!out16.defined() || (out16.shape() == x.shape() && out16.is_contiguous() &&
                                  (out16.dtype() == DType::bf16 || out16.dtype() == DType::f16)),
             "layer_norm_bwd_add: the 16-bit copy ", shape_str(out16.shape()), " ", out16.dtype(),
             " must be a contiguous bf16 or f16 tensor of x's shape ", shape_str(x.shape()));
  REEL_CHECK((!residual.defined() || (residual.shape() == x.shape() && residual.dtype() == x.dtype())) &&
                 out.shape() == x.shape() && out.dtype() == x.dtype() && out.is_contiguous() && dw.is_contiguous() &&
                 db.is_contiguous(),
             "layer_norm_bwd_add: x ", shape_str(x.shape()), " ", x.dtype(), ", residual ", shape_str(residual.shape()),
             " ", residual.dtype(), ", out ", shape_str(out.shape()), " ", out.dtype(),
             ": expects a residual (or none) of x's shape and dtype and a contiguous out of them");
  REEL_CHECK(!sums16.defined() || (out16.defined() && sums16.dtype() == DType::f32 && sums16.is_contiguous() &&
                                    sums16.numel() == dw.numel()),
             "layer_norm_bwd_add: the column sums ", shape_str(sums16.shape()), " ", sums16.dtype(),
             " must be a contiguous f32 tensor of ", dw.numel(), " elements (one per normalised column of x ",
             shape_str(x.shape()), "), summing a 16-bit copy that is asked for", out16.defined() ? "" : " (none is)");
  layer_norm_bwd_into(g, x, w, mean, rstd, residual, out, out16, dw, db, sums16, accumulate, drop);
}

// The fused ops' kernels (kernels/ops.def; schemas in kernels/schema/norm.cpp).
void layer_norm_cast_kernel(const KernelCall& c) {
  const bool add = c.in.size() >= 4 && c.in[3].defined();
  layer_norm_fwd_16(c.in[0], c.in[1], c.in[2], c.attrs.f("eps"), c.out[0], c.out[1], c.out[2],
                    add ? c.in[3] : Tensor(), add ? c.out[3] : Tensor(), row_dropout_of(c));
}

void layer_norm_backward_add_kernel(const KernelCall& c) {
  const bool copy16 = c.attrs.has("dtype"), sums = c.attrs.b("column_sums", false);
  layer_norm_bwd_add(c.in[0], c.in[1], c.in[2], c.in[3], c.in[4], c.in[5], c.out[0], c.out[1], c.out[2],
                     copy16 ? c.out[3] : Tensor(), sums ? c.out[4] : Tensor(), c.attrs.b("accumulate", false),
                     row_dropout_of(c));
}

// ---------------------------------------------------------------- the backward's sums in a node of their own
// layer_norm_backward_partials and layer_norm_param_sums (schema/norm.cpp): the row-in-registers
// backward alone, its blocks' partial sums left in part (parts, S, cols), and the finish kernel that
// adds them up, as two nodes (compile/passes/split_norm_param_sums.h puts the second on the side
// stream). parts is the backward's grid, which the compiler sized by layer_norm_backward_parts (one
// wave of resident blocks on this GPU): the same kernels, blocks and order of sums as
// layer_norm_backward_add's one node, so the same bits.

// Calls fn.template operator()<K, O, kSums, G>(operands) when the row-in-registers backward takes a
// layer_norm_backward_partials call of these inputs (g, x, w?, mean, rstd, residual?) and attrs:
// contiguous operands, x f32, rows of 128 to 1024 columns (a multiple of 128). Without outputs (a call
// being planned: no memory yet) the pointers are null and the views' offsets stand for their
// alignment, the plan's arena aligning every block to 256 bytes; with them, their addresses.
template <typename Fn>
bool visit_partials(const std::vector<Tensor>& in, const Attrs& a, const Tensor* out, const Tensor* out16, Fn&& fn) {
  if (in.size() < 6 || !in[0].defined() || !in[1].defined() || in[1].dtype() != DType::f32 || in[1].dim() < 1)
    return false;
  const Tensor &g = in[0], &x = in[1], &w = in[2], &mean = in[3], &rstd = in[4], &residual = in[5];
  for (const Tensor* t : {&g, &x, &w, &mean, &rstd, &residual})
    if (t->defined() && (!t->is_contiguous() || t->offset() * int64_t(dtype_size(t->dtype())) % 16 != 0)) return false;
  if ((w.defined() && w.dtype() != DType::f32) || (residual.defined() && residual.dtype() != DType::f32)) return false;
  const bool real = out != nullptr;
  auto ptr = [&](const Tensor& t) -> const void* { return real && t.defined() ? t.data_ptr() : nullptr; };
  const VecBackwardOperands o{ptr(g),
                              g.dtype() != DType::f32,
                              static_cast<const float*>(ptr(x)),
                              static_cast<const float*>(ptr(w)),
                              static_cast<const float*>(ptr(residual)),
                              real ? out_ptr<float>(*out) : nullptr,
                              real && out16 ? out16->data_ptr() : nullptr,
                              a.has("dtype") ? std::optional<DType>(a.dtype("dtype")) : std::nullopt,
                              a.b("column_sums", false)};
  auto visit = [&]<typename G>() {
    return visit_vec_backward<G>(o, x.shape().back(),
                                 [&]<int K, typename O, int kSums, typename>() { fn.template operator()<K, O, kSums, G>(o); });
  };
  switch (g.dtype()) {
    case DType::f32: return visit.template operator()<float>();
    case DType::bf16: return visit.template operator()<__nv_bfloat16>();
    case DType::f16: return visit.template operator()<__half>();
    default: return false;
  }
}

// The blocks layer_norm_backward_partials runs (its parts) for a call: the row-in-registers backward's
// one wave on this GPU; 0 where that kernel does not take the call.
int64_t layer_norm_backward_parts(const std::vector<Tensor>& in, const Attrs& a) {
  int64_t blocks = 0;
  const bool ok = visit_partials(in, a, nullptr, nullptr, [&]<int K, typename O, int kSums, typename G>(const VecBackwardOperands&) {
    const int64_t cols = in[1].shape().back(), rows = cols ? in[1].numel() / cols : 0;
    blocks = vec_backward_blocks<K, O, kSums, G>(rows, in[1].device().index);
  });
  return ok ? blocks : 0;
}

bool layer_norm_backward_partials_supported(const KernelCall& c) {
  for (const Tensor& o : c.out)
    if (!o.is_contiguous()) return false;
  return visit_partials(c.in, c.attrs, nullptr, nullptr, [&]<int, typename, int, typename>(const VecBackwardOperands&) {});
}

void layer_norm_backward_partials_kernel(const KernelCall& c) {
  const Tensor &x = c.in[1], &part = c.out[1];
  const Tensor* out16 = c.attrs.has("dtype") ? &c.out[2] : nullptr;
  const int64_t parts = part.shape()[0], cols = part.shape()[2], rows = cols ? x.numel() / cols : 0;
  const bool contiguous = c.out[0].is_contiguous() && part.is_contiguous() && (!out16 || out16->is_contiguous());
  const bool ok =
      contiguous && visit_partials(c.in, c.attrs, &c.out[0], out16, [&]<int K, typename O, int kSums, typename G>(
                                                                      const VecBackwardOperands& o) {
        launch_vec_backward<K, O, kSums, G>(o, in_ptr<float>(c.in[3]), in_ptr<float>(c.in[4]), out_ptr<float>(part),
                                            parts, rows, stream_of(x), row_dropout_of(c));
      });
  REEL_CHECK(ok, "layer_norm_backward_partials: x ", shape_str(x.shape()), " ", x.dtype(), ", g ",
             shape_str(c.in[0].shape()), " ", c.in[0].dtype(),
             ": the kernel takes f32 rows of 128 to 1024 columns (a multiple of 128), every operand and result "
             "contiguous and 16-byte aligned (f32) or 8-byte aligned (16-bit)");
}

void layer_norm_param_sums_kernel(const KernelCall& c) {
  const Tensor part = contiguous_on_device(c.in[0]);
  const int64_t parts = part.shape()[0], sums = part.shape()[1], cols = part.shape()[2];
  const bool accumulate = c.attrs.b("accumulate", false);
  for (const Tensor& o : c.out)
    REEL_CHECK(o.is_contiguous(), "layer_norm_param_sums: its results (", cols, ") must be contiguous, got strides ",
               shape_str(o.strides()));
  if (cols == 0) return;
  // Added to sums_in: the output is that tensor itself in a plan; a distinct one starts as its copy.
  if (accumulate && c.in[1].data_ptr() != c.out[2].data_ptr()) copy_on_device(c.out[2], c.in[1]);
  const float* pp = in_ptr<float>(part);
  cudaStream_t s = stream_of(c.out[0]);
  if (sums == 3)
    launch_param_finish<3>(pp, parts, cols, out_ptr<float>(c.out[0]), out_ptr<float>(c.out[1]),
                           out_ptr<float>(c.out[2]), accumulate, s);
  else
    launch_param_finish<2>(pp, parts, cols, out_ptr<float>(c.out[0]), out_ptr<float>(c.out[1]), nullptr, false, s);
}

}  // namespace
}  // namespace cuda

void register_layer_norm_cuda_kernels() {
  using cuda::norm_detail::run_into_contiguous;
  constexpr DeviceType gpu = DeviceType::CUDA;
  register_kernel(gpu, OpKind::LayerNorm, [](const KernelCall& c) { run_into_contiguous(c, cuda::layer_norm_fwd); });
  register_kernel(gpu, OpKind::LayerNormBackward,
                  [](const KernelCall& c) { run_into_contiguous(c, cuda::layer_norm_bwd); });
  register_kernel(gpu, OpKind::LayerNormCast, cuda::layer_norm_cast_kernel);
  register_kernel(gpu, OpKind::LayerNormBackwardAdd, cuda::layer_norm_backward_add_kernel);
  register_kernel(gpu, OpKind::LayerNormBackwardPartials, cuda::layer_norm_backward_partials_kernel);
  register_supports(gpu, OpKind::LayerNormBackwardPartials, cuda::layer_norm_backward_partials_supported);
  register_parts(gpu, OpKind::LayerNormBackwardPartials, cuda::layer_norm_backward_parts);
  register_kernel(gpu, OpKind::LayerNormParamSums, cuda::layer_norm_param_sums_kernel);
}

}  // namespace reel
