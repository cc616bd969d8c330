// NCCL for CUDA tensors (see dist/nccl.h). Placeholder: host staging.
#include "dist/nccl.h"

namespace reel::dist {

std::unique_ptr<DeviceCollectives> make_nccl_collectives(Communicator&, Device) { return nullptr; }

}  // namespace reel::dist
