// The libraries' persistent workspaces: device memory a backend allocates once and keeps for the life
// of the process (cuBLAS's workspace, the cuBLASLt workspaces of the GEMM epilogues and of GEMM
// autotuning), by name. The memory planner (compile/runtime/memory_budget.h) counts the ones a step needs and
// the ones already made, which stay allocated whatever runs next.
#pragma once
#include <cstddef>
#include <map>
#include <string>

#include "tensor/device.h"

namespace reel {

// name -> bytes as allocated (the allocator's rounded blocks) of the workspaces made so far on `device`.
std::map<std::string, size_t> library_workspaces(Device device);

}  // namespace reel
