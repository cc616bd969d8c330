// (being written) schemas of the linalg family.
#include "kernels/schema/schema_util.h"
namespace reel {
void register_linalg_schemas() {}
}  // namespace reel
