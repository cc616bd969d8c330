// sync_batch_norm — batch normalisation whose batch statistics span every rank (torch's SyncBatchNorm).
//
// x_r: (N_r, C, *) on rank r; the statistics of channel c are over all ranks' N_r x prod(*) values.
// Forward (training), in x's dtype (f32 for f16/bf16 inputs):
//   each rank: n_r = N_r prod(*),  m_r = mean of x_r,  M2_r = sum (x_r - m_r)^2      (two passes, exact-ish)
//   all_gather of [n_r, m_r (C), M2_r (C)] -> (K, 2C+1)                               (one collective)
//   n = sum n_r,  mean = sum n_r m_r / n,  M2 = sum (M2_r + n_r (m_r - mean)^2)        (Chan et al.'s merge)
//   var = M2 / n (biased),  rstd = 1 / sqrt(var + eps)
//   y = (x - mean) rstd w + b                 (w, b: (C), broadcast over N and *)
//   running_mean <- (1 - momentum) running_mean + momentum mean
//   running_var  <- (1 - momentum) running_var  + momentum M2 / (n - 1)   (unbiased, as BatchNorm)
// Backward, with g = dL/dy where L is the sum of every rank's loss:
//   each rank: sum_g = sum g,  sum_gx = sum g xhat           (xhat = (x - mean) rstd; per channel)
//   all_reduce(sum) of [sum_g, sum_gx] (2C)                  (one collective)
//   dx = w rstd (g - SUM_g / n - xhat SUM_gx / n)            (the all-ranks sums, the all-ranks n)
//   dw = sum_gx,  db = sum_g                                 (this rank's: DDP's all-reduce averages them)
// So dx_r is exactly the gradient of the all-ranks loss, and the mean over ranks of dw, db is the
// gradient of the mean loss: the equivalent of one BatchNorm over the concatenated batch.
// With world size 1, or in eval mode, this is batch_norm (autograd/ops.h) itself.
// Every rank must call it at the same point (two collectives per call in training); C must agree.
#pragma once
#include "distributed/communicator.h"
#include "tensor/tensor.h"

namespace reel::dist {

Tensor sync_batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps, Communicator& comm);

}  // namespace reel::dist
