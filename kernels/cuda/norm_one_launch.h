// The switches of the norms' one-launch backwards, host code only. Where every block of a backward's
// grid can be resident at once, its blocks wait for each other (kernels/cuda/last_block.cuh's
// wait_for_result) instead of handing their partial sums to a second kernel:
//   - batch norm on a channels-last plane (kernels/cuda/batch_norm_tiles.cuh): the sums and dx in one
//     kernel; REEL_BATCH_NORM_ONE_LAUNCH=0 turns it off;
//   - layer norm's row-in-registers backward (kernels/cuda/layer_norm_rows.cuh): dx and the parameters'
//     partial sums, then their finish, in one kernel; REEL_LAYER_NORM_ONE_LAUNCH=0 turns it off.
// Each is on unless set off here or by its variable (read once; 0 or 1). Either way the same bits; a
// CUDA graph keeps the kernels it captured.
#pragma once

namespace reel::cuda {

bool batch_norm_one_launch();
// Sets the switch; returns it as it was.
bool set_batch_norm_one_launch(bool on);

bool layer_norm_one_launch();
bool set_layer_norm_one_launch(bool on);

}  // namespace reel::cuda
