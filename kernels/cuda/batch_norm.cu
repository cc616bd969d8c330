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
// pixel. The statistics and the backward's sums are one launch each: the last block of a channel tile
// to finish combines the tile's chunks (kernels/cuda/last_block.cuh), all its threads at once; the
// statistics of a small plane (at most 64 chunks) are instead combined by every block of the apply
// kernel (stats_in_apply below; the switch of batch_norm_stats_switch.h turns that off).
// Where every block of the backward's grid can be resident at once (a small plane: cnn-small's), its
// sums and dx are one kernel: each block keeps its chunk's tiles and computes dx once its channel
// tile's last block has combined the chunks (batch_norm_one_launch.h has the switch, batch_norm_tiles.cuh
// the kernel). Same bits as the two launches.
// Those kernels are in batch_norm_tiles.cuh; what both layouts share in batch_norm_common.cuh.
// The chunks of a channel's values are then chunks of pixels, summed in another order than the
// (N, C, S) kernels': the results agree to rounding, not to the bit, with those of the same values
// in (N, C, S) order.
#include "kernels/cuda/batch_norm_common.cuh"
#include "kernels/cuda/batch_norm_one_launch.h"
#include "kernels/cuda/batch_norm_stats_switch.h"
#include "kernels/cuda/batch_norm_tiles.cuh"
#include "kernels/cuda/cuda_registry.h"
#include "kernels/env_switch.h"

namespace reel {
namespace cuda {
namespace {

using namespace norm_detail;
using namespace batch_norm_detail;

constexpr int kChannelThreads = 512;

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
  grid_dependency_wait();
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
                      update ? running_mean.load(c) : 0.0, update ? running_var.load(c) : 0.0, momentum);
}

template <typename A>
__global__ void batch_norm_fwd_finalize_kernel(const A* part, ChannelSplit sp, A eps, A* mean, A* rstd, bool update,
                                               RunningStat running_mean, RunningStat running_var, double momentum) {
  grid_dependency_wait();
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < sp.C; c += int64_t(gridDim.x) * blockDim.x)
    finalize_channel_stats(c, part, sp, eps, mean, rstd, update, running_mean, running_var, momentum);
}

// Eval statistics from the running ones: mean = running_mean, rstd = 1 / sqrt(running_var + eps).
template <typename A>
__global__ void batch_norm_fwd_eval_stats_kernel(RunningStat running_mean, RunningStat running_var, int64_t C,
                                                 double eps, A* mean, A* rstd) {
  grid_dependency_wait();
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x) {
    mean[c] = A(running_mean.load(c));
    rstd[c] = A(1.0 / sqrt(running_var.load(c) + eps));
  }
}

// y = x scale_c + shift_c (with a fused relu, relu of it). x, y, y16: (N, C, S) flat, total = N*C*S;
// w, b: (C) or null; mean, rstd: (C); y16 (attr cast_dtype) y's 16-bit copy, or null. I is the index
// type: 32-bit when total fits, which makes c = (i / S) % C several times cheaper.
template <typename I, typename X, typename D, typename Y16, typename A = Acc<D>>
__global__ void batch_norm_fwd_apply_kernel(const X* x, const D* w, const D* b, const A* mean, const A* rstd, D* y,
                                            bool relu, Y16* y16, I total, I C, I S) {
  grid_dependency_wait();
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I c = (i / S) % C;
    A scale = rstd[c] * (w ? to_acc(w[c]) : A(1)), shift = (b ? to_acc(b[c]) : A(0)) - mean[c] * scale;
    A v = to_acc(x[i]) * scale + shift;
    if (relu) v = math::unary<OpKind::Relu>(v, A(0));
    y[i] = from_acc<D>(v);
    if (y16) y16[i] = from_acc<Y16>(v);
  }
}

// Backward, stage 1. g, x (and a fused relu's y, or null): (N, C, S); mean, rstd: (C). Each tile
// (c, k) sums g and g xhat over its chunk of channel c into part: (2, C, parts); with y, g is
// relu_backward(g, y).
template <typename X, typename D, typename G, typename A = Acc<D>>
__global__ void batch_norm_bwd_partial_kernel(const G* g, const D* yr, const X* x, const A* mean, const A* rstd,
                                              ChannelSplit sp, A* part) {
  grid_dependency_wait();
  for (int64_t t = blockIdx.x; t < sp.C * sp.parts; t += gridDim.x) {
    const int64_t c = t / sp.parts, k = t % sp.parts, i0 = sp.begin(k), i1 = sp.end(k);
    const A mu = mean[c], rs = rstd[c];
    A s_g = 0, s_gx = 0;
    ChannelWalk w(c, i0 + threadIdx.x, blockDim.x, sp.C, sp.S);
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x, w.next()) {
      const A gv = relu_grad_at<A>(g, yr, w.off);
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
template <typename D, typename A = Acc<D>>
__device__ void finalize_channel_grads(int64_t c, const A* part, const ChannelSplit& sp, bool training,
                                       const ParamGrads<D>& grads, A* coef) {
  A s_g = 0, s_gx = 0;
  for (int64_t k = 0; k < sp.parts; ++k) {
    s_g += load_partial(part + c * sp.parts + k);
    s_gx += load_partial(part + (sp.C + c) * sp.parts + k);
  }
  store_channel_grads(c, s_g, s_gx, sp.C, sp.count, training, grads, coef);
}

template <typename D, typename A = Acc<D>>
__global__ void batch_norm_bwd_finalize_kernel(const A* part, ChannelSplit sp, bool training, ParamGrads<D> grads,
                                               A* coef) {
  grid_dependency_wait();
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < sp.C; c += int64_t(gridDim.x) * blockDim.x)
    finalize_channel_grads(c, part, sp, training, grads, coef);
}

// dx = w rstd (g - mean(g) - xhat mean(g xhat)). g, x, dx (and a fused relu's y): (N, C, S) flat; w:
// (C) or null; mean, rstd: (C); coef: (2, C) from stage 2. I as in the apply kernel.
template <typename I, typename X, typename D, typename O, typename G, typename A = Acc<D>>
__global__ void batch_norm_bwd_dx_kernel(const G* g, const D* yr, const X* x, const D* w, const A* mean, const A* rstd,
                                         const A* coef, O* dx, I total, I C, I S) {
  grid_dependency_wait();
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I c = (i / S) % C;
    const A rs = rstd[c], xh = (to_acc(x[i]) - mean[c]) * rs, wc = w ? to_acc(w[c]) : A(1);
    dx[i] = from_acc<O>(wc * rs * (relu_grad_at<A>(g, yr, i) - coef[c] - xh * coef[C + c]));
  }
}

int64_t channel_tiles(const NCS& d) { return (d.C + kTile - 1) / kTile; }

// Whether the tiled kernels take v where it lies: channels-last only, with few enough channel tiles for
// their finish counters (one per channel tile, last_block.cuh).
bool tiles_channels_last(const Tensor& v, const NCS& d) {
  return channel_tiles(d) <= kFinishCounterLaneSlots && is_channels_last_only(v);
}

// An operand read in place when tiles_channels_last, else (N, C, S)-contiguous: itself or a copy.
struct PlaneOperand {
  Tensor t;
  PlaneLayout layout;
};
PlaneOperand plane_operand(const Tensor& v, const NCS& d) {
  if (tiles_channels_last(v, d)) return {v, {d.C, d.S, true}};
  return {contiguous_on_device(v), {d.C, d.S, false}};
}

// Pixel chunks per channel tile for the tiled kernels: one tile of `pixels` each, so no chunk is
// empty; a large plane has thousands of blocks and the last block combines its tile's chunks with
// all its threads.
ChannelSplit split_pixels(const NCS& d, int64_t pixels) {
  const int64_t count = d.N * d.S, parts = std::max<int64_t>(1, (count + pixels - 1) / pixels);
  return {d.C, d.S, count, parts, pixels};
}

// Who combines the tiled statistics' one-tile chunks. The last block of a channel tile that combines
// them is the statistics kernel's tail, during which one multiprocessor works and the rest wait: on
// cnn-small's planes (256 and 64 chunks) Nsight Compute on an H100 timed the kernel at 11.4 / 8.3 us
// with it and 7.2 / 5.6 without it (a trial binary that left it out), and leaving out the finish
// counter too took 5.4 / 4.0. So where a channel tile has at most kApplyCombineParts chunks, every
// block of the apply kernel combines its tile's chunks itself, beside the others (a few kilobytes of
// partials each, from L2), and the statistics kernel only writes them (no counter); the same partials
// and the same device function, so the same bits as the last block. Larger planes keep the last
// block: combining 256 chunks in every apply block, or chunks of two or four tiles (a half or a
// quarter of the blocks, each with more pixels), measured slower on resnet18-cifar (+1-2%) than the
// last block (bench/RESULTS.md, nineteenth step); 64 one-tile chunks in the apply kernel made
// yolov8n-cls's step 1.6-2.1% faster on two H100s (4.9% slower on a third) and its kernels' sum 0.10
// ms shorter (twentieth step). The switch of batch_norm_stats_switch.h puts every plane back on the
// last block.
constexpr int64_t kApplyCombineParts = 64;

EnvSwitch g_stats_last_block("REEL_BATCH_NORM_STATS_LAST_BLOCK", "the apply kernel's blocks combine the statistics",
                             "the statistics kernel's last block combines them", /*default_on=*/false);

// Whether the apply kernel combines the tiled statistics' chunks of split sp.
bool stats_in_apply(const ChannelSplit& sp) {
  return !g_stats_last_block.get() && sp.count > 0 && sp.parts <= kApplyCombineParts;
}

// Chunks per channel: about 1024 tiles in all, each at least 4096 values (8 per thread).
ChannelSplit split_channels(const NCS& d) {
  const int64_t count = d.N * d.S;
  const int64_t parts = std::max<int64_t>(1, std::min((1024 + d.C - 1) / d.C, count / 4096));
  return {d.C, d.S, count, parts, (count + parts - 1) / parts};
}

EnvSwitch g_one_launch("REEL_BATCH_NORM_ONE_LAUNCH", "two kernels", "one kernel for the backward's sums and dx");

// Whether `kernel`, batch_norm_tiles.cuh's one-launch backward, takes the tiled split `sp` of a
// plane on stream s: the switch is on, every block of its grid (one a chunk) can be resident at once
// (the blocks wait for each other: a grid larger than the GPU would wait forever), and s is not a
// plan's side stream, where a second such kernel could run beside the first and the two hold each
// other's multiprocessors. A channel tile takes a finish counter and a generation counter of the main
// stream's lane.
template <typename Kernel>
bool one_launch_fits(Kernel kernel, const ChannelSplit& sp, int64_t tiles_c, cudaStream_t s, Device dev) {
  if (!g_one_launch.get() || is_side_stream(s, dev.index) || tiles_c > kFinishCounterLaneSlots) return false;
  const int64_t resident = int64_t(resident_blocks_per_sm(kernel, kTile * kTileRows)) * multiprocessor_count(dev.index);
  return tiles_c * sp.parts <= resident;
}

// Launches an elementwise (N, C, S) kernel with 32-bit indices when N*C*S fits.
template <typename Kernel32, typename Kernel64, typename... Args>
void launch_flat(Kernel32 k32, Kernel64 k64, int64_t total, const NCS& d, cudaStream_t s, Args... args) {
  if (total <= int64_t(UINT32_MAX) - 65536 * 8 * 256)  // i + grid stride never wraps
    launch_kernel(k32, blocks_for(total), 256, 0, s, args..., uint32_t(total), uint32_t(d.C), uint32_t(d.S));
  else
    launch_kernel(k64, blocks_for(total), 256, 0, s, args..., total, d.C, d.S);
  REEL_CUDA_LAUNCH_CHECK();
}

void batch_norm_fwd(const KernelCall& c) {
  const NCS d = ncs_of(c.in[0]);
  const PlaneOperand xo = plane_operand(c.in[0], d);
  const Tensor &x = xo.t, w = contiguous_on_device(c.in[1]), b = contiguous_on_device(c.in[2]);
  const Tensor &running_mean = c.in[3], &running_var = c.in[4];  // updated in place: not copied
  const Tensor &y = c.out[0], &mean = c.out[1], &rstd = c.out[2];
  const Tensor y16 = c.out.size() > 3 ? c.out[3] : Tensor();  // attr cast_dtype: y's 16-bit copy
  const PlaneLayout L16{d.C, d.S, tiles_channels_last(y16, d)};
  const bool relu = c.attrs.b("relu", false);
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
    Tensor part;                  // the statistics' chunk partials
    ApplyStats<A> apply_stats{};  // part null: the statistics are combined before the apply, which reads them
    if (training) {
      ChannelSplit sp = tiled ? split_pixels(d, tile_pixels<A>) : split_channels(d);
      sp.counters = finish_counter_base(s, x.device());
      const double momentum = has_running ? c.attrs.f("momentum") : 0.0;
      // Chunk sums, then chunk M2s: (2, C, parts), or (2, parts, C) for the tiles.
      part = Tensor::empty({2, d.C, sp.parts}, mean.dtype(), x.device());
      if (tiled) {
        const StatsOut<A> out{A(eps), pm, pr, has_running, rm, rv, momentum};
        const bool in_apply = stats_in_apply(sp);
        if (in_apply) apply_stats = {in_ptr<A>(part), sp, out};
        launch_kernel(batch_norm_fwd_stats_tiled_kernel<X, A>, grid_for(channel_tiles(d) * sp.parts),
                      dim3(kTile, kTileRows), 0, s, in_ptr<X>(x), sp, out_ptr<A>(part), !in_apply, out);
      } else {
        launch_kernel(batch_norm_fwd_partial_kernel<X, A>, grid_for(d.C * sp.parts), kChannelThreads, 0, s,
                      in_ptr<X>(x), sp, out_ptr<A>(part));
        REEL_CUDA_LAUNCH_CHECK();
        launch_kernel(batch_norm_fwd_finalize_kernel<A>, blocks_for(d.C), 256, 0, s, in_ptr<A>(part), sp, A(eps), pm,
                      pr, has_running, rm, rv, momentum);
      }
    } else {
      launch_kernel(batch_norm_fwd_eval_stats_kernel<A>, blocks_for(d.C), 256, 0, s, rm, rv, d.C, eps, pm, pr);
    }
    REEL_CUDA_LAUNCH_CHECK();
    const int64_t total = x.numel();
    if (total == 0) return;
    visit_copy_type<D>(y16, "batch_norm", [&]<typename Y16>() {
      Y16* p16 = y16.defined() ? out_ptr<Y16>(y16) : nullptr;
      if (tiled) {
        const int64_t P = d.N * d.S, tiles = (P + tile_pixels<A> - 1) / tile_pixels<A> * channel_tiles(d);
        const auto kernel = apply_stats.part ? batch_norm_fwd_apply_tiled_kernel<X, D, Y16, true>
                                             : batch_norm_fwd_apply_tiled_kernel<X, D, Y16, false>;
        launch_kernel(kernel, grid_for(tiles), dim3(kTile, kTileRows), 0, s,
                      in_ptr<X>(x), xo.layout, in_ptr<D>(w), in_ptr<D>(b), in_ptr<A>(mean), in_ptr<A>(rstd),
                      out_ptr<D>(y), P, relu, p16, L16, apply_stats);
        REEL_CUDA_LAUNCH_CHECK();
        return;
      }
      // The flat kernel writes y16 in (N, C, S) order: the registration hands it a contiguous one.
      launch_flat(batch_norm_fwd_apply_kernel<uint32_t, X, D, Y16>, batch_norm_fwd_apply_kernel<int64_t, X, D, Y16>,
                  total, d, s, in_ptr<X>(x), in_ptr<D>(w), in_ptr<D>(b), in_ptr<A>(mean), in_ptr<A>(rstd),
                  out_ptr<D>(y), relu, p16);
    });
  });
}

void batch_norm_bwd(const KernelCall& c) {
  const NCS d = ncs_of(c.in[1]);
  const bool relu = c.attrs.b("relu", false);  // g is relu_backward(g, y), y = in[5]
  const PlaneOperand go = plane_operand(c.in[0], d), xo = plane_operand(c.in[1], d);
  const PlaneOperand yo = relu ? plane_operand(c.in[5], d) : PlaneOperand{Tensor(), {d.C, d.S, false}};
  const Tensor &g = go.t, &x = xo.t, w = contiguous_on_device(c.in[2]);
  Tensor mean = contiguous_on_device(c.in[3]), rstd = contiguous_on_device(c.in[4]);
  const Tensor &dx = c.out[0], &dw = c.out[1];
  if (d.C == 0) return;
  // dx dense channels-last (the 16-bit gradient a channels-last convolution's backward reads, with attr
  // dx_dtype) is written so by the tiles, not through a temporary.
  const PlaneLayout Ldx{d.C, d.S, tiles_channels_last(dx, d)};
  const bool training = c.attrs.b("training");
  const bool tiled = go.layout.channels_last || xo.layout.channels_last || yo.layout.channels_last || Ldx.channels_last;
  cudaStream_t s = stream_of(x);
  visit_norm_input(x.dtype(), dw.dtype(), "batch_norm_backward", [&]<typename X, typename D>() {
    visit_grad_type<X, D>(g.dtype(), dw.dtype(), "batch_norm_backward", [&]<typename G>() {
      using A = Acc<D>;
      const G* pg = in_ptr<G>(g);
      const D* py = relu ? in_ptr<D>(yo.t) : nullptr;
      const X* px = in_ptr<X>(x);
      const A *pm = in_ptr<A>(mean), *pr = in_ptr<A>(rstd);
      ChannelSplit sp = tiled ? split_pixels(d, tile_pixels<A>) : split_channels(d);
      sp.counters = finish_counter_base(s, x.device());
      // Chunk sums of g, then of g xhat: (2, C, parts), or (2, parts, C) for the tiles.
      Tensor part = Tensor::empty({2, d.C, sp.parts}, mean.dtype(), x.device());
      Tensor coef = Tensor::empty({2, d.C}, mean.dtype(), x.device());  // mean(g), mean(g xhat)
      // One launch for the sums and dx where the grid fits (one_launch_fits); two otherwise.
      const bool one_launch = tiled && x.numel() > 0 &&
                              visit_dx_type<D>(dx.dtype(), dw.dtype(), "batch_norm_backward", [&]<typename O>() {
                                auto kernel = batch_norm_bwd_one_launch_kernel<X, D, O, G>;
                                if (!one_launch_fits(kernel, sp, channel_tiles(d), s, x.device())) return false;
                                launch_kernel(kernel, unsigned(channel_tiles(d) * sp.parts), dim3(kTile, kTileRows), 0,
                                              s, pg, go.layout, py, yo.layout, px, xo.layout, pm, pr, sp,
                                              out_ptr<A>(part), training, param_grads_of<D>(c), out_ptr<A>(coef),
                                              in_ptr<D>(w), out_ptr<O>(dx), Ldx);
                                REEL_CUDA_LAUNCH_CHECK();
                                return true;
                              });
      if (one_launch) return;
      if (tiled) {
        launch_kernel(batch_norm_bwd_sums_tiled_kernel<X, D, G>, grid_for(channel_tiles(d) * sp.parts),
                      dim3(kTile, kTileRows), 0, s, pg, go.layout, py, yo.layout, px, xo.layout, pm, pr, sp,
                      out_ptr<A>(part), training, param_grads_of<D>(c), out_ptr<A>(coef));
      } else {
        launch_kernel(batch_norm_bwd_partial_kernel<X, D, G>, grid_for(d.C * sp.parts), kChannelThreads, 0, s, pg, py,
                      px, pm, pr, sp, out_ptr<A>(part));
        REEL_CUDA_LAUNCH_CHECK();
        launch_kernel(batch_norm_bwd_finalize_kernel<D>, blocks_for(d.C), 256, 0, s, in_ptr<A>(part), sp, training,
                      param_grads_of<D>(c), out_ptr<A>(coef));
      }
      REEL_CUDA_LAUNCH_CHECK();
      const int64_t total = x.numel();
      if (total == 0) return;
      visit_dx_type<D>(dx.dtype(), dw.dtype(), "batch_norm_backward", [&]<typename O>() {
        if (tiled) {
          const int64_t P = d.N * d.S, tiles = (P + tile_pixels<A> - 1) / tile_pixels<A> * channel_tiles(d);
          launch_kernel(batch_norm_bwd_dx_tiled_kernel<X, D, O, G>, grid_for(tiles), dim3(kTile, kTileRows), 0, s, pg,
                        go.layout, py, yo.layout, px, xo.layout, in_ptr<D>(w), pm, pr, in_ptr<A>(coef), out_ptr<O>(dx),
                        Ldx, P);
          REEL_CUDA_LAUNCH_CHECK();
          return;
        }
        launch_flat(batch_norm_bwd_dx_kernel<uint32_t, X, D, O, G>, batch_norm_bwd_dx_kernel<int64_t, X, D, O, G>,
                    total, d, s, pg, py, px, in_ptr<D>(w), pm, pr, in_ptr<A>(coef), out_ptr<O>(dx));
      });
    });
  });
}

}  // namespace

bool batch_norm_stats_last_block() { return g_stats_last_block.get(); }
bool set_batch_norm_stats_last_block(bool on) { return g_stats_last_block.set(on); }
bool batch_norm_one_launch() { return g_one_launch.get(); }
bool set_batch_norm_one_launch(bool on) { return g_one_launch.set(on); }

}  // namespace cuda

void register_batch_norm_cuda_kernels() {
  using cuda::norm_detail::run_into_contiguous;
  constexpr DeviceType gpu = DeviceType::CUDA;
  register_kernel(gpu, OpKind::BatchNorm, [](const KernelCall& c) {
    // A channels-last copy of y (attr cast_dtype) is written where it lies by the tiled apply kernel,
    // which runs when x is channels-last too; any other strided output through a temporary.
    const cuda::norm_detail::NCS d = cuda::norm_detail::ncs_of(c.in[0]);
    const bool direct = c.out.size() > 3 && cuda::tiles_channels_last(c.out[3], d) &&
                        cuda::tiles_channels_last(c.in[0], d) && c.out[0].is_contiguous() && c.out[1].is_contiguous() &&
                        c.out[2].is_contiguous();
    if (direct) return cuda::batch_norm_fwd(c);
    run_into_contiguous(c, cuda::batch_norm_fwd);
  });
  register_kernel(gpu, OpKind::BatchNormBackward, [](const KernelCall& c) {
    if (c.attrs.b("accumulate", false)) prepare_accumulated_outputs(c, 1, c.in.size() - 2, 2, cuda::copy_on_device);
    const bool direct = cuda::tiles_channels_last(c.out[0], cuda::norm_detail::ncs_of(c.in[1])) &&
                        c.out[1].is_contiguous() && c.out[2].is_contiguous();
    if (direct) return cuda::batch_norm_bwd(c);
    run_into_contiguous(c, cuda::batch_norm_bwd);
  });
}

}  // namespace reel
