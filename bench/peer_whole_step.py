"""The peer's whole-step training function as peer/torch_graphed.py builds it (ACCUM micro-batches under
bf16 autocast or fp32, loss / ACCUM, backward each, clip 1.0, capturable AdamW, cudnn.benchmark), for
the bench scripts that capture it themselves (peer_profiler_range.py, peer_graph_memory.py).
    step, opt = whole_step(peer_dir, name, prec)   # peer_dir: the folder holding the peer scripts' copy
    warm_up(step, opt)                             # three eager steps on a side stream, as before capture"""
import sys

import torch


def whole_step(peer_dir, name, prec):
    sys.path.insert(0, peer_dir)
    from torch_anchor import ACCUM, make  # noqa: E402  (the peer's model builder)

    torch.backends.cudnn.benchmark = True
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

    return step, opt


def warm_up(step, opt, steps=3):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
