"""The peer's whole-step CUDA graph (peer/torch_graphed.py's step: ACCUM micro-batches under bf16
autocast, clip, AdamW, cudnn.benchmark) replayed N times inside a CUDA profiler range, so that
`ncu --profile-from-start off` times exactly one step's kernels, as `reel bench --profiler-range N`
does for reel. Run from the folder that holds the peer scripts' copy:
    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \
        python3 bench/peer_profiler_range.py .peer resnet18-cifar bf16 1 > torch.csv"""
import sys

import torch

sys.path.insert(0, sys.argv[1])
from torch_anchor import ACCUM, make  # noqa: E402  (the peer's model builder)

torch.backends.cudnn.benchmark = True
name, prec, replays = sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 1
torch.manual_seed(0)
m, xs, ys, lossf, _ = make(name, "cuda")
opt = torch.optim.AdamW(m.parameters(), lr=1e-3, capturable=True, foreach=True)
dt = torch.bfloat16 if prec == "bf16" else None


def step():
    for i in range(ACCUM):
        with torch.autocast("cuda", dtype=dt or torch.float32, enabled=dt is not None):
            loss = lossf(m(xs[i]), ys[i])
        (loss / ACCUM).backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0, foreach=True)
    opt.step()


s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        step()
torch.cuda.current_stream().wait_stream(s)
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
