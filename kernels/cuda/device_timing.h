// Timing candidate kernels on the device, for the kernels that autotune (kernels/autotune.h): GEMMs
// (gemm_autotune.cu), attention's two implementations (attention.cu). Declared without CUDA types;
// defined in device_timing.cu.
#pragma once
#include <functional>
#include <optional>

#include "tensor/tensor.h"

namespace reel::cuda {

// Whether `device`'s current stream is capturing a CUDA graph: timing (which synchronises) must wait
// for a later call then.
bool capturing(Device device);

// Mean device time (ms) of run() over `runs` calls after one warm-up (which also loads the kernels),
// on `device`'s current stream between two CUDA events; nullopt when run() reports a failure to
// launch. A spin kernel ahead of the timed runs lets the host enqueue them all before the device
// reaches them, so short kernels are timed back to back as in a graph replay, not paced by launch
// overhead. Synchronises with the stream.
std::optional<float> mean_device_ms(Device device, int runs, const std::function<bool()>& run);

}  // namespace reel::cuda
