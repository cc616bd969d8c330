"""The table of an A/B call (bench/side_by_side.sh ab): this build as it is ("base") and with the change
named by the environment ("test"), rounds alternating, in one call. One row per model and precision:
each round's median step, the change of the median of the rounds' medians, peak memory and kernels.
    python3 bench/ab_table.py DIR      (DIR holds base.r<k>.jsonl and test.r<k>.jsonl)"""
import glob
import json
import os
import statistics
import sys


def rows(pattern):
    out = {}
    for path in sorted(glob.glob(pattern)):
        for line in open(path):
            if line.strip():
                r = json.loads(line)
                out.setdefault((r["model"], r["prec"]), []).append(r)
    return out


def main():
    d = sys.argv[1]
    base, test = rows(os.path.join(d, "base.r*.jsonl")), rows(os.path.join(d, "test.r*.jsonl"))
    change = open(os.path.join(d, "change.txt")).read().strip() if os.path.exists(os.path.join(d, "change.txt")) else "test"
    print(f"base: this build; test: the same with {change}. Median step ms of each round, alternating.\n")
    print("| model | prec | base (rounds) | test (rounds) | change | peak MiB base / test | kernels base / test |")
    print("|---|---|---|---|---|---|---|")
    for key in base:
        if key not in test:
            continue
        b, t = base[key], test[key]
        bm, tm = [r["step_ms_median"] for r in b], [r["step_ms_median"] for r in t]
        pct = 100.0 * (statistics.median(tm) / statistics.median(bm) - 1.0)
        print(f"| {key[0]} | {key[1]} | {' / '.join(f'{x:.3f}' for x in bm)} | {' / '.join(f'{x:.3f}' for x in tm)} | "
              f"{pct:+.1f}% | {b[0]['peak_mib']} / {t[0]['peak_mib']} | {b[0].get('kernels_per_step')} / "
              f"{t[0].get('kernels_per_step')} |")


if __name__ == "__main__":
    main()
