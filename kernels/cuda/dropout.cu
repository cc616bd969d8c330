// CUDA kernels of dropout and dropout_mask (registered from norm.cu's register_norm_cuda_kernels()).
//
// The CPU's rule exactly (kernels/cpu/norm.cpp, tensor/rng.h): element i (row-major) is kept iff
//   philox_uniform(seed, offset, i) >= float(p),
// where philox_uniform takes word i % 4 of philox4x32_10(seed, offset + i / 4) as (w >> 8) * 2^-24.
//   mask = kept ? 1/(1-p) : 0, the kept value rounded to x's dtype on the host exactly as the CPU does
//   (double -> Acc -> dtype), so that y = x * mask exactly, as backward assumes;
//   y = x * mask computed in Acc (a dropped inf or NaN gives NaN, as on the CPU); p == 1 gives mask 0.
// Launch: one thread per group of 4 elements, so each Philox evaluation yields all 4 of its words;
// grid-stride over the groups. The key and first counter come from PhiloxArgs (tensor/rng.h): the
// attrs, or in a compiled plan the state the plan writes on the device before each run, read here.
#include "kernels/cuda/cuda_registry.h"
#include "kernels/cuda/norm_common.cuh"
#include "kernels/philox_args.h"
#include "tensor/rng.h"

namespace reel {
namespace cuda {
namespace {

using namespace norm_detail;

// x, y, mask: n contiguous values; `keep` is the kept mask value, already rounded to D. Without x
// (and y), the mask alone (dropout_mask).
template <typename D, typename A = Acc<D>>
__global__ void dropout_fwd_kernel(const D* x, D* y, D* mask, int64_t n, PhiloxArgs rng, float threshold, A keep) {
  grid_dependency_wait();
  const int64_t groups = (n + 3) / 4;
  const uint64_t seed = rng.key(), offset = rng.start();
  for (int64_t q = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q < groups; q += int64_t(gridDim.x) * blockDim.x) {
    const Philox4 r = philox4x32_10(seed, offset + uint64_t(q));
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t i = 4 * q + k;
      if (i >= n) break;
      const float u = float(r.w[k] >> 8) * (1.0f / 16777216.0f);  // philox_uniform(seed, offset, i)
      const A m = u >= threshold ? keep : A(0);
      mask[i] = from_acc<D>(m);
      if (x) y[i] = from_acc<D>(to_acc(x[i]) * m);
    }
  }
}

// Launches the mask (and, with x, y = x * mask) of the call's n elements; the Philox state, when the
// call has one, is input `state_input`.
void launch_dropout(const char* op, const KernelCall& c, size_t state_input, const Tensor* x, const Tensor* y,
                    const Tensor& mask) {
  const int64_t n = mask.numel();
  if (n == 0) return;
  const double p = c.attrs.f("p");
  const PhiloxArgs rng = philox_args(c, state_input);
  const double keep = dropout_kept_value(mask.dtype(), p);
  visit_float(mask.dtype(), op, [&]<typename D>() {
    using A = Acc<D>;
    launch_kernel(dropout_fwd_kernel<D>, blocks_for((n + 3) / 4), 256, 0, stream_of(mask), x ? in_ptr<D>(*x) : nullptr,
                  y ? out_ptr<D>(*y) : nullptr, out_ptr<D>(mask), n, rng, float(p), A(keep));
    REEL_CUDA_LAUNCH_CHECK();
  });
}

void dropout_fwd(const KernelCall& c) {
  const Tensor x = contiguous_on_device(c.in[0]);
  launch_dropout("dropout", c, 1, &x, &c.out[0], c.out[1]);
}

void dropout_mask_fwd(const KernelCall& c) { launch_dropout("dropout_mask", c, 0, nullptr, nullptr, c.out[0]); }

}  // namespace
}  // namespace cuda

void register_dropout_cuda_kernels() {
  register_kernel(DeviceType::CUDA, OpKind::Dropout,
                  [](const KernelCall& c) { cuda::norm_detail::run_into_contiguous(c, cuda::dropout_fwd); });
  register_kernel(DeviceType::CUDA, OpKind::DropoutMask,
                  [](const KernelCall& c) { cuda::norm_detail::run_into_contiguous(c, cuda::dropout_mask_fwd); });
}

}  // namespace reel
