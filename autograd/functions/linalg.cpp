// (being written) differentiable ops of the linalg family.
#include "autograd/node.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"
namespace reel {
}  // namespace reel
