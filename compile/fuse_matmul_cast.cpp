// Fusion of autocast's cast into the preceding GEMM (see fuse_matmul_cast.h).
#include "compile/fuse_matmul_cast.h"

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

void fuse_matmul_accumulate(Graph& g, PassStats& stats) {
#ifdef REEL_CUDA
  const size_t nb = g.buffers.size();
  std::vector<int> readers(nb, 0), writers(nb, 0), producer(nb, -1);
  std::vector<std::vector<int>> touches(nb);  // node indices touching each buffer, ascending
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (const auto& r : g.nodes[i].inputs)
      if (r) {
        readers[r->buffer] += 1;
        touches[r->buffer].push_back(int(i));
      }
    for (const TensorRef& r : g.nodes[i].outputs) {
      writers[r.buffer] += 1;
      producer[r.buffer] = int(i);
      touches[r.buffer].push_back(int(i));
    }
  }
  for (const TensorRef& r : g.outputs) readers[r.buffer] += 1;
  // Whether any node strictly between i and j touches buffer b.
  auto touched_between = [&](int b, int i, int j) {
    for (int k : touches[b])
      if (k > i && k < j) return true;
    return false;
  };
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t j = 0; j < g.nodes.size(); ++j) {
    const Node& c = g.nodes[j];
    const bool copy = c.op == OpKind::Copy && !c.in_place && c.inputs.size() == 1;
    const bool add = c.op == OpKind::Add && c.in_place && c.inputs.size() == 2 && c.inputs[0] &&
                     same_ref(*c.inputs[0], c.outputs[0]);
    if (c.kernel || !(copy || add) || !c.inputs.back()) continue;
    const TensorRef& r = *c.inputs.back();
    const TensorRef& z = c.outputs[0];
    const int i = producer[r.buffer];
    if (i < 0 || drop[size_t(i)]) continue;
    Node& m = g.nodes[size_t(i)];
    const bool plain = !m.kernel || m.fused == std::vector<std::string>{"matmul", "copy"};
    if (m.op != OpKind::Matmul || m.in_place || !plain || m.inputs.size() != 2 || !m.inputs[0] || !m.inputs[1] ||
        m.inputs[0]->shape.size() != 2 || m.inputs[1]->shape.size() != 2)
      continue;
    const TensorRef& y = m.outputs[0];
    const int how = reading(r, y);
    const Buffer& yb = g.buffers[y.buffer];
    if (how < 0 || yb.kind != BufferKind::Internal || readers[y.buffer] != 1 || writers[y.buffer] != 1 ||
        z.dtype != y.dtype || z.shape.size() != 2 || z.strides != contiguous_strides(z.shape) ||
        g.buffers[z.buffer].device != yb.device || !yb.device.is_cuda() || touched_between(z.buffer, i, int(j)))
      continue;
    if (copy && !(touches[z.buffer].front() == int(j))) continue;  // the copy must create the gradient
    std::vector<std::optional<TensorRef>> in{m.inputs[0], m.inputs[1]};
    if (add) in.push_back(z);
    m.inputs = in;
    m.outputs = {z};
    m.in_place = add;
    m.kernel = std::make_shared<MatmulIntoGradKernel>(how == 1, add);
    m.fused.push_back(add ? "add" : "copy");
    if (m.fused.front() != "matmul") m.fused.insert(m.fused.begin(), "matmul");
    drop[j] = true;
    ++stats.fused;
  }
  std::vector<Node> kept;
  for (size_t k = 0; k < g.nodes.size(); ++k)
    if (!drop[k]) kept.push_back(std::move(g.nodes[k]));
  g.nodes = std::move(kept);
#else
  (void)g;
  (void)stats;
#endif
}

void fuse_matmul_cast(Graph& g, PassStats& stats) {
#ifdef REEL_CUDA
  std::vector<int> readers(g.buffers.size(), 0), writers(g.buffers.size(), 0);
  std::vector<int> producer(g.buffers.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (const auto& r : g.nodes[i].inputs)
      if (r) readers[r->buffer] += 1;
    for (const TensorRef& r : g.nodes[i].outputs) {
      writers[r.buffer] += 1;
      producer[r.buffer] = int(i);
    }
  }
  for (const TensorRef& r : g.outputs) readers[r.buffer] += 1;  // an output counts as a reader
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t j = 0; j < g.nodes.size(); ++j) {
    const Node& c = g.nodes[j];
    if (c.op != OpKind::Copy || c.in_place || c.kernel || c.inputs.size() != 1 || !c.inputs[0]) continue;
    const TensorRef& y = *c.inputs[0];
    const TensorRef& z = c.outputs[0];
    const int i = producer[y.buffer];
    if (i < 0 || drop[size_t(i)]) continue;
    Node& m = g.nodes[size_t(i)];
    const bool sixteen = y.dtype == DType::bf16 || y.dtype == DType::f16;
    if (m.op != OpKind::Matmul || m.kernel || m.in_place || !same_ref(m.outputs[0], y) || !sixteen ||
        z.dtype != DType::f32 || z.shape != y.shape || z.strides != contiguous_strides(z.shape) || z.offset != 0)
      continue;
    const Buffer& yb = g.buffers[y.buffer];
    const Buffer& zb = g.buffers[z.buffer];
    if (yb.kind != BufferKind::Internal || readers[y.buffer] != 1 || writers[y.buffer] != 1 ||
        zb.kind != BufferKind::Internal || writers[z.buffer] != 1 || !yb.device.is_cuda() || zb.device != yb.device)
      continue;
    m.outputs[0] = z;
    m.kernel = std::make_shared<MatmulIntoKernel>();
    m.fused = {"matmul", "copy"};
    drop[j] = true;
    ++stats.fused;
  }
  std::vector<Node> kept;
  for (size_t k = 0; k < g.nodes.size(); ++k)
    if (!drop[k]) kept.push_back(std::move(g.nodes[k]));
  g.nodes = std::move(kept);
#else
  (void)g;
  (void)stats;
#endif
}

}  // namespace reel::compile
