// (being written) CPU kernels of the pool family.
#include "kernels/dispatch.h"
namespace reel {
void register_pool_cpu_kernels() {}
}  // namespace reel
