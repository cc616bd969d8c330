// The switch of where batch norm's tiled training statistics are combined (kernels/cuda/batch_norm.cu's
// stats_in_apply), host code only. Off (the default, or REEL_BATCH_NORM_STATS_LAST_BLOCK=0): where a
// channel tile has at most 64 chunks, every block of the apply kernel combines them itself and the
// statistics kernel only writes them; larger planes are combined by the statistics kernel's last block
// of each channel tile. On (set_batch_norm_stats_last_block(true) or REEL_BATCH_NORM_STATS_LAST_BLOCK=1):
// the last block for every plane, as before the apply kernel could. The same partials and the same
// device function either way: the same bits. The default made yolov8n-cls's step 1.6-2.1% faster on
// two H100s and 4.9% slower on a third, whose other runs were unlike the two's too; Nsight Compute sums
// its kernels 0.10 ms shorter (bench/RESULTS.md, nineteenth and twentieth steps). A CUDA graph keeps
// the kernels it captured.
#pragma once

namespace reel::cuda {

bool batch_norm_stats_last_block();
// Sets the switch; returns it as it was.
bool set_batch_norm_stats_last_block(bool on);

}  // namespace reel::cuda
