#include "kernels/dense_outputs.h"

namespace reel {

void run_into_contiguous(const KernelCall& call, KernelFn kernel, StridedCopyFn copy) {
  bool dense = true;
  for (const Tensor& o : call.out) dense = dense && (!o.defined() || o.is_contiguous());
  if (dense) return kernel(call);
  std::vector<Tensor> tmp;
  for (const Tensor& o : call.out)
    tmp.push_back(!o.defined() || o.is_contiguous() ? o : Tensor::empty(o.shape(), o.dtype(), o.device()));
  kernel(KernelCall{call.op, call.in, tmp, call.attrs});
  for (size_t i = 0; i < tmp.size(); ++i)
    if (!tmp[i].is_same(call.out[i])) copy(call.out[i], tmp[i]);
}

}  // namespace reel
