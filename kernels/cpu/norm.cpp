// (being written) CPU kernels of the norm family.
#include "kernels/dispatch.h"
namespace reel {
void register_norm_cpu_kernels() {}
}  // namespace reel
