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

void prepare_accumulated_outputs(const KernelCall& call, size_t first_out, size_t first_in, size_t n,
                                 StridedCopyFn copy) {
  for (size_t k = 0; k < n; ++k) {
    const Tensor &out = call.out.at(first_out + k), &in = call.in.at(first_in + k);
    REEL_CHECK(out.is_contiguous(), op_name(call.op), ": attr accumulate adds into output ", first_out + k, " ",
               shape_str(out.shape()), ", which must be contiguous, got strides ", shape_str(out.strides()));
    const bool same_memory = out.data_ptr() == in.data_ptr() && out.dtype() == in.dtype() &&
                             out.shape() == in.shape() && out.strides() == in.strides();
    if (!same_memory) copy(out, in);
  }
}

}  // namespace reel
