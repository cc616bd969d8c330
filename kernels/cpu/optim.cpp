// (being written) CPU kernels of the optimizer family.
#include "kernels/dispatch.h"
namespace reel {
void register_optim_cpu_kernels() {}
}  // namespace reel
