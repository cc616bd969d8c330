// Writing a GEMM + bias result in 16 bits: the rewrite that store_gemm_16bit.cpp makes for the
// readers it knows (attention, elementwise ops) and read_layer_norm_16bit.cpp for a layer norm's
// addend. A gemm_epilogue of 16-bit operands that writes f32 z (the bias added to the f32
// accumulator) writes z in the operands' dtype instead: with the f32 bias where the device takes
// that, or else with the bias cast to 16 bits, as PyTorch's autocast rounds it (one cast per bias,
// made before its first such GEMM and reused until something writes the bias). What reads z is the
// caller's to rewrite.
#pragma once
#include <cstddef>
#include <map>
#include <utility>
#include <vector>

#include "compile/passes/pattern.h"

namespace reel::compile {

// A node fuse_gemm_epilogue made from a 16-bit GEMM, autocast's cast to f32 and the bias add.
bool is_16bit_gemm_bias_to_f32(const Node& n);

class Gemm16bitResults {
 public:
  // u: the buffer uses of g as the pass found it (node indices stay valid until insert_casts()).
  Gemm16bitResults(Graph& g, const BufferUses& u) : g_(g), u_(u), casts_before_(g.nodes.size()) {}

  // Node i (is_16bit_gemm_bias_to_f32) rewritten to write its result in its operands' dtype: z's
  // buffer shrinks to the 16-bit size and keeps its id, so z's readers keep pointing at it (with the
  // f32 dtype until the caller changes them). False with nothing changed, the reason in `why`, where
  // z is not a fresh contiguous buffer or the device's gemm_epilogue takes no 16-bit result.
  bool write_16bit(size_t i, Why& why);
  // A cast of `src` into a new contiguous Internal buffer of `dtype`, run just before node i: its result.
  TensorRef cast_before(size_t i, const TensorRef& src, DType dtype);
  // Puts the casts made so far into the graph, each just before its node. Last: indices change.
  void insert_casts();

 private:
  Graph& g_;
  const BufferUses& u_;
  std::vector<std::vector<Node>> casts_before_;
  std::map<int, std::pair<TensorRef, int>> bias16_of_;  // f32 bias buffer -> its 16-bit cast, made before node
};

}  // namespace reel::compile
