#!/usr/bin/env python3
"""Kernel-level profile of one PyTorch training step of a MODELS.md model, to set beside
`reel bench --profile` (the peer's model and data come from .peer/torch_anchor.py, imported as is).

usage: python3 bench/torch_profile.py MODEL PREC [top]      (on the GPU machine; eager mode)
Prints the `top` CUDA kernels by device time per step, the step's kernel count and total device time.
DEV=cpu THREADS=N profiles the CPU step instead (fp32, N threads): the top aten ops by self CPU time,
to set beside `reel bench --device cpu --threads N --profile 1`.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".peer"))
import torch_anchor as peer  # noqa: E402


def main():
    name, prec = sys.argv[1], sys.argv[2]
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    dev = os.environ.get("DEV", "cuda")
    if dev == "cpu":
        torch.set_num_threads(int(os.environ.get("THREADS", 2)))
    torch.manual_seed(0)
    m, xs, ys, lossf, items = peer.make(name, dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=(dev == "cuda"))
    scaler = torch.amp.GradScaler(dev, enabled=(prec == "fp16"))
    torch.backends.cudnn.benchmark = True
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(prec)

    def step():
        for i in range(peer.ACCUM):
            with torch.autocast(device_type=dev, dtype=dt or torch.float32, enabled=dt is not None):
                loss = lossf(m(xs[i]), ys[i])
            scaler.scale(loss / peer.ACCUM).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    from torch.profiler import ProfilerActivity, profile
    if dev == "cpu":
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        print(f"torch {name} {prec} eager on {torch.get_num_threads()} CPU threads: {total / 1e3:.3f} ms self CPU time")
        print(f"  {'op':<60} {'calls':>6} {'ms/step':>9}")
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]:
            print(f"  {e.key[:60]:<60} {e.count:>6} {e.self_cpu_time_total / 1e3:>9.3f}")
        return
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    total = sum(e.self_device_time_total for e in events)
    kernels = sum(e.count for e in events)
    print(f"torch {name} {prec} eager: {kernels} device kernels/copies per step, {total / 1e3:.3f} ms device time")
    print(f"  {'kernel':<90} {'calls':>6} {'ms/step':>9}")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:top]:
        print(f"  {e.key[:90]:<90} {e.count:>6} {e.self_device_time_total / 1e3:>9.3f}")


if __name__ == "__main__":
    main()
