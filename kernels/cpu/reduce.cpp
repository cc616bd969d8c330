// (being written) CPU kernels of the reduce family.
#include "kernels/dispatch.h"
namespace reel {
void register_reduce_cpu_kernels() {}
}  // namespace reel
