"""PyTorch's best training step for gpt-small under a memory budget, to set beside reel's choice
(`reel train --effective-batch 64 --memory-budget SIZE`, or reel bench --memory-limit): for each budget,
each configuration takes the largest micro-batch (64, 32, ..., 1 sequences of 256 tokens; ACCUM =
64 / micro-batch) whose step runs within the budget, and reports its tokens/s and peak.

Configurations (bf16 autocast, AdamW lr 1e-3, clip 1.0, loss / ACCUM, as MODELS.md's step):
  eager        the step as written
  checkpoint   each transformer block under torch.utils.checkpoint (use_reentrant=False)
  graph        the whole step captured in one CUDA graph (peer/torch_graphed.py's recipe)
  graph+ckpt   both
The budget is enforced with torch.cuda.set_per_process_memory_fraction(budget / device memory): the
caching allocator then fails any allocation that would take its reserved bytes past the budget, so a
micro-batch "fits" when its step (the graph's capture included) runs without that failure. Each
attempt runs in a process of its own, so a failed one leaves nothing behind.
    python3 bench/peer_memory_frontier.py .peer [256MiB,512MiB,1GiB,2GiB] > frontier.jsonl
START="graph=16,graph+ckpt=16" starts a configuration's search at that micro-batch (one measured under a
larger budget in an earlier call), so that a search cut short by the device's time limit can go on.
One JSON line per (budget, configuration): micro_batch, accum, tokens_per_s, peak_mib (the most
allocated at once, the capture included), or "fits": false when not even micro-batch 1 fits."""
import json
import os
import subprocess
import sys
import time

EFFECTIVE = 64
STEPS = int(os.environ.get("STEPS", 10))
CONFIGS = ["eager", "checkpoint", "graph", "graph+ckpt"]


def parse_size(text):
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 1e3, "mb": 1e6, "gb": 1e9, "b": 1}
    low = text.strip().lower()
    for unit in sorted(units, key=len, reverse=True):
        if low.endswith(unit):
            return int(float(low[: -len(unit)]) * units[unit])
    return int(low)


def one(peer_dir, budget, config, micro):
    """Runs `config` at `micro` sequences per micro-batch under `budget` bytes; prints one JSON line."""
    import torch
    import torch.utils.checkpoint as ckpt

    sys.path.insert(0, peer_dir)
    from torch_anchor import GPT  # noqa: E402  (the peer's model)

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total))
    torch.manual_seed(0)
    model = GPT(d=512, h=8, L=8, T=256).cuda()
    if "ckpt" in config or config == "checkpoint":
        for block in model.blocks:
            block.forward = (lambda f: lambda x: ckpt.checkpoint(f, x, use_reentrant=False))(block.forward)
    accum = EFFECTIVE // micro
    xs = [torch.randint(0, 256, (micro, 256), device="cuda") for _ in range(accum)]
    ys = [torch.randint(0, 256, (micro, 256), device="cuda") for _ in range(accum)]
    graphed = config.startswith("graph")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=graphed, foreach=True)

    def step():
        for x, y in zip(xs, ys):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
                loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
            (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=not graphed)

    torch.cuda.reset_peak_memory_stats()
    if graphed:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        run = g.replay
    else:
        for _ in range(2):
            step()
        run = step
    torch.cuda.synchronize()
    times = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    print(json.dumps(dict(micro_batch=micro, accum=accum, tokens_per_s=round(EFFECTIVE * 256 / med),
                          step_ms_median=round(med * 1e3, 3),
                          peak_mib=round(torch.cuda.max_memory_allocated() / 2**20, 1))), flush=True)


def main():
    if len(sys.argv) > 2 and sys.argv[2] == "--one":
        one(sys.argv[1], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
        return
    peer_dir = sys.argv[1]
    budgets = (sys.argv[2] if len(sys.argv) > 2 else "256MiB,512MiB,1GiB,2GiB").split(",")
    # Largest budget first: what fits a budget fits every larger one, so each configuration's search
    # under a smaller budget starts from the micro-batch that fitted the larger one (fewer processes).
    start = {config: EFFECTIVE for config in CONFIGS}
    for item in filter(None, os.environ.get("START", "").split(",")):
        config, micro = item.split("=")
        start[config] = int(micro)
    fitted = {config: True for config in CONFIGS}  # False once a configuration fits no micro-batch
    rows = []
    for text in sorted(budgets, key=parse_size, reverse=True):
        budget = parse_size(text)
        for config in CONFIGS:
            row = dict(model="gpt-small", prec="bf16", effective_batch=EFFECTIVE, budget=text, config=config, fits=False)
            micro = start[config]
            if not fitted[config]:  # nothing fitted a larger budget: nothing fits this one
                micro = 0
                row["note"] = "nothing fitted a larger budget"
            while micro >= 1:
                p = subprocess.run([sys.executable, __file__, peer_dir, "--one", str(budget), config, str(micro)],
                                   capture_output=True, text=True, timeout=300)
                lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
                if p.returncode == 0 and lines:
                    row.update(json.loads(lines[-1]), fits=True)
                    break
                if "out of memory" not in p.stderr.lower():  # another failure: say what, stop shrinking
                    row["error"] = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1][:300]
                    break
                micro //= 2
            start[config] = max(micro, 1)
            fitted[config] = row["fits"]
            print(json.dumps(row), file=sys.stderr, flush=True)  # progress, in case the run is cut short
            rows.append(row)
    for row in sorted(rows, key=lambda r: (parse_size(r["budget"]), CONFIGS.index(r["config"]))):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
