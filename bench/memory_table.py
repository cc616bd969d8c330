#!/usr/bin/env python3
"""The memory table of bench/side_by_side.sh's memory phase: planned beside measured peaks.

usage: bench/memory_table.py reel.jsonl torch_eager.jsonl > table.md
One row per model and micro-batch B: reel's planned peak (`reel bench --plan-memory`, the step traced
in meta mode, nothing run) and the caching allocator's measured peak over the timed steps, with the
difference in percent, for eager and (where measured) reduce-overhead; then torch eager's measured
peak (torch.cuda.max_memory_allocated) for the same step. Rows whose planned and measured peaks differ
by more than 5% are marked.
"""
import json
import sys


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip().startswith("{")]


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    reel, torch = read(argv[1]), read(argv[2])
    key = lambda r: (r["model"], str(r.get("B")), r.get("mode", "eager"))
    by = {key(r): r for r in reel if "error" not in r}
    peer = {(r["model"], str(r.get("B"))): r for r in torch if "error" not in r}
    models, bs = [], []
    for r in reel:
        if r["model"] not in models:
            models.append(r["model"])
        if str(r.get("B")) not in bs:
            bs.append(str(r.get("B")))
    bs.sort(key=lambda b: int(b) if b.isdigit() else 0)

    def cells(r):
        if not r or r.get("planned_peak_mib") is None or r.get("peak_mib") is None:
            return ["-", "-", "-"]
        plan, meas = r["planned_peak_mib"], r["peak_mib"]
        diff = 100.0 * (meas - plan) / plan
        return [f"{plan:.1f}", f"{meas:.1f}", f"{diff:+.1f}%" + (" (!)" if abs(diff) > 5 else "")]

    head = ["model", "B", "eager planned MiB", "eager measured MiB", "diff",
            "reduce-overhead planned MiB", "measured MiB", "diff", "torch eager MiB"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    worst = 0.0
    for m in models:
        for b in bs:
            e, ro = by.get((m, b, "eager")), by.get((m, b, "reduce-overhead"))
            if not e and not ro:
                continue
            t = peer.get((m, b))
            row = [m, b] + cells(e) + cells(ro) + [f"{t['peak_mib']:.1f}" if t and t.get("peak_mib") else "-"]
            print("| " + " | ".join(row) + " |")
            for r in (e, ro):
                if r and r.get("planned_peak_mib") and r.get("peak_mib") is not None:
                    worst = max(worst, abs(r["peak_mib"] - r["planned_peak_mib"]) / r["planned_peak_mib"])
    print(f"\nlargest difference between planned and measured: {100 * worst:.1f}%")


if __name__ == "__main__":
    main(sys.argv)
