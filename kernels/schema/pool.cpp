// (being written) schemas of the pool family.
#include "kernels/schema/schema_util.h"
namespace reel {
void register_pool_schemas() {}
}  // namespace reel
