"""What the peer's whole-step CUDA graph (peer/torch_graphed.py's step) really holds on the device.

torch_graphed.py reports torch.cuda.max_memory_allocated() over replays after reset_peak_memory_stats().
A replay allocates nothing: the step's activations and temporaries live in the graph's private memory
pool, whose blocks were freed back to the pool at the end of the capture, so that figure is what is
allocated between steps (parameters, gradients, optimizer state, the graph's static outputs) and not
what the step needs while it runs. reel's figure (reel bench's peak_mib) is its allocator's peak over the
timed steps, arena included. This script prints, for one model per process, side by side:
  rest_mib      max_memory_allocated over replays after a reset: torch_graphed.py's figure
  capture_mib   max_memory_allocated during the capture, reset just before it: the most the step's
                live tensors held at once, what the private pool must provide on every replay
  reserved_mib  memory_reserved() after the capture: what the caching allocator holds from the device
                (the warm-up's cached blocks included)
Run from the folder that holds the peer scripts' copy:
    python3 bench/peer_graph_memory.py .peer resnet18-cifar bf16"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_whole_step import warm_up, whole_step  # noqa: E402

name, prec = sys.argv[2], sys.argv[3]
step, opt = whole_step(sys.argv[1], name, prec)
mib = lambda b: round(b / 2**20, 1)  # noqa: E731
warm_up(step, opt)
g = torch.cuda.CUDAGraph()
opt.zero_grad(set_to_none=True)
torch.cuda.reset_peak_memory_stats()
with torch.cuda.graph(g):
    step()
torch.cuda.synchronize()
capture, reserved = torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved()
for _ in range(5):
    g.replay()
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
for _ in range(10):
    g.replay()
torch.cuda.synchronize()
print(json.dumps(dict(model=name, mode="graphed-whole-step", prec=prec, rest_mib=mib(torch.cuda.max_memory_allocated()),
                      capture_mib=mib(capture), reserved_mib=mib(reserved))), flush=True)
