// Fusion of autocast's cast into the preceding GEMM (see fuse_matmul_cast.h).
#include "compile/fuse_matmul_cast.h"

#include "compile/fused_expr.h"

#ifdef REEL_CUDA
#include "kernels/cuda/matmul_into.h"
#endif

namespace reel::compile {

#ifdef REEL_CUDA
namespace {

class MatmulIntoKernel : public FusedKernel {
 public:
  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override {
    cuda::matmul_into(in[0], in[1], out[0]);
  }
  std::string name() const override { return "matmul with an f32 result"; }
};

// z (=|+=) a @ b, or with `transposed` z (=|+=) (a @ b)^T computed as b^T @ a^T. 2-D operands.
class MatmulIntoGradKernel : public FusedKernel {
 public:
  MatmulIntoGradKernel(bool transposed, bool accumulate) : transposed_(transposed), accumulate_(accumulate) {}
  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override {
    if (!transposed_) return cuda::matmul_into(in[0], in[1], out[0], accumulate_);
    cuda::matmul_into(t(in[1]), t(in[0]), out[0], accumulate_);
  }
  std::string name() const override { return accumulate_ ? "matmul accumulated into a gradient" : "matmul into a gradient"; }

 private:
  static Tensor t(const Tensor& m) {
    return Tensor::make_view(m, {m.shape()[1], m.shape()[0]}, {m.strides()[1], m.strides()[0]}, m.offset());
  }
  bool transposed_, accumulate_;
};

// Whether `r` reads all of `y` as stored (0) or transposed (1); -1 otherwise. Both 2-D.
int reading(const TensorRef& r, const TensorRef& y) {
  if (r.buffer != y.buffer || r.offset != y.offset || r.dtype != y.dtype || r.shape.size() != 2 || y.shape.size() != 2)
    return -1;
  if (r.shape == y.shape && r.strides == y.strides) return 0;
  if (r.shape == Shape{y.shape[1], y.shape[0]} && r.strides == Shape{y.strides[1], y.strides[0]}) return 1;
  return -1;
}

}  // namespace
#endif

#ifdef REEL_CUDA
namespace {

// Node j puts a GEMM's result into a gradient (a copy creating it, or an in-place add): the GEMM's
// index, how it reads the result (0 as stored, 1 transposed) and whether j adds; or nullopt.
struct GradWrite {
  int gemm, how;
  bool add;
};

std::optional<GradWrite> grad_write(const Graph& g, const BufferUses& u, size_t j, const std::vector<bool>& drop) {
  const Node& c = g.nodes[j];
  const std::optional<GradientWrite> write = gradient_write(c);
  if (!write) return std::nullopt;
  const TensorRef& r = *write->source;
  const TensorRef& z = c.outputs[0];
  const int i = u.producer(r.buffer);
  if (i < 0 || drop[size_t(i)]) return std::nullopt;
  const Node& m = g.nodes[size_t(i)];
  const bool plain = !m.kernel || m.fused == std::vector<std::string>{"matmul", "copy"};
  if (m.op != OpKind::Matmul || m.in_place || !plain || m.inputs.size() != 2 || !m.inputs[0] || !m.inputs[1] ||
      m.inputs[0]->shape.size() != 2 || m.inputs[1]->shape.size() != 2)
    return std::nullopt;
  const TensorRef& y = m.outputs[0];
  const int how = reading(r, y);
  const Buffer& yb = g.buffers[y.buffer];
  if (how < 0 || yb.kind != BufferKind::Internal || u.readers[y.buffer].size() != 1 || u.writers[y.buffer].size() != 1 ||
      z.dtype != y.dtype || z.shape.size() != 2 || z.strides != contiguous_strides(z.shape) ||
      g.buffers[z.buffer].device != yb.device || !yb.device.is_cuda() ||
      !may_write_gradient_early(u, z, i, int(j), write->add))
    return std::nullopt;
  return GradWrite{i, how, write->add};
}

}  // namespace
#endif

void fuse_matmul_accumulate(Graph& g, PassStats& stats) {
#ifdef REEL_CUDA
  const BufferUses u = buffer_uses(g);
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t j = 0; j < g.nodes.size(); ++j) {
    std::optional<GradWrite> w = grad_write(g, u, j, drop);
    if (!w) continue;
    Node& m = g.nodes[size_t(w->gemm)];
    const TensorRef z = g.nodes[j].outputs[0];
    std::vector<std::optional<TensorRef>> in{m.inputs[0], m.inputs[1]};
    if (w->add) in.push_back(z);
    m.inputs = in;
    m.outputs = {z};
    m.in_place = w->add;
    m.kernel = std::make_shared<MatmulIntoGradKernel>(w->how == 1, w->add);
    m.fused.push_back(w->add ? "add" : "copy");
    if (m.fused.front() != "matmul") m.fused.insert(m.fused.begin(), "matmul");
    drop[j] = true;
    ++stats.fused;
  }
  drop_nodes(g, drop);
#else
  (void)g;
  (void)stats;
#endif
}

#ifdef REEL_CUDA
namespace {

// The node that alone reads z, reading it once; null otherwise.
Node* sole_reader(Graph& g, const BufferUses& u, const TensorRef& z) {
  const int k = compile::sole_reader(g, u, z);
  return k < 0 ? nullptr : &g.nodes[size_t(k)];
}

// Whether z's sole reader is an elementwise op: elementwise fusion then folds the cast into that
// op's kernel, which reads the 16-bit y (2 bytes an element, not 4) while the GEMM writes 2 bytes
// instead of 4; and the values are eager's, which rounds to 16 bits and casts back as well. (The
// GPT's case: fc2's input gradient, read by GELU's backward.)
bool read_by_one_elementwise_op(Graph& g, const BufferUses& u, const TensorRef& z) {
  const Node* r = sole_reader(g, u, z);
  return r && is_fusable_op(r->op) && !r->kernel && !r->in_place;
}

// z's sole reader when it is an attention backward reading z as its dy and its compute dtype is
// y's: it takes y itself, with the bits its f32 image z gives (kernels/cuda/attention.h). (The GPT's
// case: the projection's input gradient.)
Node* attention_backward_reading_dy(Graph& g, const BufferUses& u, const TensorRef& z, DType y_dtype) {
  Node* r = sole_reader(g, u, z);
  const bool dy = r && r->op == OpKind::CausalAttentionBackward && !r->kernel && !r->inputs.empty() && r->inputs[0] &&
                  same_ref(*r->inputs[0], z) && r->attrs.i("compute") == int64_t(y_dtype);
  return dy ? r : nullptr;
}

}  // namespace
#endif

void fuse_matmul_cast(Graph& g, PassStats& stats) {
#ifdef REEL_CUDA
  const BufferUses u = buffer_uses(g);
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t j = 0; j < g.nodes.size(); ++j) {
    const Node& c = g.nodes[j];
    if (c.op != OpKind::Copy || c.in_place || c.kernel || c.inputs.size() != 1 || !c.inputs[0]) continue;
    const TensorRef& y = *c.inputs[0];
    const TensorRef& z = c.outputs[0];
    const int i = u.producer(y.buffer);
    if (i < 0 || drop[size_t(i)]) continue;
    Node& m = g.nodes[size_t(i)];
    const bool sixteen = is_16bit(y.dtype);
    if (m.op != OpKind::Matmul || m.kernel || m.in_place || !same_ref(m.outputs[0], y) || !sixteen ||
        z.dtype != DType::f32 || z.shape != y.shape || z.strides != contiguous_strides(z.shape) || z.offset != 0)
      continue;
    const Buffer& yb = g.buffers[y.buffer];
    const Buffer& zb = g.buffers[z.buffer];
    if (yb.kind != BufferKind::Internal || u.readers[y.buffer].size() != 1 || u.writers[y.buffer].size() != 1 ||
        zb.kind != BufferKind::Internal || u.writers[z.buffer].size() != 1 || !yb.device.is_cuda() ||
        zb.device != yb.device)
      continue;
    if (read_by_one_elementwise_op(g, u, z)) continue;  // that op's fused kernel takes the cast instead
    if (Node* r = attention_backward_reading_dy(g, u, z, y.dtype)) {  // it reads the 16-bit y itself
      r->inputs[0] = y;
      drop[j] = true;
      ++stats.fused;
      continue;
    }
    m.outputs[0] = z;
    m.kernel = std::make_shared<MatmulIntoKernel>();
    m.fused = {"matmul", "copy"};
    drop[j] = true;
    ++stats.fused;
  }
  drop_nodes(g, drop);
#else
  (void)g;
  (void)stats;
#endif
}

}  // namespace reel::compile
