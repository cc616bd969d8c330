// (being written) schemas of the norm family.
#include "kernels/schema/schema_util.h"
namespace reel {
void register_norm_schemas() {}
}  // namespace reel
