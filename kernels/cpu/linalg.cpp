// (being written) CPU kernels of the linalg family.
#include "kernels/dispatch.h"
namespace reel {
void register_linalg_cpu_kernels() {}
}  // namespace reel
