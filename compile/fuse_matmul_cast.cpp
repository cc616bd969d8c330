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

bool same_geometry(const TensorRef& a, const TensorRef& b) {
  return a.buffer == b.buffer && a.shape == b.shape && a.strides == b.strides && a.offset == b.offset &&
         a.dtype == b.dtype;
}

}  // namespace
#endif

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
    if (m.op != OpKind::Matmul || m.kernel || m.in_place || !same_geometry(m.outputs[0], y) || !sixteen ||
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
