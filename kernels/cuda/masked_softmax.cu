// Masked softmax forward and backward (see masked_softmax.h).
//
//   forward:   v_c = mask[r % T, c] != 0 ? fill : x[r, c];   y[r, c] = exp(v_c - m) / s
//   backward:  d_c = y_c (g_c - sum_k g_k y_k);               dx[r, c] = mask[r % T, c] != 0 ? 0 : d_c
// One team (a warp for rows up to 1024, else a block) per row, with softmax.cu's online statistics and
// reductions (reduce_common.cuh) in the same order, so results match the unfused ops exactly.
#include "kernels/cuda/masked_softmax.h"

#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/reduce_common.cuh"
#include "kernels/dispatch.h"

namespace reel::cuda {

namespace {

using namespace reduce_detail;

constexpr int kThreads = 256;
constexpr int kRowThreads = 512;

template <typename H, bool kBlock>
__global__ void masked_softmax_fwd_row_kernel(const float* x, const float* mask, int64_t mask_rows, float fill, float* y,
                                              H* y16, int64_t rows, int64_t C) {
  grid_dependency_wait();
  using Team = RowTeam<kBlock>;
  for (int64_t row = Team::first_row(); row < rows; row += Team::row_stride()) {
    const float* xr = x + row * C;
    const float* mr = mask + (row % mask_rows) * C;
    auto v = [&](int64_t c) { return mr[c] != 0.0f ? fill : xr[c]; };
    const MaxSum<float> t = strided_fold<MaxSumOp<float>, MaxSum<float>>(Team::rank(), C, Team::size(), PushFn<float>(), v);
    const MaxSum<float> f = finalize(Team::template reduce<MaxSumOp<float>>(t));
    const float inv_s = 1.0f / f.s;
    for (int64_t c = Team::rank(); c < C; c += Team::size()) {
      const float out = exp_acc(v(c) - f.m) * inv_s;
      if (y) y[row * C + c] = out;
      if (y16) y16[row * C + c] = from_acc<H>(out);
    }
  }
}

template <typename H, bool kBlock>
__global__ void masked_softmax_bwd_row_kernel(const float* g, const float* y, const float* mask, int64_t mask_rows,
                                              float* dx, H* dx16, int64_t rows, int64_t C) {
  grid_dependency_wait();
  using Team = RowTeam<kBlock>;
  for (int64_t row = Team::first_row(); row < rows; row += Team::row_stride()) {
    const int64_t off = row * C;
    const float* mr = mask + (row % mask_rows) * C;
    const float acc = strided_fold<AddOp<float>, float>(Team::rank(), C, Team::size(), combine_fn<AddOp<float>, float>(),
                                                        [&](int64_t c) { return g[off + c] * y[off + c]; });
    const float sum = Team::template reduce<AddOp<float>>(acc);
    for (int64_t c = Team::rank(); c < C; c += Team::size()) {
      const float d = mr[c] != 0.0f ? 0.0f : y[off + c] * (g[off + c] - sum);
      if (dx) dx[off + c] = d;
      if (dx16) dx16[off + c] = from_acc<H>(d);
    }
  }
}

void check_layout(const char* op, const Tensor& x, const Tensor& mask, const Tensor& y, const Tensor& y16) {
  const int64_t C = x.dim() ? x.shape().back() : 1;
  REEL_CHECK(x.dtype() == DType::f32 && x.is_contiguous() && mask.dtype() == DType::f32 && mask.is_contiguous() &&
                 mask.dim() == 2 && mask.shape()[1] == C && x.numel() % std::max<int64_t>(mask.numel(), 1) == 0 &&
                 (!y.defined() || (y.dtype() == DType::f32 && y.is_contiguous() && y.shape() == x.shape())) &&
                 (!y16.defined() || (y16.is_contiguous() && y16.shape() == x.shape() &&
                                     (y16.dtype() == DType::bf16 || y16.dtype() == DType::f16))),
             op, ": expected contiguous f32 rows ", shape_str(x.shape()), " with a (T, C) f32 mask, got mask ",
             shape_str(mask.shape()));
}

// Runs launch.template operator()<H, kBlock>() with H the 16-bit output type (float when there is none).
template <typename Launch>
void dispatch_rows(const Tensor& out16, int64_t C, Launch&& launch) {
  auto by_team = [&]<typename H>() {
    if (C <= kWarpRow) launch.template operator()<H, false>();
    else launch.template operator()<H, true>();
  };
  if (!out16.defined()) by_team.template operator()<float>();
  else if (out16.dtype() == DType::bf16) by_team.template operator()<__nv_bfloat16>();
  else by_team.template operator()<__half>();
}

template <typename H>
H* opt_ptr(const Tensor& t) {
  return t.defined() ? static_cast<H*>(t.data_ptr()) : nullptr;
}

}  // namespace

void masked_softmax_fwd(const Tensor& x, const Tensor& mask, double fill, const Tensor& y, const Tensor& y16) {
  check_layout("masked_softmax", x, mask, y, y16);
  const int64_t C = x.shape().back(), rows = x.numel() / C, mask_rows = mask.shape()[0];
  if (rows == 0 || C == 0) return;
  cudaStream_t st = stream_of(x);
  dispatch_rows(y16, C, [&]<typename H, bool kBlock>() {
    const unsigned grid = kBlock ? grid_for(rows) : grid_for(ceil_div(rows, kThreads / kWarp));
    launch_kernel(masked_softmax_fwd_row_kernel<H, kBlock>, grid, kBlock ? kRowThreads : kThreads, 0, st,
                  in_ptr<float>(x), in_ptr<float>(mask), mask_rows, float(fill), opt_ptr<float>(y), opt_ptr<H>(y16),
                  rows, C);
    REEL_CUDA_LAUNCH_CHECK();
  });
}

void masked_softmax_bwd(const Tensor& g, const Tensor& y, const Tensor& mask, const Tensor& dx, const Tensor& dx16) {
  check_layout("masked_softmax_backward", g, mask, dx, dx16);
  REEL_CHECK(y.dtype() == DType::f32 && y.is_contiguous() && y.shape() == g.shape(),
             "masked_softmax_backward: y ", shape_str(y.shape()), " must be contiguous f32 like g");
  const int64_t C = g.shape().back(), rows = g.numel() / C, mask_rows = mask.shape()[0];
  if (rows == 0 || C == 0) return;
  cudaStream_t st = stream_of(g);
  dispatch_rows(dx16, C, [&]<typename H, bool kBlock>() {
    const unsigned grid = kBlock ? grid_for(rows) : grid_for(ceil_div(rows, kThreads / kWarp));
    launch_kernel(masked_softmax_bwd_row_kernel<H, kBlock>, grid, kBlock ? kRowThreads : kThreads, 0, st,
                  in_ptr<float>(g), in_ptr<float>(y), in_ptr<float>(mask), mask_rows, opt_ptr<float>(dx),
                  opt_ptr<H>(dx16), rows, C);
    REEL_CUDA_LAUNCH_CHECK();
  });
}

namespace {

// The fused ops' kernels (schemas in kernels/schema/reduce.cpp): the f32 result when kept, then the
// 16-bit copy when asked for.
Tensor kept_f32(const KernelCall& c) { return c.attrs.b("keep_f32", true) ? c.out[0] : Tensor(); }
Tensor copy_16(const KernelCall& c) { return c.attrs.has("dtype") ? c.out.back() : Tensor(); }

void masked_softmax_kernel(const KernelCall& c) {
  masked_softmax_fwd(contiguous_on_device(c.in[0]), contiguous_on_device(c.in[1]), c.attrs.f("value"), kept_f32(c),
                     copy_16(c));
}

void masked_softmax_backward_kernel(const KernelCall& c) {
  masked_softmax_bwd(contiguous_on_device(c.in[0]), contiguous_on_device(c.in[1]), contiguous_on_device(c.in[2]),
                     kept_f32(c), copy_16(c));
}

}  // namespace

void register_masked_softmax_cuda_kernels() {
  register_kernel(DeviceType::CUDA, OpKind::MaskedSoftmax, masked_softmax_kernel);
  register_kernel(DeviceType::CUDA, OpKind::MaskedSoftmaxBackward, masked_softmax_backward_kernel);
}

}  // namespace reel::cuda
