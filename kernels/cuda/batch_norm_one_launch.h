// The switch of batch norm's one-launch backward (kernels/cuda/batch_norm_tiles.cuh), host code only:
// the backward of a batch norm on a channels-last plane whose grid fits on the GPU at once runs its
// sums and dx as one kernel, its blocks waiting for each other (kernels/cuda/last_block.cuh's
// wait_for_result) instead of handing their sums to a second kernel. On unless
// set_batch_norm_one_launch(false) or REEL_BATCH_NORM_ONE_LAUNCH=0 (read once; 0 or 1). Either way the
// same bits; a CUDA graph keeps the kernels it captured. (Layer norm's row-in-registers backward,
// finishing its dw and db the same way, made gpt-tiny's and gpt-small's steps 0.6-2.4% slower on an
// H100, bench/RESULTS.md, fifteenth step: it keeps its finish kernel.)
#pragma once

namespace reel::cuda {

bool batch_norm_one_launch();
// Sets the switch; returns it as it was.
bool set_batch_norm_one_launch(bool on);

}  // namespace reel::cuda
