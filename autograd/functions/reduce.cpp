// (being written) differentiable ops of the reduce family.
#include "autograd/node.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"
namespace reel {
}  // namespace reel
namespace reel {
Tensor sum(const Tensor&, const std::vector<int64_t>&, bool) { throw Error("sum: not yet"); }
Tensor mean(const Tensor&, const std::vector<int64_t>&, bool) { throw Error("mean: not yet"); }
}  // namespace reel
