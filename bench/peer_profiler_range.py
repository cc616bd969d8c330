"""The peer's whole-step CUDA graph (peer/torch_graphed.py's step: ACCUM micro-batches under bf16
autocast, clip, AdamW, cudnn.benchmark) replayed N times inside a CUDA profiler range, so that
`ncu --profile-from-start off` times exactly one step's kernels, as `reel bench --profiler-range N`
does for reel. Run from the folder that holds the peer scripts' copy:
    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \
        python3 bench/peer_profiler_range.py .peer resnet18-cifar bf16 1 > torch.csv"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_whole_step import warm_up, whole_step  # noqa: E402

name, prec, replays = sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 1
step, opt = whole_step(sys.argv[1], name, prec)
warm_up(step, opt)
g = torch.cuda.CUDAGraph()
opt.zero_grad(set_to_none=True)
with torch.cuda.graph(g):
    step()
for _ in range(3):
    g.replay()
torch.cuda.synchronize()
torch.cuda.profiler.start()
for _ in range(replays):
    g.replay()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
