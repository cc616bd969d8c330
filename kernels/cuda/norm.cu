// CUDA kernels of group norm (forward and backward), and the registration of the whole norm family
// (layer norm: layer_norm.cu, batch norm: batch_norm.cu, dropout: dropout.cu).
//
// The math is the CPU's (kernels/cpu/norm.cpp), term by term, over the sets of a group:
//   mean = sum(x) / n      var = sum((x - mean)^2) / n   (biased, two passes)
//   rstd = 1 / sqrt(var + eps)     xhat = (x - mean) rstd     y = xhat w + b   (w = 1, b = 0 if absent)
//   dx = rstd (gw - mean(gw) - xhat mean(gw xhat))     dw = sum(g xhat)     db = sum(g)    (gw = g w)
// Statistics accumulate in A = Acc<D>; dw and db are always produced. x is X, everything else D: X = D
// for a plain call, X bf16/f16 with D = float for a 16-bit x read as f32 (attr dtype = f32,
// schema/norm.cpp), which to_acc widens exactly: the bits of x.to(f32) through the f32 kernels.
//
// Launch shapes: x viewed as (N, G, C/G, S): a 256-thread block per (n, group). Backward: each warp
// reduces whole channels of its group (sum_s g xhat, sum_s g) into (N, C) per-sample partials, the
// block combines them into mean(gw), mean(gw xhat) for dx, and the partials are summed over N into
// dw, db: by the last block to finish (kernels/cuda/last_block.cuh) where they are few (cnn-small's
// 32 x 128 x 2: a launch of 4.7 us fewer), else by a stage-2 kernel; in
// the same order either way.
// Layouts: x, g and dx are each (N, C, S)-contiguous or dense channels-last (a convolution's result
// and gradient under autocast on the GPU, NHWC), read and written where they lie (SetLayout), a
// channels-last set staged through shared memory where it fits, rather than through a transposing
// copy. The threads walk a set in (N, C, S) order whatever the layout, so every sum is taken in one
// order and the bits do not depend on the layout.
#include <cstdint>

#include "kernels/cuda/cuda_registry.h"
#include "kernels/cuda/last_block.cuh"
#include "kernels/cuda/norm_common.cuh"
#include "kernels/cuda/reduce_common.cuh"

namespace reel {
namespace cuda {
namespace {

using namespace norm_detail;

// Threads of a block, one block a (sample, group) set. 512 rather than 256 (on an H100, beside 256 in
// one call: cnn-small 1.233 / 1.227 -> 1.214 / 1.219 ms bf16, 1.205 / 1.200 -> 1.186 / 1.193 fp16):
// its group norms' sets are 8 x 8 x 16 = 1024 values, which 512 threads stage in two loads each.
constexpr int kSetThreads = 512;
// The most (N, C) partials (of dw and of db together) the backward's last block sums itself.
constexpr int64_t kFoldedParamSums = int64_t(1) << 16;

// Where element i of set `set` (n, group) lies in an (N, C, S) operand, i = k S + s running over the
// set's Cg channels k and each one's S positions s: at set Cg S + i when (N, C, S)-contiguous, at
// (n S + s) C + group Cg + k when channels-last, and at n C + group Cg + k = set Cg + k when the
// operand is an (N, C) tensor broadcast over the positions (a global average pool's gradient: strides
// (C, 1, 0, ...)).
struct SetLayout {
  int64_t G, Cg, S;
  bool channels_last;
  bool broadcast = false;
  __device__ int64_t at(int64_t set, int64_t i) const {
    if (broadcast) return set * Cg + i / S;
    if (!channels_last) return set * Cg * S + i;
    const int64_t k = i / S, s = i - k * S, n = set / G;
    return (n * S + s) * (G * Cg) + (set - n * G) * Cg + k;
  }
};

// A set of a channels-last operand staged through shared memory. Where it lies, element i = k S + s of
// a set sits C elements from element i + 1, so a warp walking the set in (k, s) order touches 32
// sectors for 64 bytes of bf16 (in the first measurement on the H200, cnn-small's group norms ran
// 1.7-2.4x slower in place than through transposing copies). Staged, the block reads the set in its
// memory order (pixel-major: a pixel's Cg channels are contiguous) into a [Cg][S + 1] array (the
// padding keeps the (k, s) walk free of bank conflicts) and the loops read it in (k, s) order as
// before: every thread sums the same values in the same order, so the bits are those of the
// unstaged kernel. Outputs (y16, dx) go the other way. Used where the arrays fit (kStageBytes).
constexpr size_t kStageBytes = 48 * 1024;

// Where element i of a set is in the staged array: k (S + 1) + s = i + k. Staged sets are small, so
// the division runs in 32 bits.
__device__ __forceinline__ int64_t staged_slot(int64_t i, int64_t S) { return i + int(i) / int(S); }

// Element j of a channels-last set in its memory order (pixel s = j / Cg, channel k = j % Cg): where it
// lies in the operand and its slot k (S + 1) + s in the staged array. The staging loops walk j.
struct StagedWalk {
  int64_t C, base, row;  // row: the array's S + 1
  int Cg, len;
  __device__ StagedWalk(const SetLayout& L, int64_t set) {
    const int64_t n = set / L.G;
    C = L.G * L.Cg, base = n * L.S * C + (set - n * L.G) * L.Cg, row = L.S + 1;
    Cg = int(L.Cg), len = int(L.Cg * L.S);
  }
  __device__ int64_t offset(int j) const {
    const int s = j / Cg, k = j - s * Cg;
    return base + int64_t(s) * C + k;
  }
  __device__ int64_t slot(int j) const {
    const int s = j / Cg, k = j - s * Cg;
    return int64_t(k) * row + s;
  }
};

// A thread's loads of kStageBatch elements are all issued before the first is stored: one memory
// latency per batch, where a load and a store to the array in turn may keep each load waiting on the
// store before it. The same values in the same slots.
constexpr int kStageBatch = 4;

template <typename T, typename A>
__device__ void stage_set_in(A* buf, const T* v, const SetLayout& L, int64_t set) {
  const StagedWalk w(L, set);
  const int step = int(blockDim.x);
  for (int j0 = threadIdx.x; j0 < w.len; j0 += kStageBatch * step) {
    T got[kStageBatch];
#pragma unroll
    for (int u = 0; u < kStageBatch; ++u)
      if (j0 + u * step < w.len) got[u] = v[w.offset(j0 + u * step)];
#pragma unroll
    for (int u = 0; u < kStageBatch; ++u)
      if (j0 + u * step < w.len) buf[w.slot(j0 + u * step)] = to_acc(got[u]);
  }
}

template <typename T, typename A>
__device__ void stage_set_out(T* v, const A* buf, const SetLayout& L, int64_t set) {
  const StagedWalk w(L, set);
  for (int j = threadIdx.x; j < w.len; j += blockDim.x) v[w.offset(j)] = from_acc<T>(buf[w.slot(j)]);
}

// A column of the backward's (N, C) per-sample partials (its first element at `column`) summed over
// the samples in order n = 0, 1, ... from zero, kParamBatch loads in flight at a time (from L2: other blocks' or an
// earlier launch's writes). The backward's last block and stage 2 both sum dw and db so: the same bits either way.
constexpr int kParamBatch = 16;

template <typename A>
__device__ A sum_over_samples(const A* column, int64_t N, int64_t C) {
  A sum = 0;
  for (int64_t n0 = 0; n0 < N; n0 += kParamBatch) {
    A v[kParamBatch];
#pragma unroll
    for (int u = 0; u < kParamBatch; ++u) v[u] = n0 + u < N ? load_partial(column + (n0 + u) * C) : A(0);
#pragma unroll
    for (int u = 0; u < kParamBatch; ++u)
      if (n0 + u < N) sum += v[u];
  }
  return sum;
}

// Stage 2, where the backward's last block does not sum them: dw[j], db[j] from ds, dbias: (N, C).
// N == 0 gives zeros.
template <typename D, typename A = Acc<D>>
__global__ void group_norm_param_sum_kernel(const A* ds, const A* dbias, int64_t N, int64_t C, ParamGrads<D> grads) {
  grid_dependency_wait();
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < C; j += int64_t(gridDim.x) * blockDim.x)
    grads.store(j, sum_over_samples(ds + j, N, C), sum_over_samples(dbias + j, N, C));
}

// x (layout Lx), y (N, C, S)-contiguous: sets (n, group) of Cg * S values; w, b: (C = G Cg) or null;
// mean, rstd: (N, G). One block per set. With a fused relu y = relu(xhat w + b), and y16 (non-null:
// attr cast_dtype) gets y's 16-bit copy in its layout L16. With `staged`, a channels-last x is read
// and a channels-last y16 written through one staged array (dynamic shared memory). pooled (non-null:
// attr pool; (N, C), kShortRow < S <= kWarpRow) gets each channel's mean of y over its S positions,
// summed as the mean op's warp-per-row kernel sums a row (reduce_common.cuh): a warp per channel, from
// the y the block has just stored.
template <typename X, typename D, typename Y16, typename A = Acc<D>>
__global__ void group_norm_fwd_kernel(const X* x, SetLayout Lx, const D* w, const D* b, D* y, A* mean, A* rstd,
                                      int64_t sets, A eps, bool relu, Y16* y16, SetLayout L16, bool staged,
                                      D* pooled) {
  grid_dependency_wait();
  extern __shared__ __align__(16) unsigned char stage_bytes[];
  A* buf = reinterpret_cast<A*>(stage_bytes);  // [Cg][S + 1]
  const bool x_staged = staged && Lx.channels_last, y16_staged = staged && y16 && L16.channels_last;
  const int64_t G = Lx.G, Cg = Lx.Cg, S = Lx.S, len = Cg * S;
  for (int64_t set = blockIdx.x; set < sets; set += gridDim.x) {
    D* ys = y + set * len;
    if (x_staged) {
      __syncthreads();  // the previous set's y16 is out of the array
      stage_set_in(buf, x, Lx, set);
      __syncthreads();
    }
    auto xv = [&](int64_t i) { return x_staged ? buf[staged_slot(i, S)] : to_acc(x[Lx.at(set, i)]); };
    A s = 0;
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) s += xv(i);
    const A mu = block_sum(s) / A(len);
    A q = 0;
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
      A d = xv(i) - mu;
      q += d * d;
    }
    const A rs = inv_std(block_sum(q) / A(len), eps);  // synchronises: every read of the array is done
    if (threadIdx.x == 0) {
      mean[set] = mu;
      rstd[set] = rs;
    }
    const int64_t ch0 = (set % G) * Cg;
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
      const int64_t ch = ch0 + i / S;
      A scale = rs * (w ? to_acc(w[ch]) : A(1)), shift = (b ? to_acc(b[ch]) : A(0)) - mu * scale;
      A v = xv(i) * scale + shift;
      if (relu) v = math::unary<OpKind::Relu>(v, A(0));
      ys[i] = from_acc<D>(v);
      if (y16_staged)
        buf[staged_slot(i, S)] = v;  // the slot this thread alone read
      else if (y16)
        y16[L16.at(set, i)] = from_acc<Y16>(v);
    }
    if (y16_staged) {
      __syncthreads();
      stage_set_out(y16, buf, L16, set);
      __syncthreads();
    }
    if (pooled) {
      __syncthreads();  // the block's stores of ys are visible to all its threads
      const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
      for (int64_t k = warp; k < Cg; k += warps) {
        const A sum = reduce_detail::warp_row_fold<reduce_detail::AddOp<A>, A>(
            S, [&](int64_t s) { return to_acc(ys[k * S + s]); });
        if (lane == 0) pooled[set * Cg + k] = from_acc<D>(sum / A(S));  // (N, C) index n C + group Cg + k
      }
    }
  }
}

// g, x, dx: (N, C, S) in layouts Lg, Lx, Ldx; w: (C) or null; mean, rstd: (N, G). One block per set
// (n, group); warp k reduces channels k, k + warps, ... of the group over S. Writes dx (in O: D, or
// 16 bits with attr dx_dtype, the f32 value rounded once) and the per-sample channel sums
// ds = sum_s g xhat, dbias = sum_s g, both (N, C), which are summed over N into dw and db (stored or
// added: ParamGrads) by the last block to finish when grads.dw is non-null, else by stage 2 (group_norm_param_sum_kernel; both through
// sum_over_samples). With a fused relu (yr
// non-null, layout Ly) g stands for relu_backward(g, yr). Gr: g's type (D, or a 16-bit x's). With
// `staged`, channels-last operands go through two staged arrays: g's (which dx then overwrites) and x's.
// With `scale_g` (attr grad_scale) each g is first multiplied by g_scale and rounded to D as mul_scalar
// rounds and stores it (never contracted into an FMA with what follows).
template <typename X, typename D, typename O, typename Gr, typename A = Acc<D>>
__global__ void group_norm_bwd_kernel(const Gr* g, SetLayout Lg, const D* yr, SetLayout Ly, const X* x, SetLayout Lx,
                                      const D* w, const A* mean, const A* rstd, O* dx, SetLayout Ldx, A* ds, A* dbias,
                                      int64_t sets, bool staged, ParamGrads<D> grads, bool scale_g, A g_scale) {
  grid_dependency_wait();
  auto grad_in = [&](A v) {
    if (!scale_g) return v;
    if constexpr (std::is_same_v<A, double>) return __dmul_rn(v, g_scale);
    else return A(to_acc(from_acc<D>(__fmul_rn(v, g_scale))));  // rounded to D, as mul_scalar stores it
  };
  const int64_t G = Lx.G, Cg = Lx.Cg, S = Lx.S, len = Cg * S;
  extern __shared__ __align__(16) unsigned char stage_bytes[];
  const bool g_staged = staged && Lg.channels_last, x_staged = staged && Lx.channels_last,
             dx_staged = staged && Ldx.channels_last;
  A* gbuf = reinterpret_cast<A*>(stage_bytes);                  // [Cg][S + 1]: g, then dx
  A* xbuf = gbuf + (g_staged || dx_staged ? Cg * (S + 1) : 0);  // [Cg][S + 1]: x
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int64_t set = blockIdx.x; set < sets; set += gridDim.x) {
    if (g_staged || x_staged) {
      __syncthreads();  // the previous set's dx is out of the array
      if (g_staged) stage_set_in(gbuf, g, Lg, set);
      if (x_staged) stage_set_in(xbuf, x, Lx, set);
      __syncthreads();
      if (g_staged && (yr || scale_g)) {  // the scale and the relu's mask, read in y's own (k, s) order
        for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
          A& gi = gbuf[staged_slot(i, S)];
          gi = yr ? relu_grad(grad_in(gi), yr, Ly.at(set, i)) : grad_in(gi);
        }
        __syncthreads();
      }
    }
    auto gv = [&](int64_t i) {
      if (g_staged) return gbuf[staged_slot(i, S)];
      const A v = grad_in(A(to_acc(g[Lg.at(set, i)])));
      return yr ? relu_grad(v, yr, Ly.at(set, i)) : v;
    };
    auto xv = [&](int64_t i) { return x_staged ? xbuf[staged_slot(i, S)] : to_acc(x[Lx.at(set, i)]); };
    const A mu = mean[set], rs = rstd[set];
    const int64_t ch0 = (set % G) * Cg;
    A s_gw = 0, s_gwx = 0;  // this warp's share of sum_k w_k sum_s g and sum_k w_k sum_s g xhat (lane 0)
    for (int64_t k = warp; k < Cg; k += warps) {
      A s_gx = 0, s_g = 0;
      for (int64_t i = k * S + lane; i < (k + 1) * S; i += 32) {
        const A gi = gv(i);
        s_gx += gi * (xv(i) - mu) * rs;
        s_g += gi;
      }
      s_gx = warp_sum(s_gx);
      s_g = warp_sum(s_g);
      if (lane == 0) {
        // (N, C) index n C + ch0 + k = set Cg + k, since n C + (set % G) Cg = set Cg.
        ds[set * Cg + k] = s_gx;
        dbias[set * Cg + k] = s_g;
        A wk = w ? to_acc(w[ch0 + k]) : A(1);
        s_gw += wk * s_g;
        s_gwx += wk * s_gx;
      }
    }
    // block_sum synchronises: every warp's reads of the arrays are done before dx overwrites g's.
    const A mean_gw = block_sum(s_gw) / A(len), mean_gwx = block_sum(s_gwx) / A(len);
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
      const int64_t k = i / S;
      A wk = w ? to_acc(w[ch0 + k]) : A(1), xh = (xv(i) - mu) * rs;
      const A v = rs * (gv(i) * wk - mean_gw - xh * mean_gwx);
      if (dx_staged)
        gbuf[staged_slot(i, S)] = v;  // the slot this thread alone read; rounded on the way out
      else
        dx[Ldx.at(set, i)] = from_acc<O>(v);
    }
    if (dx_staged) {
      __syncthreads();
      stage_set_out(dx, gbuf, Ldx, set);
      __syncthreads();
    }
  }
  if (grads.dw && arrive_last(finish_counter(0), gridDim.x)) {
    const int64_t C = G * Cg, N = sets / G;
    for (int64_t j = threadIdx.x; j < 2 * C; j += blockDim.x) {  // dw's columns, then db's
      const A sum = sum_over_samples(j < C ? ds + j : dbias + (j - C), N, C);
      grads.put(j < C ? grads.dw + j : grads.db + (j - C), sum);
    }
  }
}

// The dynamic shared memory of a launch staging `arrays` sets of layout L: 0 (read in place) when there
// is nothing to stage or the arrays do not fit.
template <typename A>
size_t stage_bytes_of(const SetLayout& L, int arrays) {
  const size_t bytes = size_t(arrays) * size_t(L.Cg) * size_t(L.S + 1) * sizeof(A);
  return bytes <= kStageBytes ? bytes : 0;
}

// An operand read where it lies when (N, C, S)-contiguous, dense channels-last or (`broadcast_ok`, a
// gradient) a position broadcast, else a contiguous copy.
struct SetOperand {
  Tensor t;
  SetLayout layout;
};
SetOperand set_operand(const Tensor& v, int64_t G, const NCS& d, bool broadcast_ok = false) {
  if (broadcast_ok && is_position_broadcast(v.shape(), v.strides())) return {v, {G, d.C / G, d.S, false, true}};
  const bool cl = is_channels_last_only(v);
  return {cl ? v : contiguous_on_device(v), {G, d.C / G, d.S, cl}};
}

void group_norm_fwd(const KernelCall& c) {
  const NCS d = ncs_of(c.in[0]);
  const int64_t G = c.attrs.i("groups"), sets = d.N * G;
  const SetOperand xo = set_operand(c.in[0], G, d);
  Tensor w = contiguous_on_device(c.in[1]), b = contiguous_on_device(c.in[2]);
  const Tensor &x = xo.t, &y = c.out[0], &mean = c.out[1], &rstd = c.out[2];
  const Tensor y16 = c.attrs.has("cast_dtype") ? c.out[3] : Tensor();  // y's 16-bit copy
  const Tensor pooled = c.attrs.b("pool", false) ? c.out.back() : Tensor();  // (N, C): mean of y over S
  REEL_CHECK(!pooled.defined() || (d.S > reduce_detail::kShortRow && d.S <= reduce_detail::kWarpRow),
             "group_norm: attr pool on the GPU takes ", reduce_detail::kShortRow + 1, " to ", reduce_detail::kWarpRow,
             " positions per channel, got x ", shape_str(c.in[0].shape()));
  const SetLayout L16{G, d.C / std::max<int64_t>(G, 1), d.S, is_channels_last_only(y16)};
  const bool relu = c.attrs.b("relu", false);
  if (sets == 0) return;
  visit_norm_input(x.dtype(), y.dtype(), "group_norm", [&]<typename X, typename D>() {
    visit_copy_type<D>(y16, "group_norm", [&]<typename Y16>() {
      using A = Acc<D>;
      const size_t bytes = stage_bytes_of<A>(xo.layout, xo.layout.channels_last || L16.channels_last ? 1 : 0);
      launch_kernel(group_norm_fwd_kernel<X, D, Y16>, grid_for(sets), kSetThreads, bytes, stream_of(x), in_ptr<X>(x),
                    xo.layout, in_ptr<D>(w), in_ptr<D>(b), out_ptr<D>(y), out_ptr<A>(mean), out_ptr<A>(rstd), sets,
                    A(c.attrs.f("eps")), relu, y16.defined() ? out_ptr<Y16>(y16) : nullptr, L16, bytes > 0,
                    pooled.defined() ? out_ptr<D>(pooled) : nullptr);
      REEL_CUDA_LAUNCH_CHECK();
    });
  });
}

// dx is (N, C, S)-contiguous, or dense channels-last (the 16-bit gradient a channels-last
// convolution's backward reads, with attr dx_dtype), written where it lies.
void group_norm_bwd(const KernelCall& c) {
  const NCS d = ncs_of(c.in[1]);
  const int64_t N = d.N, C = d.C, G = c.attrs.i("groups"), sets = N * G;
  const bool relu = c.attrs.b("relu", false);  // g is relu_backward(g, y), y = in[5]
  const SetOperand go = set_operand(c.in[0], G, d, true), xo = set_operand(c.in[1], G, d);
  const bool scale_g = c.attrs.has("grad_scale");
  const SetOperand yo = relu ? set_operand(c.in[5], G, d) : SetOperand{Tensor(), {}};
  const Tensor &g = go.t, &x = xo.t, w = contiguous_on_device(c.in[2]);
  Tensor mean = contiguous_on_device(c.in[3]), rstd = contiguous_on_device(c.in[4]);
  const Tensor &dx = c.out[0], &dw = c.out[1];
  const SetLayout Ldx{G, C / std::max<int64_t>(G, 1), d.S, is_channels_last_only(dx)};
  if (C == 0) return;
  cudaStream_t s = stream_of(x);
  visit_norm_input(x.dtype(), dw.dtype(), "group_norm_backward", [&]<typename X, typename D>() {
    using A = Acc<D>;
    // part: (2, N, C) = per-sample channel sums of g xhat, then of g.
    Tensor part = Tensor::empty({2, N, C}, mean.dtype(), x.device());
    A* pp = out_ptr<A>(part);
    const bool fold = sets > 0 && 2 * N * C <= kFoldedParamSums;  // dw, db summed by the last block
    if (sets > 0) {
      visit_dx_type<D>(dx.dtype(), dw.dtype(), "group_norm_backward", [&]<typename O>() {
        visit_grad_type<X, D>(g.dtype(), dw.dtype(), "group_norm_backward", [&]<typename Gr>() {
          const int arrays = (go.layout.channels_last || Ldx.channels_last ? 1 : 0) + (xo.layout.channels_last ? 1 : 0);
          const size_t bytes = stage_bytes_of<A>(xo.layout, arrays);
          launch_kernel(group_norm_bwd_kernel<X, D, O, Gr>, grid_for(sets), kSetThreads, bytes, s, in_ptr<Gr>(g),
                        go.layout, relu ? in_ptr<D>(yo.t) : nullptr, yo.layout, in_ptr<X>(x), xo.layout, in_ptr<D>(w),
                        in_ptr<A>(mean), in_ptr<A>(rstd), out_ptr<O>(dx), Ldx, pp, pp + N * C, sets, bytes > 0,
                        fold ? param_grads_of<D>(c) : ParamGrads<D>{}, scale_g,
                        A(scale_g ? c.attrs.f("grad_scale") : 1.0));
          REEL_CUDA_LAUNCH_CHECK();
        });
      });
    }
    if (fold) return;
    launch_kernel(group_norm_param_sum_kernel<D>, blocks_for(C), 256, 0, s, pp, pp + N * C, N, C,
                  param_grads_of<D>(c));
    REEL_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace
}  // namespace cuda

void register_batch_norm_cuda_kernels();  // batch_norm.cu
void register_dropout_cuda_kernels();     // dropout.cu
void register_layer_norm_cuda_kernels();  // layer_norm.cu

void register_norm_cuda_kernels() {
  using cuda::norm_detail::run_into_contiguous;
  constexpr DeviceType gpu = DeviceType::CUDA;
  register_kernel(gpu, OpKind::GroupNorm, [](const KernelCall& c) {
    // A channels-last copy of y (attr cast_dtype) is written where it lies; any other strided output
    // through a temporary.
    bool direct = c.attrs.has("cast_dtype") && cuda::is_channels_last_only(c.out[3]);
    for (size_t i = 0; i < c.out.size(); ++i) direct = direct && (i == 3 || c.out[i].is_contiguous());
    if (direct) return cuda::group_norm_fwd(c);
    run_into_contiguous(c, cuda::group_norm_fwd);
  });
  // The pool (attr pool) sums a channel as the mean op's warp-per-row kernel sums a row: for the rows
  // that kernel takes.
  register_supports(gpu, OpKind::GroupNorm, [](const KernelCall& c) {
    if (!c.attrs.b("pool", false)) return true;
    const int64_t S = cuda::norm_detail::ncs_of(c.in[0]).S;
    return S > cuda::reduce_detail::kShortRow && S <= cuda::reduce_detail::kWarpRow;
  });
  register_kernel(gpu, OpKind::GroupNormBackward, [](const KernelCall& c) {
    if (c.attrs.b("accumulate", false)) prepare_accumulated_outputs(c, 1, c.in.size() - 2, 2, cuda::copy_on_device);
    // A channels-last dx is written where it lies; any other strided output through a temporary.
    const bool direct = cuda::is_channels_last_only(c.out[0]) && c.out[1].is_contiguous() && c.out[2].is_contiguous();
    if (direct) return cuda::group_norm_bwd(c);
    run_into_contiguous(c, cuda::group_norm_bwd);
  });
  register_layer_norm_cuda_kernels();
  register_batch_norm_cuda_kernels();
  register_dropout_cuda_kernels();
}

}  // namespace reel
