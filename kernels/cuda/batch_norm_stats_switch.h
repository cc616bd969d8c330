// The switch of where batch norm's tiled training statistics are combined (kernels/cuda/batch_norm.cu's
// stats_split), host code only. On (the default, or REEL_BATCH_NORM_STATS_LAST_BLOCK=1): the statistics
// kernel's last block of each channel tile combines the tile's chunks of one tile of pixels, as before.
// Off (set_batch_norm_stats_last_block(false) or REEL_BATCH_NORM_STATS_LAST_BLOCK=0): where a channel
// tile has at most 64 chunks of 1, 2 or 4 tiles, every block of the apply kernel combines them itself
// and the statistics kernel only writes them; larger planes keep the last block, over chunks of 4
// tiles. With chunks of one tile (a plane of at most 64 of them a channel) the two give the same bits;
// with larger chunks the sums are grouped otherwise and agree to rounding. Off is not the default: on an
// H100 it made yolov8n-cls's step 8.6% faster but cnn-small's 1.5% slower, whose first norm it runs as
// 64 chunks of four tiles (bench/RESULTS.md, nineteenth step). A CUDA graph keeps the kernels it
// captured.
#pragma once

namespace reel::cuda {

bool batch_norm_stats_last_block();
// Sets the switch; returns it as it was.
bool set_batch_norm_stats_last_block(bool on);

}  // namespace reel::cuda
