// GEMM epilogue fusion (see fuse_gemm_epilogue.h).
#include "compile/fuse_gemm_epilogue.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>

#include "compile/fused_expr.h"
#ifdef REEL_CUDA
#include "kernels/cuda/gemm_epilogue.h"
#endif

namespace reel::compile {

#ifdef REEL_CUDA
namespace {

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

// A node fuse_gemm_epilogue made from a 16-bit GEMM, autocast's cast to f32 and the bias add.
bool is_16bit_gemm_bias_to_f32(const Node& n) {
  return n.op == OpKind::Add && n.kernel && dynamic_cast<const GemmBiasKernel*>(n.kernel.get()) &&
         n.inputs.size() == 3 && n.inputs[0] && n.inputs[1] && n.inputs[2] &&
         is_16bit(n.inputs[0]->dtype) && n.outputs.size() == 1 &&
         n.outputs[0].dtype == DType::f32;
}

// How a node reads z's buffer, for store_gemm_bias_16bit.
enum class Reader {
  Other,         // the pass leaves z alone
  AttentionQkv,  // causal_attention (or its backward) taking z as qkv: reads 16 bits as they are
  Elementwise,   // an elementwise op reading z once: reads it through a cast back to f32
};
Reader reader_kind(const Node& r, const TensorRef& z, DType compute) {
  int refs = 0;
  for (const auto& in : r.inputs) refs += in && in->buffer == z.buffer;
  if (refs != 1) return Reader::Other;
  const size_t qkv = r.op == OpKind::CausalAttention ? 0 : r.op == OpKind::CausalAttentionBackward ? 1 : SIZE_MAX;
  if (qkv != SIZE_MAX)
    return qkv < r.inputs.size() && r.inputs[qkv] && same_ref(*r.inputs[qkv], z) &&
                   r.attrs.i("compute") == int64_t(compute)
               ? Reader::AttentionQkv
               : Reader::Other;
  return is_fusable_op(r.op) && !r.kernel && !r.in_place ? Reader::Elementwise : Reader::Other;
}

}  // namespace
#endif

void store_gemm_bias_16bit(Graph& g, PassStats& stats) {
#ifdef REEL_CUDA
  (void)stats;  // no node goes; the casts inserted here are folded by elementwise fusion
  const BufferUses u = buffer_uses(g);
  std::vector<std::vector<Node>> casts_before(g.nodes.size());
  // The cast of `src` into a new Internal buffer of its shape (contiguous) in `dtype`.
  auto cast_node = [&](const TensorRef& src, DType dtype, Device device) {
    Buffer t;
    t.id = int(g.buffers.size());
    t.kind = BufferKind::Internal;
    t.nbytes = size_t(numel_of(src.shape)) * dtype_size(dtype);
    t.device = device;
    TensorRef dst{t.id, src.shape, contiguous_strides(src.shape), 0, dtype};
    g.buffers.push_back(std::move(t));
    return Node{OpKind::Copy, Attrs(), {src}, {dst}, false, {}, nullptr};
  };
  std::map<int, std::pair<TensorRef, int>> bias16_of;  // f32 bias buffer -> its 16-bit cast, made before node
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    if (!is_16bit_gemm_bias_to_f32(n)) continue;
    const TensorRef z = n.outputs[0];
    const DType c = n.inputs[0]->dtype;
    Buffer& zb = g.buffers[z.buffer];
    if (!internal_once(g, u, z) || !is_contiguous(z) || z.offset != 0 || zb.nbytes < z.nbytes() || !zb.storage ||
        u.readers[z.buffer].empty())
      continue;
    bool ok = true;
    for (int k : u.readers[z.buffer])
      ok = ok && k < int(g.nodes.size()) && k > int(i) && reader_kind(g.nodes[size_t(k)], z, c) != Reader::Other;
    if (!ok) continue;
    // cuBLASLt's answer for the 16-bit result (the traced block is large enough for a view of it),
    // with the f32 bias or, where it has no such kernel, the bias cast to 16 bits as PyTorch's
    // autocast does (views of the f32 blocks stand in for the 16-bit tensors in the query).
    TensorRef z16 = z, bias = *n.inputs[2], bias16 = *n.inputs[2];
    z16.dtype = bias16.dtype = c;
    const std::optional<TensorRef> a2 = as_matrix(*n.inputs[0]), y2 = as_matrix(z16);
    if (!a2 || !y2) continue;
    auto supported = [&](const TensorRef& b) {
      return cuda::gemm_bias_supported(traced(g, *a2), traced(g, *n.inputs[1]), traced(g, b), traced(g, *y2));
    };
    const bool f32_bias = supported(bias);
    if (!f32_bias && !(is_contiguous(bias) && supported(bias16))) continue;
    if (!f32_bias) {
      auto it = bias16_of.find(bias.buffer);
      bool reuse = it != bias16_of.end();
      for (int w : u.writers[bias.buffer]) reuse = reuse && !(it->second.second <= w && w < int(i));
      if (!reuse) {
        Node cast = cast_node(bias, c, g.buffers[bias.buffer].device);
        it = bias16_of.insert_or_assign(bias.buffer, std::make_pair(cast.outputs[0], int(i))).first;
        casts_before[i].push_back(std::move(cast));
      }
      n.inputs[2] = it->second.first;
    }
    zb.nbytes = z16.nbytes();
    n.outputs[0] = z16;
    n.kernel = std::make_shared<GemmBiasKernel>(*a2, *y2);
    std::vector<int> readers = u.readers[z.buffer];
    readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
    for (int k : readers) {
      Node& r = g.nodes[size_t(k)];
      const Reader kind = reader_kind(r, z, c);
      for (auto& in : r.inputs) {
        if (!in || in->buffer != z.buffer) continue;
        in->dtype = c;
        if (kind == Reader::AttentionQkv) continue;  // attention reads the 16-bit qkv itself
        // Elementwise: an f32 copy of what r reads, made just before r; r reads the copy.
        Node cast = cast_node(*in, DType::f32, zb.device);
        *in = cast.outputs[0];
        casts_before[size_t(k)].push_back(std::move(cast));
      }
    }
  }
  std::vector<Node> out;
  out.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (Node& c : casts_before[i]) out.push_back(std::move(c));
    out.push_back(std::move(g.nodes[i]));
  }
  g.nodes = std::move(out);
#else
  (void)g;
  (void)stats;
#endif
}

bool is_gemm_bias(const Node& n) {
#ifdef REEL_CUDA
  return n.kernel && dynamic_cast<const GemmBiasKernel*>(n.kernel.get()) != nullptr;
#else
  (void)n;
  return false;
#endif
}

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
