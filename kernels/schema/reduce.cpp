// (being written) schemas of the reduce family.
#include "kernels/schema/schema_util.h"
namespace reel {
void register_reduce_schemas() {}
}  // namespace reel
