// FlopCounter — the arithmetic of a step, counted op by op as it dispatches, for the FLOP utilisation
// `reel bench` reports (FLOPs per step / step time / a peak rate).
//
// Counted: the ops whose work is products — a multiply-add counts 2 FLOPs:
//   matmul, matmul_into, gemm_epilogue   2 M N K per product (out (..., M, N), K the inner size)
//   conv2d and its two backward ops      2 numel(y) (C/g kH kW): the same products each way
//   attention                            QK^T and PV: 2 * 2 B H hd per visible (query, key) pair,
//                                        T (T + 1) / 2 pairs a sequence when causal, T^2 when not
//   attention_backward                   twice the forward (dQ, dK, dV, dP: the model's FLOPs; the
//                                        kernels' recomputation of QK^T is not counted)
// Everything else (elementwise ops, norms, reductions, the optimizer) is left out: it is memory-bound
// and a rounding error next to these at the benchmark models' sizes. These are the step's model
// FLOPs as eager ops run them, so a compiled plan of the same step is credited the same number.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/dispatch.h"

namespace reel::tools {

// The FLOPs of one dispatched op as above; 0 for ops not counted.
double op_flops(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, const Attrs& attrs);

class FlopCounter : public DispatchObserver {
 public:
  void on_dispatch(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                   const Attrs& attrs, bool into_given) override {
    flops_ += op_flops(op, inputs, outputs, attrs);
  }
  double flops() const { return flops_; }

 private:
  double flops_ = 0;
};

}  // namespace reel::tools
