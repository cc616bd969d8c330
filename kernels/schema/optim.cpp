// (being written) schemas of the optimizer family.
#include "kernels/schema/schema_util.h"
namespace reel {
void register_optim_schemas() {}
}  // namespace reel
