// 16-bit GEMM results: a fused GEMM + bias (gemm_epilogue) of 16-bit operands writing f32 z, where
// every reader of z either rounds it to 16 bits anyway or is elementwise, writes z in the operands'
// dtype instead (the bias added to the f32 accumulator, one rounding), which halves what the step
// keeps of z for the backward. Readers it takes, as a GPT's are:
//   an attention op (forward or backward, with or without its cast) reading z as qkv (the qkv
//     projection): the kernels round qkv to the compute dtype before use, so they read the same bits
//     as before; the node gets attr dtype = f32, its result's, as its schema wants;
//   elementwise ops (the MLP's GELU and its backward reading the fc layer's z): each gets a cast of
//     z back to f32 just before it, which elementwise fusion folds into its kernel. GELU then sees z
//     rounded to 16 bits, as under PyTorch's autocast: within tolerance of eager, not bitwise.
// z must be an Internal buffer written once and read by nothing else, and the device must take the
// 16-bit gemm_epilogue: with the f32 bias where it can (cuBLASLt on the H200 has no such kernel), or
// else with the bias cast to 16 bits, as PyTorch's autocast rounds it (one cast per bias, made before
// its first GEMM and reused until something writes the bias: gemm_16bit_results.h, which
// read_layer_norm_16bit.cpp shares). Runs after gemm_epilogue and attention_cast, before elementwise
// fusion (passes/pipeline.cpp).
#include <algorithm>
#include <map>

#include "compile/passes/gemm_16bit_results.h"
#include "compile/passes/passes.h"
#include "kernels/fused_expr.h"

namespace reel::compile {

bool is_16bit_gemm_bias_to_f32(const Node& n) {
  return is_gemm_bias(n) && n.inputs.size() == 3 && n.inputs[0] && n.inputs[1] && n.inputs[2] &&
         is_16bit(n.inputs[0]->dtype) && n.outputs.size() == 1 && n.outputs[0].dtype == DType::f32;
}

TensorRef Gemm16bitResults::cast_before(size_t i, const TensorRef& src, DType dtype) {
  const TensorRef dst = new_internal_buffer(g_, src.shape, dtype, g_.buffers[src.buffer].device);
  casts_before_[i].push_back(Node{OpKind::Copy, Attrs(), {src}, {dst}, false, {}});
  return dst;
}

bool Gemm16bitResults::write_16bit(size_t i, Why& why) {
  Node& n = g_.nodes[i];
  const TensorRef z = n.outputs[0];
  const DType c = n.inputs[0]->dtype;
  Buffer& zb = g_.buffers[z.buffer];
  if (!why(internal_once(g_, u_, z) && is_contiguous(z) && z.offset == 0 && zb.nbytes >= z.nbytes() && zb.storage &&
               !u_.readers[z.buffer].empty(),
           "its f32 result is not a fresh contiguous buffer that is read"))
    return false;
  // cuBLASLt's answer for the 16-bit result (the traced block is large enough for a view of it),
  // with the f32 bias or, where it has no such kernel, the bias cast to 16 bits as PyTorch's
  // autocast does (views of the f32 blocks stand in for the 16-bit tensors in the query).
  TensorRef z16 = z, bias = *n.inputs[2], bias16 = *n.inputs[2];
  z16.dtype = bias16.dtype = c;
  auto supported = [&](const TensorRef& b) {
    Node q = n;
    q.attrs.set("dtype", c);
    q.inputs[2] = b;
    q.outputs[0] = z16;
    return call_supported(g_, q);
  };
  const bool f32_bias = supported(bias);
  if (!why(f32_bias || (is_contiguous(bias) && supported(bias16)),
           "the device's gemm_epilogue takes no 16-bit result here"))
    return false;
  if (!f32_bias) {
    auto it = bias16_of_.find(bias.buffer);
    bool reuse = it != bias16_of_.end();
    for (int w : u_.writers[bias.buffer]) reuse = reuse && !(it->second.second <= w && w < int(i));
    if (!reuse) {
      const TensorRef cast = cast_before(i, bias, c);
      it = bias16_of_.insert_or_assign(bias.buffer, std::make_pair(cast, int(i))).first;
    }
    n.inputs[2] = it->second.first;
  }
  zb.nbytes = z16.nbytes();
  n.outputs[0] = z16;
  n.attrs.set("dtype", c);
  return true;
}

void Gemm16bitResults::insert_casts() {
  std::vector<Node> out;
  out.reserve(g_.nodes.size());
  for (size_t i = 0; i < g_.nodes.size(); ++i) {
    for (Node& c : casts_before_[i]) out.push_back(std::move(c));
    out.push_back(std::move(g_.nodes[i]));
  }
  g_.nodes = std::move(out);
  casts_before_.assign(g_.nodes.size(), {});
}

namespace {

// How a node reads z's buffer, for store_gemm_bias_16bit.
enum class Reader {
  Other,         // the pass leaves z alone
  AttentionQkv,  // an attention op (forward or backward, plain or with its cast) taking z as qkv: reads
                 // 16 bits as they are
  Elementwise,   // an elementwise op reading z once: reads it through a cast back to f32
};
Reader reader_kind(const Node& r, const TensorRef& z, DType compute) {
  int refs = 0;
  for (const auto& in : r.inputs) refs += in && in->buffer == z.buffer;
  if (refs != 1) return Reader::Other;
  const bool forward = r.op == OpKind::Attention || r.op == OpKind::AttentionCast;
  const bool backward = r.op == OpKind::AttentionBackward || r.op == OpKind::AttentionBackwardCast;
  const size_t qkv = forward ? 0 : backward ? 1 : SIZE_MAX;
  if (qkv != SIZE_MAX)
    return qkv < r.inputs.size() && r.inputs[qkv] && same_ref(*r.inputs[qkv], z) &&
                   r.attrs.i("compute") == int64_t(compute)
               ? Reader::AttentionQkv
               : Reader::Other;
  return is_fusable_op(r.op) && !r.in_place ? Reader::Elementwise : Reader::Other;
}

}  // namespace

void store_gemm_bias_16bit(Graph& g, PassStats& stats) {
  (void)stats;  // no node goes; the casts inserted here are folded by elementwise fusion
  const BufferUses u = buffer_uses(g);
  Gemm16bitResults results(g, u);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!is_16bit_gemm_bias_to_f32(g.nodes[i])) continue;
    const TensorRef z = g.nodes[i].outputs[0];
    const DType c = g.nodes[i].inputs[0]->dtype;
    Why why;
    for (int k : u.readers[z.buffer]) {
      const bool known =
          k < int(g.nodes.size()) && k > int(i) && reader_kind(g.nodes[size_t(k)], z, c) != Reader::Other;
      if (!why(known, k < int(g.nodes.size())
                          ? detail::cat(op_name(g.nodes[size_t(k)].op), " k", k, " reads the f32 result")
                          : std::string("the f32 result is a graph output")))
        break;
    }
    if (!why.reason().empty() || !results.write_16bit(i, why)) {
      why_not("gemm_16bit", g, i, "16-bit storage", why.reason());
      continue;
    }
    std::vector<int> readers = u.readers[z.buffer];
    readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
    for (int k : readers) {
      Node& r = g.nodes[size_t(k)];
      const Reader kind = reader_kind(r, z, c);
      // Attention reads the 16-bit qkv itself, its result staying f32.
      if (kind == Reader::AttentionQkv) r.attrs.set("dtype", DType::f32);
      for (auto& in : r.inputs) {
        if (!in || in->buffer != z.buffer) continue;
        in->dtype = c;
        if (kind == Reader::AttentionQkv) continue;
        // Elementwise: an f32 copy of what r reads, made just before r; r reads the copy.
        *in = results.cast_before(size_t(k), *in, DType::f32);
      }
    }
  }
  results.insert_casts();
}

}  // namespace reel::compile
