// GEMM epilogue fusion: a Linear layer's
//
//   y = matmul(x, W^T)            x (..., K), W^T (K, N)          (16-bit under autocast)
//  [y = copy(y) to f32]           autocast's cast of the result back to f32
//   z = add(y, bias)              bias (N)
//
// traced as two or three consecutive kernels, becomes one gemm_epilogue node (on CUDA a cuBLASLt GEMM
// with the BIAS epilogue): the bias is added to the f32 accumulator and the result written once, in
// f32 when the cast was there. Applies when the intermediates are Internal buffers read by nothing
// else and the device takes the call (on CUDA: x's batch folds into the GEMM's rows and cuBLASLt has
// an algorithm). In f32 on the CPU the fused kernel is matmul then the add: eager's bits.
// Results differ from the unfused kernels only by the GEMM's summation order (and, in 16-bit, by
// skipping the rounding of y before the bias: the fused result is the more accurate one).
#include <optional>
#include <utility>

#include "compile/passes/passes.h"

namespace reel::compile {

namespace {

constexpr const char* kPass = "gemm_epilogue";

bool is_matmul(const Node& n) {
  return n.op == OpKind::Matmul && !n.in_place && n.inputs.size() == 2 && n.inputs[0] && n.inputs[1];
}

// The fused node for nodes [i, i + span) (node i a matmul) when they match the pattern, and span;
// else nullopt with the reason in `why`.
std::optional<std::pair<Node, size_t>> match(const Graph& g, size_t i, const std::vector<int>& readers,
                                             const std::vector<bool>& is_output, Why& why) {
  const Node& mm = g.nodes[i];
  const TensorRef& x = *mm.inputs[0];
  const TensorRef& wt = *mm.inputs[1];
  auto private_internal = [&](const TensorRef& r) {
    return g.buffers[r.buffer].kind == BufferKind::Internal && readers[r.buffer] == 1 && !is_output[r.buffer];
  };
  if (!why(wt.shape.size() == 2, "the weight is batched") ||
      !why(private_internal(mm.outputs[0]), "the product has readers besides the next node"))
    return std::nullopt;
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
  if (!why(j < g.nodes.size(), "nothing follows it")) return std::nullopt;
  const Node& add = g.nodes[j];
  if (!why(add.op == OpKind::Add && !add.in_place && add.inputs.size() == 2 && add.inputs[0] && add.inputs[1] &&
               same_ref(*add.inputs[0], y),
           "the next node is not an add of the product"))
    return std::nullopt;
  const TensorRef& bias = *add.inputs[1];
  const TensorRef& z = add.outputs[0];
  if (!why(bias.shape.size() == 1 && bias.shape[0] == wt.shape[1] && is_contiguous(bias), "the addend is not a bias (N)") ||
      !why(z.shape == y.shape && is_contiguous(z) && z.dtype == y.dtype, "the sum is not contiguous in the product's dtype"))
    return std::nullopt;
  for (const TensorRef* r : {&x, &wt, &bias, &z})
    if (!why(g.buffers[r->buffer].storage != nullptr, "an operand has no traced memory")) return std::nullopt;
  fused.push_back("add");
  Node n{OpKind::GemmEpilogue, Attrs().set("dtype", z.dtype), {x, wt, bias}, {z}, false, fused};
  if (!why(device_supports(g, z, OpKind::GemmEpilogue), "the device has no gemm_epilogue") ||
      !why(call_supported(g, n), "the device's kernel does not take the call (no cuBLASLt algorithm, say)"))
    return std::nullopt;
  return std::make_pair(std::move(n), j - i + 1);
}

}  // namespace

void fuse_gemm_epilogue(Graph& g, PassStats& stats) {
  std::vector<int> readers(g.buffers.size(), 0);
  for (const Node& n : g.nodes)
    for (const auto& r : n.inputs)
      if (r) readers[r->buffer] += 1;
  std::vector<bool> is_output(g.buffers.size(), false);
  for (const TensorRef& r : g.outputs) is_output[r.buffer] = true;
  std::vector<Node> out;
  for (size_t i = 0; i < g.nodes.size();) {
    Why why;
    std::optional<std::pair<Node, size_t>> fused =
        is_matmul(g.nodes[i]) ? match(g, i, readers, is_output, why) : std::nullopt;
    if (!fused) {
      if (is_matmul(g.nodes[i])) why_not(kPass, g, i, "a bias add", why.reason());
      out.push_back(std::move(g.nodes[i++]));
      continue;
    }
    const size_t span = fused->second;
    stats.fused += span - 1;
    i += span;
    out.push_back(std::move(fused->first));
  }
  g.nodes = std::move(out);
}

}  // namespace reel::compile
