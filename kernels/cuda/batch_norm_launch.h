// The switch of batch norm's one-launch kernels (kernels/cuda/batch_norm_tiles.cuh), host code only:
// a training batch norm on a channels-last plane whose grid fits on the GPU at once runs its
// statistics and apply as one kernel, and its backward's sums and dx as another, instead of two each.
// On unless set_batch_norm_one_launch(false) or REEL_BATCH_NORM_ONE_LAUNCH=0 (read once; 0 or 1). Either
// way the same bits; a CUDA graph keeps the kernels it captured.
#pragma once

namespace reel::cuda {

bool batch_norm_one_launch();
// Sets the switch; returns it as it was.
bool set_batch_norm_one_launch(bool on);

}  // namespace reel::cuda
