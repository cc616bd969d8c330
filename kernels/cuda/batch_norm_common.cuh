// What batch norm's kernels share whatever the layout of their operands (kernels/cuda/batch_norm.cu
// runs (N, C, S) operands, batch_norm_tiles.cuh channels-last ones): the running statistics as
// stored, the split of a channel's values into chunks, and how a channel's statistics and its
// backward's sums are stored once combined. Included by batch_norm.cu alone.
#pragma once
#include "kernels/cuda/norm_common.cuh"

namespace reel::cuda::batch_norm_detail {

using namespace norm_detail;

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

inline RunningStat running_stat(const Tensor& t) {
  REEL_CHECK(is_floating(t.dtype()), "batch_norm: running statistics must be float tensors, got ",
             dtype_name(t.dtype()));
  return {t.data_ptr(), t.strides()[0], t.dtype()};
}

// A channel's values are split into `parts` chunks of its flat index i in [0, N*S) so that small C
// still fills the GPU. Tile t of the grid is (channel t / parts, chunk t % parts).
struct ChannelSplit {
  int64_t C, S, count, parts, chunk;  // count = N*S values per channel, chunk = ceil(count / parts)
  // The tiled kernels' first finish counter: channel tile j counts in slot counters + j, of the lane
  // of the launch's stream (last_block.cuh's finish_counter_base).
  int64_t counters = 0;
  __device__ int64_t begin(int64_t k) const { return min(count, k * chunk); }
  __device__ int64_t end(int64_t k) const { return min(count, (k + 1) * chunk); }
};

// A channel's statistics from its mean and biased variance: mean, rstd: (C) and, when `update`, the
// running statistics, whose values before the update the caller has loaded (old_mean, old_var) so
// that their loads need not wait for the statistics.
template <typename A>
__device__ void store_channel_stats(int64_t c, A mu, A var, int64_t count, A eps, A* mean, A* rstd, bool update,
                                    RunningStat running_mean, RunningStat running_var, double old_mean,
                                    double old_var, double momentum) {
  mean[c] = mu;
  rstd[c] = inv_std(var, eps);
  if (update) {
    // Explicit roundings keep nvcc from contracting into FMAs: the same bits as the CPU's loop.
    const double n = double(count), var_unbiased = __ddiv_rn(__dmul_rn(double(var), n), n - 1);
    const double keep = 1 - momentum;
    running_mean.store(c, __dadd_rn(__dmul_rn(keep, old_mean), __dmul_rn(momentum, double(mu))));
    running_var.store(c, __dadd_rn(__dmul_rn(keep, old_var), __dmul_rn(momentum, var_unbiased)));
  }
}

// dw = sum(g xhat), db = sum(g) (D, (C); stored or added: ParamGrads) and the coefficients of dx,
// coef: (2, C) = mean(g), mean(g xhat) in training, zeros in eval.
template <typename D, typename A>
__device__ void store_channel_grads(int64_t c, A s_g, A s_gx, int64_t C, int64_t count, bool training,
                                    const ParamGrads<D>& grads, A* coef) {
  grads.store(c, s_gx, s_g);
  coef[c] = training ? s_g / A(count) : A(0);
  coef[C + c] = training ? s_gx / A(count) : A(0);
}

}  // namespace reel::cuda::batch_norm_detail
