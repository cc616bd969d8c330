// CUDA kernels of fused scaled-dot-product self-attention, causal or not, with an optional additive
// mask (the math and the rounding points are in kernels/cpu/attention.cpp, the reference these
// kernels are tested against).
//
// Three implementations of the same op. cuDNN's fused attention (attention_cudnn.cu: the library's
// kernels, through the cuDNN frontend) takes the calls it supports (16-bit compute, no mask, head
// sizes up to 128) unless turned off (kernels/autotune.h); run_chosen below decides, per call or, with
// autotuning on, per shape by timing. reel's own two, one file each beside this one (shared tile
// loaders in attention_tiles.cuh), are the readable reference the tests hold cuDNN to, and run every
// other call; this file launches them:
//
//  - Tiled tensor-core kernels (16-bit compute, head size 32, 64 or 128): FlashAttention-2's scheme with
//    WMMA fragments. A block of 4 warps owns a tile of 64 rows, each warp 16 of them, and walks the other
//    side's tiles of 64 up to the causal diagonal (all of them when not causal, keys >= T hidden in
//    the last one); nothing T x T is ever written to global memory.
//      forward      block = 64 queries; per key tile: S = Q K^T (f32), the online softmax rescales the
//                   running output O and normaliser l by exp(m_old - m_new), then O += P V. At the end
//                   y = O / l and lse = m + log l.
//      backward     one launch, two roles (blockIdx.z), so no atomics and the same bits on every run:
//                   z = 0: block = 64 keys, walks the query tiles t >= s:  dV += P^T dO, dK += dS^T Q
//                   z = 1: block = 64 queries, walks the key tiles s <= t: dQ += dS K
//                   each recomputes P = exp(scale q.k - lse) and dP = dO v, dS = P (dP - D), with
//                   D = dy . y per query row computed while its dO tile is loaded.
//    Tiles are read straight from qkv's columns (f32 or 16-bit) and rounded to the compute dtype on
//    the way into shared memory; y and dqkv are written in the merged-heads layout. Two builds of this
//    scheme:
//      head size 32, 64   mma.sync kernels (attention_mma.cuh): scores, P and dS stay in registers,
//                         32 columns of the walked tile at a time, fragments read with ldmatrix.
//                         The next walked tile is fetched by cp.async while the current one is used
//                         (two buffers: 45 KiB of shared memory forward, 55 KiB backward). The
//                         backward first runs attention_dout_prep once: dO rounded to C and D per
//                         query row, which the kernel then fetches as they are.
//      head size 128      WMMA kernels (attention_wmma.cuh): scores and dP go from the accumulators
//                         to a per-warp f32 scratch tile, because the per-row softmax needs them by
//                         row and WMMA's fragment layout is opaque (and 16 x 128 accumulators per
//                         warp would not fit in registers). 70 KiB of shared memory per block.
//
//  - Row kernels (attention_rows.cuh; any head size, f32/f64 compute, 16-bit at other head sizes): a block
//    per query row (forward, backward's dQ) or key row (backward's dK, dV), scores for that row in
//    shared memory. Simple loops, the same rounding points, O(T) shared memory per block.
//
// Variants: the tiled kernels are built per (Causal, Masked) (visit_variant below), so the decoder's
// causal, unmasked kernel is the code it was before and does no work for the other cases; the row
// kernels take causal at run time (it bounds their loops only) and Masked as a template parameter.
// The mask is read through its broadcast strides (DeviceMask, attention_tiles.cuh), straight from
// global memory where a score is formed (one load per score, the same (t, s) entry for every head
// when it broadcasts over heads, so mostly from cache).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

#include "kernels/attention_mask.h"
#include "kernels/autotune.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_rows.cuh"
#include "kernels/cuda/attention_wmma.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_registry.h"
#include "kernels/cuda/device_timing.h"
#include "kernels/cuda/norm_common.cuh"
#include "tensor/log.h"

namespace reel {
namespace cuda {
namespace {

using namespace attention_detail;

// The shape an attention call works on.
struct AttentionGeometry {
  int B, T, H, d, hd;
  AttentionGeometry(const Tensor& qkv, const Attrs& a)
      : B(int(qkv.size(0))), T(int(qkv.size(1))), H(int(a.i("heads"))), d(int(qkv.size(2) / 3)), hd(d / H) {}
};

// Calls fn.template operator()<C>() with C the device type of the compute dtype: In itself, or a 16-bit
// type (only for f32/f16/bf16 In, as the schema allows).
template <typename In, typename Fn>
void visit_compute(DType compute, Fn&& fn) {
  if constexpr (std::is_same_v<In, double>) {
    fn.template operator()<double>();
  } else {
    if (compute == DType::bf16) fn.template operator()<__nv_bfloat16>();
    else if (compute == DType::f16) fn.template operator()<__half>();
    else fn.template operator()<In>();
  }
}

template <typename C>
constexpr bool kSixteenBit = std::is_same_v<C, __half> || std::is_same_v<C, __nv_bfloat16>;

// Calls fn.template operator()<Causal, Masked>() for the call's variant.
template <typename Fn>
void visit_variant(bool causal, bool masked, Fn&& fn) {
  if (causal) {
    if (masked) fn.template operator()<true, true>();
    else fn.template operator()<true, false>();
  } else {
    if (masked) fn.template operator()<false, true>();
    else fn.template operator()<false, false>();
  }
}

// The optional mask as the kernels read it; its dtype (the accumulation type A) the schema checked.
template <typename A>
DeviceMask<A> device_mask(const Tensor& mask, const char* op) {
  DeviceMask<A> m;
  if (!mask.defined()) return m;
  REEL_CHECK(mask.dtype() == (std::is_same_v<A, double> ? DType::f64 : DType::f32) && mask.device().is_cuda(), op,
             ": mask ", shape_str(mask.shape()), " ", dtype_name(mask.dtype()), " on ", mask.device().str(),
             " must be a CUDA tensor in the accumulation dtype");
  const AttentionMaskStrides st = attention_mask_strides(mask);
  m.data = static_cast<const A*>(mask.data_ptr());
  m.sb = st.b, m.sh = st.h, m.st = st.t, m.ss = st.s;
  return m;
}

// Calls fn.template operator()<HD>() when the tiled kernels take head size hd; false otherwise.
template <typename Fn>
bool visit_tiled_head(int hd, Fn&& fn) {
  switch (hd) {
    case 32: fn.template operator()<32>(); return true;
    case 64: fn.template operator()<64>(); return true;
    case 128: fn.template operator()<128>(); return true;
    default: return false;
  }
}

// Opts a kernel into its dynamic shared memory above the 48 KiB default, once per instantiation.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  REEL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// The row kernels keep a row's scores in shared memory: T values (two rows' worth in the backward).
constexpr size_t kMaxRowSmemBytes = 227 * 1024;  // an sm_90 block's opt-in limit
void check_row_smem(size_t bytes, int T, const char* op) {
  REEL_CHECK(bytes <= kMaxRowSmemBytes, op, ": a sequence of ", T, " positions needs ", bytes,
             " bytes of shared memory per row in the CUDA row kernels (at most ", kMaxRowSmemBytes,
             "); the tiled kernels (16-bit compute, head size 32, 64 or 128) take any length");
}

// An optional 16-bit copy of an output: its device pointer as C*, or null; it must be of the compute dtype.
template <typename C>
C* copy16_ptr(const Tensor& t, DType compute, const Shape& shape, const char* op) {
  if (!t.defined()) return nullptr;
  REEL_CHECK(t.dtype() == compute && t.shape() == shape && t.is_contiguous(), op, ": the 16-bit copy ",
             shape_str(t.shape()), " ", t.dtype(), " must be a contiguous ", shape_str(shape), " ",
             dtype_name(compute), " (the compute dtype)");
  return static_cast<C*>(t.data_ptr());
}
template <typename C>
C* copy16_ptr(const Tensor& t, DType compute, const AttentionGeometry& g, const char* op) {
  return copy16_ptr<C>(t, compute, Shape{g.B, g.T, g.d}, op);
}

// Calls fn.template operator()<T>() with T the device type operand t is stored in: In where t has the
// value dtype, or, for f32 values, C where t is in the 16-bit compute dtype (the compiler keeps qkv
// and the saved y in 16 bits when the kernels round them to C anyway: compile/passes/fuse_attention_cast.cpp).
template <typename In, typename C, typename Fn>
void visit_operand(const Tensor& t, DType value, DType compute, const char* op, const char* what, Fn&& fn) {
  if (t.dtype() == value) return fn.template operator()<In>();
  if constexpr (std::is_same_v<In, float> && kSixteenBit<C>) {
    if (t.dtype() == compute) return fn.template operator()<C>();
  }
  throw Error(detail::cat(op, ": ", what, " ", shape_str(t.shape()), " is ", dtype_name(t.dtype()), "; expected ",
                          dtype_name(value), " (the value dtype)",
                          value == DType::f32 && compute != DType::f32 ? std::string(" or ") + dtype_name(compute) + " (the compute dtype)" : ""));
}

// The register-resident kernels fetch tiles of operands in the compute dtype by cp.async, 16 bytes at a
// time: such an operand must start 16-byte aligned (a head's columns and rows then are too, head sizes
// being multiples of 8). Arena buffers and fresh tensors are; a view at an odd offset is copied to
// aligned scratch (kept alive in `keep` until the kernel has run, by stream order).
template <typename Q>
const Q* aligned_operand(const Q* p, size_t elements, Device device, cudaStream_t stream, Tensor& keep) {
  if (aligned16(p)) return p;
  keep = workspace(sizeof(Q) * elements, device);
  REEL_CUDA_CHECK(cudaMemcpyAsync(keep.data_ptr(), p, sizeof(Q) * elements, cudaMemcpyDeviceToDevice, stream));
  return static_cast<const Q*>(keep.data_ptr());
}

// dO in C and D per (batch, head, query) for the register-resident backward (attention_dout_prep), in
// scratch memory that lives until the backward has run (stream order). dO is dy itself when dy is in
// C already and aligned.
template <typename C>
struct Prepared {
  Tensor scratch;
  const C* dout;
  const float* D;
};
template <typename C, int HD, typename In, typename Y>
Prepared<C> prepare_dout(const In* dy, const Y* y, const AttentionGeometry& g, Device device, cudaStream_t stream) {
  const int64_t rows = int64_t(g.B) * g.T, elements = rows * g.d;
  const bool copy = !std::is_same_v<In, C> || !aligned16(dy);
  const size_t d_bytes = sizeof(float) * size_t(g.B) * g.H * g.T;
  const size_t dout_offset = (d_bytes + 255) / 256 * 256;
  Prepared<C> p;
  p.scratch = workspace(dout_offset + (copy ? sizeof(C) * size_t(elements) : 0), device);
  unsigned char* raw = static_cast<unsigned char*>(p.scratch.data_ptr());
  float* D = reinterpret_cast<float*>(raw);
  C* dout = copy ? reinterpret_cast<C*>(raw + dout_offset) : nullptr;
  constexpr int threads = 256;
  const int64_t chunks = elements / 4;
  launch_kernel(attention_dout_prep<C, HD, In, Y>, unsigned((chunks + threads - 1) / threads), threads, 0, stream, dy, y, dout,
                D, rows, g.T, g.H, g.d);
  REEL_CUDA_LAUNCH_CHECK();
  p.dout = copy ? dout : reinterpret_cast<const C*>(dy);
  p.D = D;
  return p;
}

// The forward's launch, once the operands are typed (In the value dtype, C the compute dtype, Q the
// dtype qkv is stored in) and the variant is chosen: the register-resident kernels for head sizes up to
// 64, the WMMA ones for 128, the row kernels otherwise.
template <typename In, typename C, typename Q, bool Causal, bool Masked>
void launch_attention_fwd(const Tensor& qkv, const AttentionGeometry& g, const Tensor& y, const Tensor& lse,
                          const Tensor& y16, DType compute, const Tensor& mask, cudaStream_t stream) {
  using A = Acc<In>;
  In* py = y.defined() ? static_cast<In*>(y.data_ptr()) : nullptr;
  C* p16 = copy16_ptr<C>(y16, compute, g, "attention");
  const Q* px = static_cast<const Q*>(qkv.data_ptr());
  bool tiled = false;
  if constexpr (kSixteenBit<C> && (std::is_same_v<In, float> || std::is_same_v<In, C>)) {
    tiled = visit_tiled_head(g.hd, [&]<int HD>() {
      const DeviceMask<float> m = device_mask<float>(mask, "attention");
      const unsigned tiles = (g.T + kTile - 1) / kTile;
      const dim3 grid(tiles, g.B * g.H);
      float* pl = static_cast<float*>(lse.data_ptr());
      const float scale = 1.0f / std::sqrt(float(g.hd));
      if constexpr (HD <= 64) {  // the register-resident kernel
        constexpr size_t bytes = mma_fwd_smem_bytes<C, HD>();
        auto kernel = attention_fwd_mma<In, Q, C, HD, 1, Causal, Masked>;
        const bool waves = more_than_one_wave(kernel, bytes, grid, qkv.device().index);
        if (waves) kernel = attention_fwd_mma<In, Q, C, HD, 4, Causal, Masked>;
        Tensor keep;
        const Q* q = aligned_operand(px, size_t(qkv.numel()), qkv.device(), stream, keep);
        const dim3 order = waves ? dim3(g.B * g.H, tiles) : grid;  // block order: attention_mma.cuh
        launch_kernel(kernel, order, kThreads, bytes, stream, q, py, p16, pl, g.T, g.H, g.d, scale, waves, m);
      } else {
        constexpr size_t bytes = tiled_smem_bytes<C, HD>();
        auto kernel = attention_fwd_tiled<In, Q, C, HD, Causal, Masked>;
        static const bool ready = (allow_smem(kernel, bytes), true);
        (void)ready;
        launch_kernel(kernel, grid, kThreads, bytes, stream, px, py, p16, pl, g.T, g.H, g.d, scale, m);
      }
      REEL_CUDA_LAUNCH_CHECK();
    });
  }
  if (!tiled) {
    const size_t bytes = sizeof(A) * size_t(g.T) + kRowSmemSlack;
    check_row_smem(bytes, g.T, "attention");
    auto kernel = attention_fwd_rows<In, Q, C, A, Masked>;
    if (bytes > 48 * 1024) allow_smem(kernel, bytes);
    launch_kernel(kernel, dim3(g.T, g.B * g.H), kRowThreads, bytes, stream, px, py, p16,
                  static_cast<A*>(lse.data_ptr()), g.T, g.H, g.d, g.hd, A(1) / std::sqrt(A(g.hd)), Causal,
                  device_mask<A>(mask, "attention"));
    REEL_CUDA_LAUNCH_CHECK();
  }
}

// Which implementation runs a call (kernels/autotune.h: CudnnAttention): cuDNN's fused attention where
// the mode asks for it and cuDNN takes the call, reel's own kernels otherwise. In Auto mode with
// autotuning on, a shape's first call outside a CUDA-graph capture runs each once to warm up and
// kTuningRuns times, timed by events, and the faster is kept for the shape; the outputs are then written
// once more by the one kept, so the call's result is that implementation's. The two give different
// bits (rounding points: attention_cudnn.h), so a timed shape keeps its choice for the process.
enum class Direction { Forward, Backward };
constexpr int kTuningRuns = 3;  // timed runs of each, after a warm-up (device_timing.h)

// Auto's rule without timing: cuDNN where B H ceil(T / 128) reaches the SM count. Fitted to the H200
// (132 SMs; bench/RESULTS.md, cuDNN 9 against reel's kernels, bf16, head size 64, forward + backward
// per launch): gpt-small's (16, 256, 8): 256, cuDNN 50.3 us against 74.1; ViT-Ti's (128, 65, 3, not
// causal): 384, cuDNN 54.4 against 72.2; gpt-tiny's (16, 128, 4): 64, cuDNN 37.4 against reel's 25.4
// (reel's 64-query tiles give such a shape twice the blocks).
bool cudnn_fills_the_gpu(const AttentionGeometry& g, Device device) {
  return int64_t(g.B) * g.H * ((g.T + 127) / 128) >= multiprocessor_count(device.index);
}

template <typename Cudnn, typename Readable>
void run_chosen(Direction direction, const AttentionGeometry& g, DType compute, bool causal, DType operands,
                Device device, Cudnn&& cudnn, Readable&& readable) {
  const CudnnAttention mode = cudnn_attention_mode();
  if (mode == CudnnAttention::Off) return readable();
  if (mode == CudnnAttention::On) {
    if (!cudnn()) readable();
    return;
  }
  // Auto: a shape autotuning has timed keeps that choice (also inside a capture, so a compiled step
  // runs what its eager first call chose); an untimed one follows the rule unless it is timed now.
  using Key = std::array<int64_t, 8>;
  static std::mutex mutex;
  static std::map<Key, bool> cudnn_faster;
  const Key key{int64_t(direction), g.B, g.T, g.H, g.hd, int64_t(compute), int64_t(causal), int64_t(operands)};
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cudnn_faster.find(key); it != cudnn_faster.end()) {
      if (!it->second || !cudnn()) readable();
      return;
    }
  }
  if (!autotune_enabled() || capturing(device)) {
    if (!cudnn_fills_the_gpu(g, device) || !cudnn()) readable();
    return;
  }
  // cuDNN's warm-up run also tells whether it takes the shape (nothing to time when it does not).
  const std::optional<float> t_cudnn = mean_device_ms(device, kTuningRuns, cudnn);
  if (!t_cudnn) return readable();
  const float t_readable = *mean_device_ms(device, kTuningRuns, [&] {
    readable();
    return true;
  });
  const bool choose_cudnn = *t_cudnn < t_readable;
  if (log_enabled("kernels"))
    log_line("kernels", detail::cat(direction == Direction::Forward ? "attention" : "attention_backward", " B ", g.B,
                                    " T ", g.T, " H ", g.H, " head size ", g.hd, ": cuDNN ", *t_cudnn, " ms, reel ",
                                    t_readable, " ms a call; ", choose_cudnn ? "cuDNN" : "reel's kernels", " kept"));
  {
    std::lock_guard<std::mutex> lock(mutex);
    cudnn_faster[key] = choose_cudnn;
  }
  if (choose_cudnn) cudnn();
  else readable();
}

}  // namespace

void attention_fwd_into(const Tensor& qkv_in, int64_t heads, DType compute, const Tensor& y, const Tensor& lse,
                        const Tensor& y16, bool causal, const Tensor& mask) {
  REEL_CHECK(y.defined() || y16.defined(), "attention: neither y nor its 16-bit copy is asked for");
  Tensor qkv = contiguous_on_device(qkv_in);
  const AttentionGeometry g(qkv, Attrs().set("heads", heads));
  if (int64_t(g.B) * g.T * g.H == 0) return;
  cudaStream_t stream = stream_of(qkv);
  const DType value = y.defined() ? y.dtype() : DType::f32;  // the dtype y is computed in
  auto readable = [&] {
    visit_float(value, "attention", [&]<typename In>() {
      visit_compute<In>(compute, [&]<typename C>() {
        visit_operand<In, C>(qkv, value, compute, "attention", "qkv", [&]<typename Q>() {
          visit_variant(causal, mask.defined(), [&]<bool Causal, bool Masked>() {
            launch_attention_fwd<In, C, Q, Causal, Masked>(qkv, g, y, lse, y16, compute, mask, stream);
          });
        });
      });
    });
  };
  if (mask.defined()) return readable();  // cuDNN's graph here has no mask
  run_chosen(
      Direction::Forward, g, compute, causal, qkv.dtype(), qkv.device(),
      [&] { return cudnn_attention_fwd(qkv, heads, compute, y, lse, y16, causal); }, readable);
}

namespace {

// The backward's launch, once visit_operand has typed its operands (In the value dtype, C the compute
// dtype; Q, Y, Dy those qkv, y and dy are stored in): the register-resident kernels for head sizes up
// to 64, the tiled ones for larger heads, the row kernels otherwise.
template <typename In, typename C, typename Q, typename Y, typename Dy, bool Causal, bool Masked>
void launch_attention_bwd(const Tensor& dy, const Tensor& qkv, const Tensor& y, const Tensor& lse, DType value,
                          const AttentionGeometry& g, const Tensor& dqkv, const Tensor& dqkv16, DType compute,
                          const Tensor& mask, cudaStream_t stream) {
  using A = Acc<In>;
  // The kernels other than the register-resident ones read dy in the value dtype: a 16-bit dy
  // is widened for them first (exactly: its f32 image).
  Tensor dy_wide;
  auto wide_dy = [&]() -> const In* {
    if constexpr (!std::is_same_v<Dy, In>) {
      dy_wide = Tensor::empty(dy.shape(), value, dy.device());
      copy_on_device(dy_wide, dy);
      return static_cast<const In*>(dy_wide.data_ptr());
    }
    return static_cast<const In*>(dy.data_ptr());
  };
  const Q* px = static_cast<const Q*>(qkv.data_ptr());
  const Y* py = static_cast<const Y*>(y.data_ptr());
  In* pd = dqkv.defined() ? static_cast<In*>(dqkv.data_ptr()) : nullptr;
  C* p16 = copy16_ptr<C>(dqkv16, compute, qkv.shape(), "attention_backward");
  bool tiled = false;
  if constexpr (kSixteenBit<C> && (std::is_same_v<In, float> || std::is_same_v<In, C>)) {
    tiled = visit_tiled_head(g.hd, [&]<int HD>() {
      const DeviceMask<float> m = device_mask<float>(mask, "attention_backward");
      const unsigned tiles = (g.T + kTile - 1) / kTile;
      const dim3 grid(tiles, g.B * g.H, 2);
      const float* pl = static_cast<const float*>(lse.data_ptr());
      const float scale = 1.0f / std::sqrt(float(g.hd));
      if constexpr (HD <= 64) {  // the register-resident kernel, after dO and D are prepared
        const Prepared<C> prep =
            prepare_dout<C, HD>(static_cast<const Dy*>(dy.data_ptr()), py, g, qkv.device(), stream);
        constexpr size_t bytes = mma_bwd_smem_bytes<C, HD>();
        static const bool ready = (allow_smem(attention_bwd_mma<Q, C, In, HD, 1, Causal, Masked>, bytes),
                                   allow_smem(attention_bwd_mma<Q, C, In, HD, 3, Causal, Masked>, bytes), true);
        (void)ready;
        auto kernel = attention_bwd_mma<Q, C, In, HD, 1, Causal, Masked>;
        const bool waves = more_than_one_wave(kernel, bytes, grid, qkv.device().index);
        if (waves) kernel = attention_bwd_mma<Q, C, In, HD, 3, Causal, Masked>;
        Tensor keep;
        const Q* q = aligned_operand(px, size_t(qkv.numel()), qkv.device(), stream, keep);
        const dim3 order = waves ? dim3(g.B * g.H, 2 * tiles) : grid;  // block order: attention_mma.cuh
        launch_kernel(kernel, order, kThreads, bytes, stream, prep.dout, prep.D, q, pl, pd, p16, g.T, g.H, g.d, scale,
                      waves, m);
      } else {
        constexpr size_t bytes = tiled_smem_bytes<C, HD>();
        auto kernel = attention_bwd_tiled<In, Q, Y, C, HD, Causal, Masked>;
        static const bool ready = (allow_smem(kernel, bytes), true);
        (void)ready;
        launch_kernel(kernel, grid, kThreads, bytes, stream, wide_dy(), px, py, pl, pd, p16, g.T, g.H, g.d, scale, m);
      }
      REEL_CUDA_LAUNCH_CHECK();
    });
  }
  if (!tiled) {
    const size_t bytes = 2 * sizeof(A) * size_t(g.T) + kRowSmemSlack;
    check_row_smem(bytes, g.T, "attention_backward");
    auto kernel = attention_bwd_rows<In, Q, Y, C, A, Masked>;
    if (bytes > 48 * 1024) allow_smem(kernel, bytes);
    launch_kernel(kernel, dim3(g.T, g.B * g.H, 2), kRowThreads, bytes, stream, wide_dy(), px, py,
                  static_cast<const A*>(lse.data_ptr()), pd, p16, g.T, g.H, g.d, g.hd, A(1) / std::sqrt(A(g.hd)),
                  Causal, device_mask<A>(mask, "attention_backward"));
    REEL_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace

void attention_bwd_into(const Tensor& dy_in, const Tensor& qkv_in, const Tensor& y_in, const Tensor& lse_in,
                        int64_t heads, DType compute, const Tensor& dqkv, const Tensor& dqkv16, bool causal,
                        const Tensor& mask) {
  Tensor dy = contiguous_on_device(dy_in), qkv = contiguous_on_device(qkv_in);
  Tensor y = contiguous_on_device(y_in), lse = contiguous_on_device(lse_in);
  const AttentionGeometry g(qkv, Attrs().set("heads", heads));
  if (int64_t(g.B) * g.T * g.H == 0) return;
  cudaStream_t stream = stream_of(qkv);
  REEL_CHECK(dqkv.defined() || dqkv16.defined(), "attention_backward: neither dqkv nor its 16-bit copy is asked for");
  // The dtype the values are in: dqkv's, or without it the widest operand's (when all are 16-bit, the
  // kernels for 16-bit values give the bits the f32 images of the operands would).
  auto width = [](DType t) { return t == DType::f64 ? 2 : t == DType::f32 ? 1 : 0; };
  DType value = dqkv.defined() ? dqkv.dtype() : dy.dtype();
  if (!dqkv.defined())
    for (const Tensor* t : {&qkv, &y})
      if (width(t->dtype()) > width(value)) value = t->dtype();
  auto readable = [&] {
    visit_float(value, "attention_backward", [&]<typename In>() {
      visit_compute<In>(compute, [&]<typename C>() {
        visit_operand<In, C>(qkv, value, compute, "attention_backward", "qkv", [&]<typename Q>() {
          visit_operand<In, C>(y, value, compute, "attention_backward", "y", [&]<typename Y>() {
            visit_operand<In, C>(dy, value, compute, "attention_backward", "dy", [&]<typename Dy>() {
              visit_variant(causal, mask.defined(), [&]<bool Causal, bool Masked>() {
                launch_attention_bwd<In, C, Q, Y, Dy, Causal, Masked>(dy, qkv, y, lse, value, g, dqkv, dqkv16,
                                                                       compute, mask, stream);
              });
            });
          });
        });
      });
    });
  };
  if (mask.defined()) return readable();
  run_chosen(
      Direction::Backward, g, compute, causal, qkv.dtype(), qkv.device(),
      [&] { return cudnn_attention_bwd(dy, qkv, y, lse, heads, compute, dqkv, dqkv16, causal); }, readable);
}

namespace {

// The op's inputs: qkv [, mask] (forward), dy, qkv, y, lse [, mask] (backward); attrs heads, compute,
// causal (kernels/schema/attention.cpp).
struct Call {
  int64_t heads;
  DType compute;
  bool causal;
  Tensor mask;
  Call(const KernelCall& c, size_t required)
      : heads(c.attrs.i("heads")), compute(static_cast<DType>(c.attrs.i("compute"))), causal(c.attrs.b("causal", true)),
        mask(c.in.size() > required ? c.in[required] : Tensor()) {}
};

void attention_fwd(const KernelCall& c) {
  const Call a(c, 1);
  attention_fwd_into(c.in[0], a.heads, a.compute, c.out[0], c.out[1], Tensor(), a.causal, a.mask);
}

void attention_bwd(const KernelCall& c) {
  const Call a(c, 4);
  attention_bwd_into(c.in[0], c.in[1], c.in[2], c.in[3], a.heads, a.compute, c.out[0], Tensor(), a.causal, a.mask);
}

// The fused variants (schemas in kernels/schema/attention.cpp): the f32 result when kept, and its copy
// in the compute dtype, by the same kernel.
void attention_cast(const KernelCall& c) {
  const bool keep = c.attrs.b("keep_f32", true);
  const Call a(c, 1);
  attention_fwd_into(c.in[0], a.heads, a.compute, keep ? c.out[0] : Tensor(), c.out[keep ? 1 : 0], c.out.back(),
                     a.causal, a.mask);
}

void attention_backward_cast(const KernelCall& c) {
  const bool keep = c.attrs.b("keep_f32", true);
  const Call a(c, 4);
  attention_bwd_into(c.in[0], c.in[1], c.in[2], c.in[3], a.heads, a.compute, keep ? c.out[0] : Tensor(), c.out.back(),
                     a.causal, a.mask);
}

}  // namespace
}  // namespace cuda

void register_attention_cuda_kernels() {
  using cuda::norm_detail::run_into_contiguous;
  constexpr DeviceType gpu = DeviceType::CUDA;
  register_kernel(gpu, OpKind::Attention, [](const KernelCall& c) { run_into_contiguous(c, cuda::attention_fwd); });
  register_kernel(gpu, OpKind::AttentionBackward,
                  [](const KernelCall& c) { run_into_contiguous(c, cuda::attention_bwd); });
  register_kernel(gpu, OpKind::AttentionCast, cuda::attention_cast);
  register_kernel(gpu, OpKind::AttentionBackwardCast, cuda::attention_backward_cast);
}

}  // namespace reel
