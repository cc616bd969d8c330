// The tensors of a multi-tensor optimizer update (see multi_tensor.h).
#include "kernels/multi_tensor.h"

namespace reel {

const MultiTensorLayout& multi_tensor_layout(OpKind op) {
  static const MultiTensorLayout adamw{OpKind::AdamWStep, 4, 3}, sgd{OpKind::SgdStep, 3, 2};
  REEL_ASSERT(op == OpKind::MultiTensorAdamW || op == OpKind::MultiTensorSgd, op_name(op), " is not a multi-tensor op");
  return op == OpKind::MultiTensorAdamW ? adamw : sgd;
}

bool clip_stores_grads(const Attrs& a) { return a.b("clip", false) && a.b("clip_writes_grad", false); }

std::vector<OptimTensor> multi_tensor_list(const KernelCall& c) {
  const MultiTensorLayout& l = multi_tensor_layout(c.op);
  const size_t k = size_t(c.attrs.i("tensors"));
  const bool writes_grad = clip_stores_grads(c.attrs);
  const size_t out_per_tensor = k ? c.out.size() / k : 0;
  const size_t update_outs = out_per_tensor - (writes_grad ? 1 : 0);  // p m v, or p b?
  std::vector<OptimTensor> list(k);
  for (size_t i = 0; i < k; ++i) {
    const Tensor& p = c.in[i * l.per_tensor];
    OptimTensor& t = list[i];
    t.dtype = p.dtype();
    t.numel = p.numel();
    t.param = c.out[i * out_per_tensor].data_ptr();
    t.grad = c.in[i * l.per_tensor + 1].data_ptr();
    if (c.op == OpKind::MultiTensorAdamW) {
      t.state0 = c.out[i * out_per_tensor + 1].data_ptr();
      t.state1 = c.out[i * out_per_tensor + 2].data_ptr();
    } else if (update_outs == 2 && c.attrs.f("momentum") != 0) {  // as sgd_step: a buffer only with momentum
      t.state0 = c.out[i * out_per_tensor + 1].data_ptr();
    }
    if (writes_grad) t.grad_out = c.out[i * out_per_tensor + update_outs].data_ptr();
  }
  return list;
}

MultiTensorShared multi_tensor_shared(const KernelCall& c) {
  const MultiTensorLayout& l = multi_tensor_layout(c.op);
  const size_t tail = size_t(c.attrs.i("tensors")) * l.per_tensor;
  const Tensor* clip = c.attrs.b("clip", false) ? &c.in[tail + l.shared] : nullptr;
  return {&c.in[tail], &c.in[tail + 1], c.op == OpKind::MultiTensorAdamW ? &c.in[tail + 2] : nullptr, clip};
}

}  // namespace reel
