// cuDNN's fused attention for the CUDA attention op (the contract is in attention_cudnn.h).
//
// One cuDNN graph per (direction, B, T, H, head size, compute dtype, causal, deterministic, cuDNN
// handle), built on the shape's first call and kept for the process:
//   forward   Q, K, V (B, H, T, hd) strided into qkv (B, T, 3d): strides (3dT, hd, 3d, 1), K and V
//             at offsets d and 2d -> O (B, H, T, hd) strided into (B, T, d): (dT, hd, d, 1);
//             Stats (B, H, T, 1) f32, contiguous: the op's lse.
//   backward  Q, K, V, O, dO (O's layout), Stats -> dQ, dK, dV strided into (B, T, 3d) as Q, K, V.
// Scale 1/sqrt(hd) in f32, as the readable kernels use it; causal is cuDNN's top-left diagonal band
// (key s <= query t). The backward asks for cuDNN's deterministic algorithm whenever
// deterministic_algorithms() is on (the default): no float atomics, the same bits on every run.
#include <cstring>  // before the frontend, whose shim calls std::strlen without including it

#include <atomic>
#include <cmath>
#include <compare>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "kernels/autotune.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_copy.h"
#include "tensor/log.h"

#ifdef REEL_CUDNN_FRONTEND
// The frontend's JSON serialisation of graphs is not used; leaving it out also keeps its bundled
// nlohmann::json away from the Debian copy other files include.
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>
#endif

namespace reel::cuda {
namespace {

std::atomic<int64_t> launches{0};
std::mutex refusal_mutex;
#ifdef REEL_CUDNN_FRONTEND
std::string last_refusal;
#else
std::string last_refusal = "this build has no cuDNN frontend (tools/fetch_cudnn_frontend.sh could not fetch it)";
#endif

}  // namespace

int64_t cudnn_attention_calls() { return launches.load(); }
std::string cudnn_attention_last_refusal() {
  std::lock_guard<std::mutex> lock(refusal_mutex);
  return last_refusal;
}

#ifndef REEL_CUDNN_FRONTEND

bool cudnn_attention_fwd(const Tensor&, int64_t, DType, const Tensor&, const Tensor&, const Tensor&, bool) {
  return false;
}
bool cudnn_attention_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, DType, const Tensor&,
                         const Tensor&, bool) {
  return false;
}

#else

namespace {

namespace fe = cudnn_frontend;

void refuse(std::string why) {
  std::lock_guard<std::mutex> lock(refusal_mutex);
  last_refusal = std::move(why);
}

// The call's shape, and whether its dtypes and layouts are ones cuDNN's graph takes.
struct Shape4 {
  int64_t B, T, H, hd, d;
};
Shape4 shape_of(const Tensor& qkv, int64_t heads) {
  const int64_t d = qkv.size(2) / 3;
  return {qkv.size(0), qkv.size(1), heads, d / heads, d};
}
bool sixteen_bit(DType t) { return t == DType::bf16 || t == DType::f16; }
bool takes(const Shape4& s, DType compute) {
  return sixteen_bit(compute) && s.hd % 8 == 0 && s.hd <= 128 && s.B * s.T * s.H > 0;
}
// An output cuDNN (or the widening after it) may write: contiguous, of `shape`, 16-byte aligned.
bool writable(const Tensor& t, const reel::Shape& shape) {
  return t.defined() && t.device().is_cuda() && t.is_contiguous() && t.shape() == shape && aligned16(t.data_ptr());
}

// `t` in the compute dtype, 16-byte aligned and contiguous: t itself when it is, else a rounded copy
// kept alive in `keep` until the launch has run (stream order).
const void* compute_operand(const Tensor& t, DType compute, Tensor& keep) {
  if (t.dtype() == compute && t.is_contiguous() && aligned16(t.data_ptr())) return t.data_ptr();
  keep = Tensor::empty(t.shape(), compute, t.device());
  copy_on_device(keep, t);
  return keep.data_ptr();
}

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };
enum class Direction { Forward, Backward };

struct GraphKey {
  Direction direction;
  int64_t B, T, H, hd;
  DType compute;
  bool causal, deterministic;
  cudnnHandle_t handle;  // plans are built for one handle (this thread's, on this device)
  auto operator<=>(const GraphKey&) const = default;
};

// A built graph and its workspace, or (graph null) why cuDNN refused the shape.
struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
  std::string refusal;
};

std::unique_ptr<Built> build(const GraphKey& k) {
  auto out = std::make_unique<Built>();
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(k.compute == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t d = k.H * k.hd;
  const std::vector<int64_t> dims{k.B, k.H, k.T, k.hd};
  const std::vector<int64_t> packed{3 * d * k.T, k.hd, 3 * d, 1};  // a head's q, k or v inside qkv / dqkv
  const std::vector<int64_t> merged{d * k.T, k.hd, d, 1};          // a head's columns of y / dy
  const std::vector<int64_t> stats_dims{k.B, k.H, k.T, 1}, stats_strides{k.H * k.T, k.T, 1, 1};
  auto operand = [&](const char* name, Uid uid, const std::vector<int64_t>& strides) {
    return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(strides));
  };
  auto q = operand("Q", kQ, packed), kk = operand("K", kK, packed), v = operand("V", kV, packed);
  const float scale = 1.0f / std::sqrt(float(k.hd));
  if (k.direction == Direction::Forward) {
    auto attrs = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_attn_scale(scale);
    if (k.causal) attrs.set_causal_mask(true);
    auto [o, stats] = g->sdpa(q, kk, v, attrs);
    o->set_output(true).set_dim(dims).set_stride(merged).set_uid(kO);
    stats->set_output(true).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dims).set_stride(stats_strides).set_uid(
        kStats);
  } else {
    auto o = operand("O", kO, merged), d_o = operand("dO", kDO, merged);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("Stats")
                               .set_uid(kStats)
                               .set_dim(stats_dims)
                               .set_stride(stats_strides)
                               .set_data_type(fe::DataType_t::FLOAT));
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("attention_backward")
                     .set_attn_scale(scale)
                     .set_deterministic_algorithm(k.deterministic);
    if (k.causal) attrs.set_causal_mask(true);
    auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, d_o, stats, attrs);
    dq->set_output(true).set_dim(dims).set_stride(packed).set_uid(kDQ);
    dk->set_output(true).set_dim(dims).set_stride(packed).set_uid(kDK);
    dv->set_output(true).set_dim(dims).set_stride(packed).set_uid(kDV);
  }
  // Building may load kernels and allocate: allowed even while this thread captures a CUDA graph
  // (the compiled step's first replay may be the shape's first use); nothing is enqueued.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  REEL_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  int64_t bytes = 0;
  auto try_build = [&]() -> fe::error_t {
    try {
      if (auto built = g->build(k.handle, {fe::HeurMode_t::A}); built.is_bad()) return built;
      return g->get_workspace_size(bytes);
    } catch (const std::exception& e) {
      return {fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED, e.what()};
    }
  };
  fe::error_t status = try_build();
  REEL_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  if (status.is_bad()) {
    out->refusal = detail::cat(k.direction == Direction::Forward ? "attention" : "attention_backward",
                               ": cuDNN builds no plan for B ", k.B, " T ", k.T, " H ", k.H, " head size ", k.hd, " ",
                               dtype_name(k.compute), k.causal ? " causal" : "", ": ", status.get_message());
    return out;
  }
  out->graph = std::move(g);
  out->workspace_bytes = bytes;
  return out;
}

// The cached graph for `k`, built on first use (a refused shape is remembered as refused).
const Built& graph_for(const GraphKey& k) {
  static std::mutex mutex;
  static std::map<GraphKey, std::unique_ptr<Built>> graphs;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Built>& slot = graphs[k];
  if (!slot) {
    slot = build(k);
    if (!slot->graph) refuse(slot->refusal);
    if (log_enabled("kernels"))
      log_line("kernels", slot->graph ? detail::cat(k.direction == Direction::Forward ? "attention" : "attention_backward",
                                                    ": cuDNN plan built for B ", k.B, " T ", k.T, " H ", k.H,
                                                    " head size ", k.hd, " ", dtype_name(k.compute),
                                                    k.causal ? " causal" : "", ", workspace ",
                                                    slot->workspace_bytes, " bytes")
                                        : slot->refusal + "; reel's kernels run it");
  }
  return *slot;
}

// Runs the built graph on the current stream with `pack` bound, in a workspace of its size.
void execute(const Built& b, cudnnHandle_t h, std::unordered_map<int64_t, void*>& pack, Device device,
             const char* op) {
  Tensor ws = b.workspace_bytes > 0 ? workspace(size_t(b.workspace_bytes), device) : Tensor();
  fe::error_t status = b.graph->execute(h, pack, ws.defined() ? ws.data_ptr() : nullptr);
  REEL_CHECK(status.is_good(), op, ": cuDNN's fused attention failed to run: ", status.get_message());
  launches.fetch_add(1);
}

// The element `offset` columns into a 16-bit buffer.
void* columns(const void* base, int64_t offset) {
  return const_cast<char*>(static_cast<const char*>(base)) + offset * 2;
}

}  // namespace

bool cudnn_attention_fwd(const Tensor& qkv, int64_t heads, DType compute, const Tensor& y, const Tensor& lse,
                         const Tensor& y16, bool causal) {
  const Shape4 s = shape_of(qkv, heads);
  if (!takes(s, compute) || !(qkv.dtype() == compute || qkv.dtype() == DType::f32)) return false;
  const reel::Shape out_shape{s.B, s.T, s.d};
  if (y.defined() && !(writable(y, out_shape) && (y.dtype() == DType::f32 || y.dtype() == compute))) return false;
  if (y16.defined() && !(writable(y16, out_shape) && y16.dtype() == compute)) return false;
  if (!writable(lse, {s.B, s.H, s.T}) || lse.dtype() != DType::f32) return false;
  const Device device = qkv.device();
  cudnnHandle_t h = cudnn_handle(device);
  const Built& b = graph_for({Direction::Forward, s.B, s.T, s.H, s.hd, compute, causal, false, h});
  if (!b.graph) return false;

  Tensor qkv_keep;
  const void* q = compute_operand(qkv, compute, qkv_keep);
  // O goes to the 16-bit copy when asked for, else to y when y is 16-bit, else to scratch.
  Tensor o = y16.defined() ? y16 : y.dtype() == compute ? y : Tensor::empty(out_shape, compute, device);
  std::unordered_map<int64_t, void*> pack{{kQ, columns(q, 0)},         {kK, columns(q, s.d)},
                                          {kV, columns(q, 2 * s.d)},   {kO, o.data_ptr()},
                                          {kStats, lse.data_ptr()}};
  execute(b, h, pack, device, "attention");
  if (y.defined() && y.data_ptr() != o.data_ptr()) copy_on_device(y, o);  // widened (exact), or a second copy
  return true;
}

bool cudnn_attention_bwd(const Tensor& dy, const Tensor& qkv, const Tensor& y, const Tensor& lse, int64_t heads,
                         DType compute, const Tensor& dqkv, const Tensor& dqkv16, bool causal) {
  const Shape4 s = shape_of(qkv, heads);
  if (!takes(s, compute)) return false;
  for (const Tensor* t : {&dy, &qkv, &y})
    if (!(t->dtype() == compute || t->dtype() == DType::f32) || !t->device().is_cuda()) return false;
  const reel::Shape grad_shape{s.B, s.T, 3 * s.d};
  if (dqkv.defined() && !(writable(dqkv, grad_shape) && (dqkv.dtype() == DType::f32 || dqkv.dtype() == compute)))
    return false;
  if (dqkv16.defined() && !(writable(dqkv16, grad_shape) && dqkv16.dtype() == compute)) return false;
  if (lse.dtype() != DType::f32 || lse.shape() != reel::Shape{s.B, s.H, s.T} || !lse.is_contiguous()) return false;
  const Device device = qkv.device();
  cudnnHandle_t h = cudnn_handle(device);
  const Built& b = graph_for({Direction::Backward, s.B, s.T, s.H, s.hd, compute, causal, deterministic_algorithms(), h});
  if (!b.graph) return false;

  Tensor keep_qkv, keep_y, keep_dy;
  const void* q = compute_operand(qkv, compute, keep_qkv);
  const void* o = compute_operand(y, compute, keep_y);
  const void* d_o = compute_operand(dy, compute, keep_dy);
  Tensor grad = dqkv16.defined() ? dqkv16 : dqkv.dtype() == compute ? dqkv : Tensor::empty(grad_shape, compute, device);
  std::unordered_map<int64_t, void*> pack{{kQ, columns(q, 0)},
                                          {kK, columns(q, s.d)},
                                          {kV, columns(q, 2 * s.d)},
                                          {kO, const_cast<void*>(o)},
                                          {kDO, const_cast<void*>(d_o)},
                                          {kStats, lse.data_ptr()},
                                          {kDQ, columns(grad.data_ptr(), 0)},
                                          {kDK, columns(grad.data_ptr(), s.d)},
                                          {kDV, columns(grad.data_ptr(), 2 * s.d)}};
  execute(b, h, pack, device, "attention_backward");
  if (dqkv.defined() && dqkv.data_ptr() != grad.data_ptr()) copy_on_device(dqkv, grad);  // widened (exact), or a copy
  return true;
}

#endif  // REEL_CUDNN_FRONTEND

}  // namespace reel::cuda
