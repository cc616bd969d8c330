"""PyTorch on line-per-item batches, to set beside `reel train --items lines --compile reduce-overhead`:
gpt-small (the peer's GPT, d 512, 8 heads, 8 layers, context 256), bf16 autocast, AdamW lr 1e-3,
clipping at 1.0, micro-batch B x ACCUM, the loss a mean over each step's real tokens (cross_entropy with
ignore_index -100 summed, divided by the step's real targets), as reel's step weighs them.

Items as data/text_lines.h makes them: each non-empty line of the text, cut at 257 bytes; inputs its
bytes but the last, targets its bytes but the first; a micro-batch of B items drawn at random, padded to
its longest with 0 (inputs) and -100 (targets).

Configurations:
  dynamic        torch.compile(model) with dynamic=None: a new length recompiles once, then Dynamo
                 marks the dim dynamic (automatic dynamic shapes)
  mark_dynamic   torch.compile(model) with torch._dynamo.mark_dynamic on the length dim of every
                 micro-batch (min 2, max 256): one dynamic graph from the start
  padded_graph   every micro-batch padded to 256, the whole step (ACCUM forwards and backwards,
                 clipping, AdamW) captured in one CUDA graph (peer/torch_graphed.py's recipe)
  padded_compile every micro-batch padded to 256, the forward and loss under
                 torch.compile(mode="reduce-overhead", dynamic=False) (as peer/torch_anchor.py); not run by
                 default: with PyTorch 2.11 on the H200 it stops in its first steps with "accessing tensor
                 output of CUDAGraphs that has been overwritten by a subsequent run"
One JSON line each: real tokens/s (median over the timed steps, each step synchronised), padded
tokens / real tokens, recompiles (Dynamo's frame compiles after the first), peak memory (allocated).
    python3 bench/peer_variable_length.py .peer LINES_FILE [STEPS] [B] [ACCUM] > variable.jsonl
"""
import json
import os
import random
import sys
import time

T = 256


def read_items(path):
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    return [line[: T + 1] for line in lines if len(line) >= 2]


def batches(items, B, seed):
    import torch

    rng = random.Random(seed)
    while True:
        chosen = [items[rng.randrange(len(items))] for _ in range(B)]
        L = max(len(c) - 1 for c in chosen)
        x = torch.zeros(B, L, dtype=torch.long)
        y = torch.full((B, L), -100, dtype=torch.long)
        for i, c in enumerate(chosen):
            t = torch.tensor(list(c), dtype=torch.long)
            x[i, : len(c) - 1] = t[:-1]
            y[i, : len(c) - 1] = t[1:]
        yield x, y


def run(peer_dir, items, config, steps, B, accum):
    import torch
    import torch._dynamo

    sys.path.insert(0, peer_dir)
    from torch_anchor import GPT  # noqa: E402  (the peer's model)

    torch.manual_seed(0)
    model = GPT(d=512, h=8, L=8, T=T).cuda()
    graphed = config == "padded_graph"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=graphed, foreach=True)
    padded = config.startswith("padded")
    if config == "dynamic":
        fwd = torch.compile(model, dynamic=None)
    elif config == "mark_dynamic":
        fwd = torch.compile(model)
    else:
        fwd = model

    def summed_loss(x, y):  # the loss summed over the real targets
        logits = fwd(x)
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]).float(), y.view(-1),
                                                 ignore_index=-100, reduction="sum")

    mark = lambda: None  # noqa: E731
    if config == "padded_compile":
        # The forward and the loss in one compiled function, as the peer's anchor (torch_anchor.py)
        # compiles its step under reduce-overhead, marking each micro-batch a new CUDA-graph step.
        summed_loss = torch.compile(summed_loss, mode="reduce-overhead", dynamic=False)
        mark = torch.compiler.cudagraph_mark_step_begin
    source = batches(items, B, seed=7)
    static = [(torch.zeros(B, T, dtype=torch.long, device="cuda"), torch.full((B, T), -100, dtype=torch.long, device="cuda"))
              for _ in range(accum)]

    def next_step():
        micro, real, pad = [], 0, 0
        for _ in range(accum):
            x, y = next(source)
            real += int((y != -100).sum())
            if padded:
                px = torch.zeros(B, T, dtype=torch.long)
                py = torch.full((B, T), -100, dtype=torch.long)
                px[:, : x.shape[1]] = x
                py[:, : y.shape[1]] = y
                x, y = px, py
            pad += y.numel()
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            if config == "mark_dynamic":
                torch._dynamo.mark_dynamic(x, 1, min=2, max=T)
                torch._dynamo.mark_dynamic(y, 1, min=2, max=T)
            micro.append((x, y))
        return micro, real, pad

    def step(micro):
        total = sum((y != -100).sum() for _, y in micro).float()
        for x, y in micro:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                mark()
                loss = summed_loss(x, y)
            (loss / total).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=not graphed)

    run_step = step
    if graphed:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step(static)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step(static)

        def run_step(micro):
            for (sx, sy), (x, y) in zip(static, micro):
                sx.copy_(x)
                sy.copy_(y)
            g.replay()

    torch._dynamo.utils.counters.clear()
    warm = max(3, steps // 10)
    torch.cuda.reset_peak_memory_stats()
    times, real_tokens, padded_tokens = [], 0, 0
    start = time.perf_counter()
    for i in range(steps):
        micro, real, pad = next_step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run_step(micro)
        torch.cuda.synchronize()
        if i >= warm:
            times.append((time.perf_counter() - t0, real))
        real_tokens += real
        padded_tokens += pad
    wall = time.perf_counter() - start
    frames = torch._dynamo.utils.counters["stats"].get("unique_graphs", 0)
    per_token = sorted(t / r for t, r in times)
    return dict(engine="torch", model="gpt-small", prec="bf16", config=config, B=B, accum=accum, steps=steps,
                real_tokens_per_s=round(1.0 / per_token[len(per_token) // 2]),
                wall_tokens_per_s=round(real_tokens / wall), padding_overhead=round(padded_tokens / real_tokens, 3),
                graphs_compiled=int(frames), recompiles=max(0, int(frames) - 1),
                peak_mib=round(torch.cuda.max_memory_allocated() / 2**20, 1))


def main():
    peer_dir, path = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    B = int(sys.argv[4]) if len(sys.argv) > 4 else 16
    accum = int(sys.argv[5]) if len(sys.argv) > 5 else 4
    items = read_items(path)
    configs = os.environ.get("CONFIGS", "dynamic,mark_dynamic,padded_graph").split(",")
    for config in configs:
        try:
            row = run(peer_dir, items, config, steps, B, accum)
        except Exception as e:  # one configuration failing (out of memory, a compiler error) is a row too
            row = dict(engine="torch", config=config, error=str(e).splitlines()[0][:300] if str(e) else repr(e))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
