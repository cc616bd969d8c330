// GEMM epilogue fusion (see fuse_gemm_epilogue.h).
#include "compile/fuse_gemm_epilogue.h"

#include <optional>

#include "kernels/schema/views.h"
#ifdef REEL_CUDA
#include "kernels/cuda/gemm_epilogue.h"
#endif

namespace reel::compile {

#ifdef REEL_CUDA
namespace {

// A ref with its leading dims folded into rows: (..., C) -> (rows, C), when the strides allow.
std::optional<TensorRef> as_matrix(const TensorRef& r) {
  if (r.shape.size() < 2) return std::nullopt;
  const int64_t cols = r.shape.back(), rows = numel_of(r.shape) / std::max<int64_t>(cols, 1);
  std::optional<Shape> strides = view_strides(r.shape, r.strides, {rows, cols});
  if (!strides) return std::nullopt;
  return TensorRef{r.buffer, {rows, cols}, *strides, r.offset, r.dtype};
}

class GemmBiasKernel : public FusedKernel {
 public:
  GemmBiasKernel(TensorRef a, TensorRef y) : a_(std::move(a)), y_(std::move(y)) {}
  // in: x (traced geometry), W^T (K, N), bias (N); out: z (traced geometry, contiguous).
  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override {
    Tensor a = Tensor::make_view(in[0], a_.shape, a_.strides, in[0].offset());
    Tensor y = Tensor::make_view(out[0], y_.shape, y_.strides, out[0].offset());
    cuda::gemm_bias(a, in[1], in[2], y);
  }
  std::string name() const override { return "gemm_bias (cuBLASLt epilogue)"; }

 private:
  TensorRef a_, y_;  // the 2-D geometry of x and z (offsets come from the bound tensors)
};

Tensor traced(const Graph& g, const TensorRef& r) { return view_of(g.buffers[r.buffer].storage, 0, r); }

// The fused node for nodes [i, i + span) when they match the pattern, else nullopt.
std::optional<Node> match(const Graph& g, size_t i, const std::vector<int>& readers, const std::vector<bool>& is_output) {
  const Node& mm = g.nodes[i];
  if (mm.op != OpKind::Matmul || mm.kernel || mm.in_place || mm.inputs.size() != 2 || !mm.inputs[0] || !mm.inputs[1])
    return std::nullopt;
  const TensorRef& x = *mm.inputs[0];
  const TensorRef& wt = *mm.inputs[1];
  auto private_internal = [&](const TensorRef& r) {
    return g.buffers[r.buffer].kind == BufferKind::Internal && readers[r.buffer] == 1 && !is_output[r.buffer];
  };
  if (wt.shape.size() != 2 || !private_internal(mm.outputs[0])) return std::nullopt;
  size_t j = i + 1;
  TensorRef y = mm.outputs[0];
  std::vector<std::string> fused{"matmul"};
  if (j < g.nodes.size() && g.nodes[j].op == OpKind::Copy && !g.nodes[j].in_place && g.nodes[j].inputs[0] &&
      same_ref(*g.nodes[j].inputs[0], y) && g.nodes[j].outputs[0].dtype == DType::f32 &&
      g.nodes[j].outputs[0].shape == y.shape && is_contiguous(g.nodes[j].outputs[0]) &&
      private_internal(g.nodes[j].outputs[0])) {
    y = g.nodes[j].outputs[0];
    fused.push_back("copy");
    ++j;
  }
  if (j >= g.nodes.size()) return std::nullopt;
  const Node& add = g.nodes[j];
  if (add.op != OpKind::Add || add.kernel || add.in_place || add.inputs.size() != 2 || !add.inputs[0] ||
      !add.inputs[1] || !same_ref(*add.inputs[0], y))
    return std::nullopt;
  const TensorRef& bias = *add.inputs[1];
  const TensorRef& z = add.outputs[0];
  if (bias.shape.size() != 1 || bias.shape[0] != wt.shape[1] || !is_contiguous(bias) || z.shape != y.shape ||
      !is_contiguous(z) || z.dtype != y.dtype)
    return std::nullopt;
  for (const TensorRef* r : {&x, &wt, &bias, &z})
    if (!g.buffers[r->buffer].device.is_cuda() || !g.buffers[r->buffer].storage) return std::nullopt;
  std::optional<TensorRef> a2 = as_matrix(x), z2 = as_matrix(z);
  if (!a2 || !z2) return std::nullopt;
  if (!cuda::gemm_bias_supported(traced(g, *a2), traced(g, wt), traced(g, bias), traced(g, *z2))) return std::nullopt;
  fused.push_back("add");
  Node n{OpKind::Add, Attrs(), {x, wt, bias}, {z}, false, fused, nullptr};
  n.kernel = std::make_shared<GemmBiasKernel>(*a2, *z2);
  n.attrs.set("span", int64_t(j - i + 1));
  return n;
}

}  // namespace
#endif

void fuse_gemm_epilogue(Graph& g, PassStats& stats) {
#ifdef REEL_CUDA
  std::vector<int> readers(g.buffers.size(), 0);
  for (const Node& n : g.nodes)
    for (const auto& r : n.inputs)
      if (r) readers[r->buffer] += 1;
  std::vector<bool> is_output(g.buffers.size(), false);
  for (const TensorRef& r : g.outputs) is_output[r.buffer] = true;
  std::vector<Node> out;
  for (size_t i = 0; i < g.nodes.size();) {
    std::optional<Node> fused = match(g, i, readers, is_output);
    if (!fused) {
      out.push_back(std::move(g.nodes[i++]));
      continue;
    }
    const size_t span = size_t(fused->attrs.i("span"));
    stats.fused += span - 1;
    i += span;
    out.push_back(std::move(*fused));
  }
  g.nodes = std::move(out);
#else
  (void)g;
  (void)stats;
#endif
}

}  // namespace reel::compile
