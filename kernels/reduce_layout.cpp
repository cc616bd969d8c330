#include "kernels/reduce_layout.h"

namespace reel {

ReduceLayout reduce_layout(const Tensor& x, const std::vector<int64_t>& dims_attr, Tensor (*densify)(const Tensor&)) {
  const int64_t nd = x.dim();
  std::vector<bool> is_red(size_t(nd), false);
  if (nd > 0)
    for (int64_t d : wrap_dims(dims_attr, nd, "reduce")) is_red[size_t(d)] = true;
  // Do the reduced dims of size > 1 form one run of x's dims (size-1 dims may sit anywhere)?
  int64_t first = -1;
  int state = 0;  // 0: before the run, 1: inside it, 2: after it
  bool one_run = true;
  for (int64_t d = 0; d < nd; ++d) {
    if (x.shape()[d] == 1) continue;
    if (is_red[size_t(d)]) {
      if (state == 2) one_run = false;
      if (first < 0) first = d;
      state = 1;
    } else if (state == 1) {
      state = 2;
    }
  }
  ReduceLayout L;
  // An empty input reads nothing: every output element is the same (op of nothing), so any
  // (outer, reduced, inner) with the right sizes will do.
  if (x.numel() == 0 || (x.is_contiguous() && one_run)) {
    L.src = x;
    for (int64_t d = 0; d < nd; ++d) {
      int64_t s = x.shape()[d];
      if (is_red[size_t(d)]) L.reduced *= s;
      else if (first < 0 || d < first) L.outer *= s;
      else L.inner *= s;
    }
    return L;
  }
  // Kept dims first, reduced dims innermost; copied only when that view is not contiguous.
  Shape shape, strides;
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t d = 0; d < nd; ++d)
      if (is_red[size_t(d)] == (pass == 1)) {
        shape.push_back(x.shape()[d]);
        strides.push_back(x.strides()[d]);
        (pass == 1 ? L.reduced : L.outer) *= x.shape()[d];
      }
  L.src = densify(Tensor::make_view(x, shape, strides, x.offset()));
  return L;
}

}  // namespace reel
