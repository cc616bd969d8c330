// CUDA kernels of conv2d and its two backward ops on cuDNN's legacy convolution API, plus a small
// bias-add kernel; a stem convolution (few input channels: an RGB image's), which cuDNN's kernels
// serve badly, takes reel's own forward and weight-gradient kernels (kernels/cuda/conv2d_stem.cu).
//
//   forward          y (N, O, Ho, Wo) = x (N, C, H, W) (*) w (O, C/G, kH, kW) + bias (O)
//                    y[n, o, oh, ow] = sum_{c,i,j} w[o, c, i, j] x[n, q*C/G + c, oh*sh - ph + i, ow*sw - pw + j]
//                    with q = o / (O/G) the group of o (cross-correlation, zero padding;
//                    Ho = (H + 2 ph - kH) / sh + 1, likewise Wo)
//   groups G         cudnnSetConvolutionGroupCount: the tensors keep their full C and O, the filter
//                    descriptor says C/G (cuDNN's convention, as PyTorch's weight shape)
//   backward input   dx = cudnnConvolutionBackwardData(w, g)     (the adjoint of the forward in x)
//   backward weight  dw = cudnnConvolutionBackwardFilter(x, g)   (summed over the batch)
//   The bias gradient is sum(g, {0, 2, 3}), done by autograd; stride/padding come as [h, w] attrs.
//
// Layout: each call runs in one memory format, NCHW or NHWC (channels-last; the weight then in cuDNN's
// KRSC order), taken from its main activation: x for the forward and the weight gradient, the dx it
// writes for the input gradient. NHWC is what cuDNN's tensor-core kernels read natively: with NCHW
// operands it wraps each 16-bit convolution in transposes of its own (nchwToNhwc / nhwcToNchw, about
// as many launches as the convolutions themselves), which autocast's channels-last operands avoid.
// Operands not dense in the call's format (or whose data is not 16-byte aligned, which some of
// cuDNN's vectorised kernels assume) are copied into it first, and an output that is not is computed
// into a temporary and copied into place.
//
// Precision (the CPU-parity contract):
//   f32      data FLOAT, compute FLOAT, CUDNN_FMA_MATH: no TF32, results stay exact-f32 FMA sums
//   f64      data DOUBLE, compute DOUBLE, CUDNN_DEFAULT_MATH
//   f16/bf16 data HALF/BFLOAT16, compute FLOAT (PSEUDO_HALF / PSEUDO_BFLOAT16 configs, f32
//            accumulation), CUDNN_TENSOR_OP_MATH: tensor cores
// With a bias in f16/bf16 the convolution's result is rounded to 16 bits before the bias is added
// and rounded again (the CPU adds the bias in f32 and rounds once): a difference of at most about
// one 16-bit ulp. f32 and f64 add the bias in their own type, exactly as the CPU.
//
// Algorithms: chosen ONCE per (op, dtype, device, shapes, stride, padding, groups) by cuDNN's heuristics —
// or, with autotuning on (kernels/autotune.h), by timing the candidates (cudnnFind*AlgorithmEx) on
// the first call's tensors — as the best-ranked supported candidate that is deterministic (some
// backward-filter algorithms accumulate with atomics; kernels/autotune.h's switch allows them), for
// f32 never a tensor-op one, and for f32/f64 a GEMM-like direct sum (no FFT or Winograd, whose
// transforms cost accuracy); cached together with the descriptors and the workspace size in a
// process-wide map. The heuristics run no device work and never synchronise, so even a first call inside a CUDA graph
// capture is safe; still, as for every op, the first call for a shape should happen eagerly before
// capture (compile's warm-up call does), so that the cache and the workspace pool are filled.
// Workspaces come from the caching allocator (workspace(bytes, device)).
//
// Empty cases: an empty output launches nothing; an empty x (C, H or W zero) makes y = bias (or 0)
// and dw = 0; cuDNN is never called with a zero dim.
#include <mma.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <mutex>

#include "kernels/autotune.h"
#include "kernels/cuda/conv2d_stem.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/device_timing.h"
#include "kernels/cuda/last_block.cuh"

namespace reel::cuda {

namespace {

// ---- bias add ----

// y dense, channel o of element i = (i / P) % O: P = Ho*Wo for NCHW, 1 for NHWC (channels innermost).
// y[.., o, ..] += bias[o * bias_stride], in the accumulation type. A grid-stride loop over all
// elements; memory-bound, so the index division is free.
template <typename D>
__global__ void conv2d_fwd_bias_kernel(D* y, const D* bias, int64_t bias_stride, int64_t O, int64_t P, int64_t n) {
  grid_dependency_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = (i / P) % O;
    y[i] = from_acc<D>(to_acc(y[i]) + to_acc(bias[o * bias_stride]));
  }
}

void add_bias(const Tensor& y, const Tensor& bias, MemoryFormat format) {
  const int64_t n = y.numel(), O = y.shape()[1];
  const int64_t P = format == MemoryFormat::ChannelsLast ? 1 : y.shape()[2] * y.shape()[3];
  visit_float_dtype(y.dtype(), "conv2d", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, int64_t>) {
      using D = Dev<T>;
      launch_kernel(conv2d_fwd_bias_kernel<D>, blocks_for(n), 256, 0, stream_of(y), static_cast<D*>(y.data_ptr()),
                    static_cast<const D*>(bias.data_ptr()), bias.strides()[0], O, P, n);
      REEL_CUDA_LAUNCH_CHECK();
    }
  });
}

// ---- dense operands ----


// `t` dense in `format` with 16-byte-aligned data: t itself or a copy on the device.
Tensor dense_for_cudnn(const Tensor& t, MemoryFormat format) {
  if (t.is_contiguous(format) && aligned16(t.data_ptr())) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device(), format);
  copy_on_device(c, t);
  return c;
}

// Where the kernel writes: `out` itself when cuDNN can, else a temporary copied back by finish().
Tensor dense_output(const Tensor& out, MemoryFormat format) {
  return out.is_contiguous(format) && aligned16(out.data_ptr()) ? out
                                                     : Tensor::empty(out.shape(), out.dtype(), out.device(), format);
}

void finish(const Tensor& out, const Tensor& dense) {
  if (!dense.is_same(out)) copy_on_device(out, dense);
}

void zero_fill(const Tensor& t) {  // all-zero bits are 0.0 in every float dtype
  REEL_CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), 0, t.nbytes(), stream_of(t)));
}

// ---- descriptors and the algorithm cache ----

enum class ConvOp : int64_t { Forward, BackwardData, BackwardFilter };

ConvGeom make_geom(const Shape& x, const Shape& w, const Shape& y, const Attrs& attrs, MemoryFormat format) {
  const auto& s = attrs.ints("stride");
  const auto& p = attrs.ints("padding");
  return {x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], s[0], s[1], p[0], p[1], attrs.i("groups", 1), format};
}

struct CudnnTypes {
  cudnnDataType_t data, compute;
  cudnnMathType_t math;
};

CudnnTypes cudnn_types(DType dt) {
  switch (dt) {
    case DType::f32: return {CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH};  // no TF32
    case DType::f64: return {CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE, CUDNN_DEFAULT_MATH};
    case DType::f16: return {CUDNN_DATA_HALF, CUDNN_DATA_FLOAT, CUDNN_TENSOR_OP_MATH};
    case DType::bf16: return {CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT, CUDNN_TENSOR_OP_MATH};
    default: throw Error(detail::cat("conv2d: dtype ", dtype_name(dt), " is not supported on CUDA"));
  }
}

int as_int(int64_t v, const char* what) {
  REEL_CHECK(v <= int64_t(INT32_MAX), "conv2d on CUDA: ", what, " = ", v, " exceeds cuDNN's 32-bit limit");
  return int(v);
}

// The descriptors of one convolution and the algorithm chosen for one of its three ops.
// Created once per cache key, never freed before exit; only read after creation.
struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;  // a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t, by op
  size_t workspace_bytes = 0;

  ConvPlan() = default;
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;
  ~ConvPlan() {  // statuses ignored: nothing useful can be done about a failure here
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  }
};

void set_descriptors(ConvPlan& p, const ConvGeom& g, const CudnnTypes& t) {
  REEL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.x));
  REEL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.y));
  REEL_CUDNN_CHECK(cudnnCreateFilterDescriptor(&p.w));
  REEL_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&p.conv));
  // Sizes are given in NCHW order whatever the format; the format says how they lie in memory.
  const cudnnTensorFormat_t f = g.format == MemoryFormat::ChannelsLast ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  REEL_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.x, f, t.data, as_int(g.N, "N"), as_int(g.C, "C"), as_int(g.H, "H"),
                                              as_int(g.W, "W")));
  REEL_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.y, f, t.data, as_int(g.N, "N"), as_int(g.O, "O"),
                                              as_int(g.Ho, "Ho"), as_int(g.Wo, "Wo")));
  REEL_CUDNN_CHECK(cudnnSetFilter4dDescriptor(p.w, t.data, f, as_int(g.O, "O"), as_int(g.C / g.G, "C/groups"),
                                              as_int(g.kH, "kH"), as_int(g.kW, "kW")));
  REEL_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(p.conv, as_int(g.ph, "pad_h"), as_int(g.pw, "pad_w"),
                                                   as_int(g.sh, "stride_h"), as_int(g.sw, "stride_w"), 1, 1,
                                                   CUDNN_CROSS_CORRELATION, t.compute));
  REEL_CUDNN_CHECK(cudnnSetConvolutionGroupCount(p.conv, as_int(g.G, "groups")));
  REEL_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, t.math));
}

// Whether an algorithm sums the products directly, as a GEMM does (the FFT and Winograd algorithms
// transform the operands and carry transform round-off, ~1e-5 relative in f32 where a direct sum
// gives ~1e-7: measured on an H200, where the heuristics rank FFT and Winograd first for f32).
bool direct_sum(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}
bool direct_sum(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
}
bool direct_sum(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}

// The heuristics' (or the timing's) best usable candidate: supported; for f32 never a tensor-op (TF32)
// one; deterministic (no atomics: the same inputs give the same bits every run, which a compiled
// replay's parity with eager relies on) unless none is; for f32 and f64 a direct-sum one (exact
// parity with the CPU) unless none is. f16/bf16 otherwise take the first choice, Winograd included
// (within 16-bit round-off). Passes relax the wishes in that order.
template <typename Perf>
const Perf* pick(const Perf* perf, int count, DType dt) {
  const bool exact = dt == DType::f32 || dt == DType::f64;
  // pass 0: deterministic and (exact types) direct sum; 1: deterministic; 2: direct sum; 3: any.
  // With deterministic_algorithms() off, the first two passes are skipped.
  for (int pass = deterministic_algorithms() ? 0 : 2; pass < 4; ++pass) {
    const bool want_deterministic = pass < 2, want_direct = exact && (pass == 0 || pass == 2);
    for (int i = 0; i < count; ++i) {
      if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
      const bool tensor_op =
          perf[i].mathType == CUDNN_TENSOR_OP_MATH || perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
      if (dt == DType::f32 && tensor_op) continue;
      if (want_deterministic && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
      if (want_direct && !direct_sum(perf[i].algo)) continue;
      return &perf[i];
    }
  }
  return nullptr;
}

// The tensors of the call that first needs a plan: autotuning times candidates on them (the output is
// overwritten by the real call right after).
struct ConvData {
  const void* a;  // forward: x;  backward data: w;  backward filter: x
  const void* b;  // forward: w;  backward data: dy; backward filter: dy
  void* out;      // forward: y;  backward data: dx; backward filter: dw
};

// Scratch for timing candidates: algorithms needing more report an allocation failure and are skipped.
constexpr size_t kTuningWorkspace = size_t(256) << 20;

// Sets p.algo and p.workspace_bytes: cuDNN's heuristic ranking, or (tune) the candidates timed on
// `d`, fastest first; either way filtered by pick()'s precision contract.
void choose_algorithm(ConvPlan& p, ConvOp op, cudnnHandle_t h, DType dt, bool tune, const ConvData& d,
                      Device device) {
  constexpr int kMax = 32;  // more than cuDNN returns: each algorithm at most once per math type
  int n = 0;
  const char* what = op == ConvOp::Forward        ? "conv2d"
                     : op == ConvOp::BackwardData ? "conv2d_backward_input"
                                                  : "conv2d_backward_weight";
  auto use = [&](const auto* best) {
    REEL_CHECK(best != nullptr, what, " on CUDA: cuDNN offers no algorithm for this shape and dtype ",
               dtype_name(dt));
    p.algo = int(best->algo);
    // f16/bf16 and f64 run in the math type the heuristic assumed; f32 keeps CUDNN_FMA_MATH.
    if (dt != DType::f32) REEL_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, best->mathType));
  };
  Tensor scratch = tune ? workspace(kTuningWorkspace, device) : Tensor();
  void* ws = tune ? scratch.data_ptr() : nullptr;
  if (op == ConvOp::Forward) {
    cudnnConvolutionFwdAlgoPerf_t perf[kMax];
    if (tune)
      REEL_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, p.x, d.a, p.w, d.b, p.conv, p.y, d.out, kMax, &n, perf,
                                                              ws, kTuningWorkspace));
    else
      REEL_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.w, p.conv, p.y, kMax, &n, perf));
    use(pick(perf, n, dt));
    REEL_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.conv, p.y,
                                                             cudnnConvolutionFwdAlgo_t(p.algo), &p.workspace_bytes));
  } else if (op == ConvOp::BackwardData) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
    if (tune)
      REEL_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, p.w, d.a, p.y, d.b, p.conv, p.x, d.out, kMax, &n,
                                                                   perf, ws, kTuningWorkspace));
    else
      REEL_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w, p.y, p.conv, p.x, kMax, &n, perf));
    use(pick(perf, n, dt));
    REEL_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
        h, p.w, p.y, p.conv, p.x, cudnnConvolutionBwdDataAlgo_t(p.algo), &p.workspace_bytes));
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
    if (tune)
      REEL_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, p.x, d.a, p.y, d.b, p.conv, p.w, d.out, kMax,
                                                                     &n, perf, ws, kTuningWorkspace));
    else
      REEL_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x, p.y, p.conv, p.w, kMax, &n, perf));
    use(pick(perf, n, dt));
    REEL_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, p.x, p.y, p.conv, p.w, cudnnConvolutionBwdFilterAlgo_t(p.algo), &p.workspace_bytes));
  }
}

// The cached plan for (op, dtype, device, geometry), made on first use. Plans live until exit.
const ConvPlan& conv_plan(ConvOp op, const ConvGeom& g, DType dt, Device device, cudnnHandle_t h, const ConvData& d) {
  using Key = std::array<int64_t, 19>;
  static std::mutex mutex;
  static std::map<Key, std::unique_ptr<ConvPlan>> plans;
  const bool tune = autotune_enabled() && !capturing(device);  // h is bound to device's current stream
  const Key key{int64_t(op), int64_t(dt), device.index, g.N, g.C, g.H, g.W, g.O, g.kH, g.kW, g.Ho, g.Wo,
                g.sh, g.sw, g.ph, g.pw, int64_t(autotune_enabled()) + 2 * int64_t(deterministic_algorithms()),
                int64_t(g.format), g.G};
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<ConvPlan>& slot = plans[key];
  if (!slot) {
    auto plan = std::make_unique<ConvPlan>();
    set_descriptors(*plan, g, cudnn_types(dt));
    choose_algorithm(*plan, op, h, dt, tune, d, device);
    slot = std::move(plan);  // only a complete plan enters the cache (a throw above leaves it empty)
  }
  return *slot;
}

// alpha = 1, beta = 0 in the type cuDNN expects: double for f64 data, float otherwise.
struct Blend {
  float f[2] = {1.0f, 0.0f};
  double d[2] = {1.0, 0.0};
  bool f64;
  explicit Blend(DType dt) : f64(dt == DType::f64) {}
  const void* alpha() const { return f64 ? static_cast<const void*>(&d[0]) : static_cast<const void*>(&f[0]); }
  const void* beta() const { return f64 ? static_cast<const void*>(&d[1]) : static_cast<const void*>(&f[1]); }
};

// Workspace of the plan's size (an undefined tensor when none is needed) and its pointer.
struct Workspace {
  Tensor t;
  void* ptr = nullptr;
  Workspace(size_t bytes, Device device) {
    if (bytes == 0) return;
    t = workspace(bytes, device);
    ptr = t.data_ptr();
  }
};

// ---- the three ops ----

// x: (N, C, H, W), w: (O, C/G, kH, kW), bias: (O) or undefined -> y: (N, O, Ho, Wo)
void conv2d_fwd_cudnn_kernel(const KernelCall& c) {
  const Tensor& out = c.out[0];
  if (out.numel() == 0) return;
  const MemoryFormat format = c.in[0].suggested_format();
  Tensor y = dense_output(out, format);
  const Tensor& bias = c.in[2];
  if (c.in[0].numel() == 0) {  // C, H or W is zero: nothing but padding is read
    zero_fill(y);
  } else {
    Tensor x = dense_for_cudnn(c.in[0], format), w = dense_for_cudnn(c.in[1], format);
    const ConvGeom g = make_geom(x.shape(), w.shape(), y.shape(), c.attrs, format);
    if (stem_convolution(g, y.dtype()) && aligned16(y.data_ptr())) {
      stem_forward_into(x, w, y, g);
      if (bias.defined()) add_bias(y, bias, format);
      return finish(out, y);
    }
    cudnnHandle_t h = cudnn_handle(y.device());
    const ConvPlan& p = conv_plan(ConvOp::Forward, g, y.dtype(), y.device(), h, {x.data_ptr(), w.data_ptr(), y.data_ptr()});
    const Blend blend(y.dtype());
    Workspace ws(p.workspace_bytes, y.device());
    REEL_CUDNN_CHECK(cudnnConvolutionForward(h, blend.alpha(), p.x, x.data_ptr(), p.w, w.data_ptr(), p.conv,
                                             cudnnConvolutionFwdAlgo_t(p.algo), ws.ptr, p.workspace_bytes,
                                             blend.beta(), p.y, y.data_ptr()));
  }
  if (bias.defined()) add_bias(y, bias, format);
  finish(out, y);
}

// g: (N, O, Ho, Wo), w: (O, C/G, kH, kW) -> dx: (N, C, H, W)
void conv2d_bwd_input_cudnn_kernel(const KernelCall& c) {
  const Tensor& out = c.out[0];
  if (out.numel() == 0) return;  // otherwise N, C, H, W >= 1, so g is non-empty too
  const MemoryFormat format = out.suggested_format();
  Tensor dx = dense_output(out, format);
  Tensor g = dense_for_cudnn(c.in[0], format), w = dense_for_cudnn(c.in[1], format);
  const ConvGeom geo = make_geom(dx.shape(), w.shape(), g.shape(), c.attrs, format);
  cudnnHandle_t h = cudnn_handle(dx.device());
  const ConvPlan& p =
      conv_plan(ConvOp::BackwardData, geo, dx.dtype(), dx.device(), h, {w.data_ptr(), g.data_ptr(), dx.data_ptr()});
  const Blend blend(dx.dtype());
  Workspace ws(p.workspace_bytes, dx.device());
  REEL_CUDNN_CHECK(cudnnConvolutionBackwardData(h, blend.alpha(), p.w, w.data_ptr(), p.y, g.data_ptr(), p.conv,
                                                cudnnConvolutionBwdDataAlgo_t(p.algo), ws.ptr, p.workspace_bytes,
                                                blend.beta(), p.x, dx.data_ptr()));
  finish(out, dx);
}

// g: (N, O, Ho, Wo), x: (N, C, H, W) -> dw: (O, C/G, kH, kW)
void conv2d_bwd_weight_cudnn_kernel(const KernelCall& c) {
  const Tensor& out = c.out[0];
  if (out.numel() == 0) return;
  const MemoryFormat format = c.in[1].suggested_format();
  Tensor dw = dense_output(out, format);
  if (c.in[1].numel() == 0) {  // N, H or W is zero (C >= 1 here): an empty sum
    zero_fill(dw);
  } else {
    Tensor g = dense_for_cudnn(c.in[0], format), x = dense_for_cudnn(c.in[1], format);
    const ConvGeom geo = make_geom(x.shape(), dw.shape(), g.shape(), c.attrs, format);
    if (stem_convolution(geo, dw.dtype())) {
      stem_weight_gradient_into(g, x, dw, geo);
      return finish(out, dw);
    }
    cudnnHandle_t h = cudnn_handle(dw.device());
    const ConvPlan& p = conv_plan(ConvOp::BackwardFilter, geo, dw.dtype(), dw.device(), h,
                                  {x.data_ptr(), g.data_ptr(), dw.data_ptr()});
    const Blend blend(dw.dtype());
    Workspace ws(p.workspace_bytes, dw.device());
    REEL_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, blend.alpha(), p.x, x.data_ptr(), p.y, g.data_ptr(), p.conv,
                                                    cudnnConvolutionBwdFilterAlgo_t(p.algo), ws.ptr,
                                                    p.workspace_bytes, blend.beta(), p.w, dw.data_ptr()));
  }
  finish(out, dw);
}

}  // namespace

void register_conv2d_cuda_kernels() {
  register_kernel(DeviceType::CUDA, OpKind::Conv2d, conv2d_fwd_cudnn_kernel);
  register_kernel(DeviceType::CUDA, OpKind::Conv2dBackwardInput, conv2d_bwd_input_cudnn_kernel);
  register_kernel(DeviceType::CUDA, OpKind::Conv2dBackwardWeight, conv2d_bwd_weight_cudnn_kernel);
}

}  // namespace reel::cuda
