#!/usr/bin/env python3
"""Joins reel's and the PyTorch peer's JSON lines (same field names) into one table.

usage: bench/join.py reel.jsonl peer1.jsonl [peer2.jsonl ...] [--figures DIR [--note TEXT]] > joined.md
Each row is one reel configuration (model, prec, micro-batch, mode): its step time beside every peer
configuration of the same model, precision and micro-batch measured in the same run, with the ratio reel/peer (below 1: reel is faster), and peak memory of each. A peer line with
an "error" field (e.g. reduce-overhead failing with accumulation) is shown as the error's first words.
Also writes joined.json and joined.dat (items/s per row) beside the first argument. --figures DIR
draws the pictures of this same table into DIR (bench/figures.py: throughput and speedup, .png and
.dat), their titles carrying --note (e.g. the date and build).
"""
import json
import os
import sys


def read(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def peer_label(r):
    label = r.get("mode", "?")
    if os.environ.get("CG_TREES_FILE") and r.get("_file") == os.environ["CG_TREES_FILE"]:
        label += " (trees off)"
    if r.get("attn") == "sdpa":
        label += ", sdpa"
    return label


def same_config(p, r):
    """Same model, precision, device and micro-batch (B: "default" or the number asked for)."""
    return (p.get("model") == r["model"] and p.get("prec") == r["prec"]
            and str(p.get("B", "default")) == str(r.get("B", "default"))
            and p.get("dev", "cuda").split(":")[0] == r.get("dev", "cuda").split(":")[0])


def option(argv, name):
    """Removes `name VALUE` from argv and returns VALUE (None when absent)."""
    if name not in argv:
        return None
    i = argv.index(name)
    if i + 1 >= len(argv):
        sys.exit(__doc__)
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


# The FLOP use column: reel bench's model FLOPs a step over the median step time (tools/flop_count.h),
# and on the GPU its share of PEAK_TFLOPS (default 790: the bf16 GEMM rate measured on the H200).
def peak_tflops():
    return float(os.environ.get("PEAK_TFLOPS", "790"))


def flop_head():
    return f"reel TFLOP/s (% of {peak_tflops():g})"


def flop_cell(r):
    if "tflops" not in r:
        return "-"
    t = r["tflops"]
    return f"{t:.1f} ({100 * t / peak_tflops():.1f}%)" if str(r.get("dev", "")).startswith("cuda") else f"{t:.3f}"


def main(argv):
    argv = list(argv)
    figures_dir, note = option(argv, "--figures"), option(argv, "--note")
    if len(argv) < 2:
        sys.exit(__doc__)
    reel = [r for r in read(argv[1]) if "error" not in r]
    peers = []
    for path in argv[2:]:
        for r in read(path):
            r["_file"] = os.path.basename(path)
            peers.append(r)
    labels = []
    for p in peers:
        if peer_label(p) not in labels:
            labels.append(peer_label(p))
    head = ["model", "prec", "B", "reel mode", "reel ms", "reel peak MiB", "reel kernels/step", flop_head()]
    for label in labels:
        head += [f"torch {label} ms", "reel/torch", "torch peak MiB"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    joined = []
    for r in reel:
        row = [r["model"], r["prec"], str(r.get("B", "default")), r.get("mode", "eager"), f'{r["step_ms_median"]:.2f}',
               str(r.get("peak_mib") or "-"), f'{r.get("kernels_per_step", 0):.0f}', flop_cell(r)]
        entry = dict(model=r["model"], prec=r["prec"], B=str(r.get("B", "default")), mode=r.get("mode", "eager"), reel_ms=r["step_ms_median"], reel_items_per_s=r["items_per_s"],
                     peers={})
        entry.update({k: r[k] for k in ("date", "build") if r.get(k)})  # for the pictures' titles
        for label in labels:
            match = [p for p in peers if peer_label(p) == label and same_config(p, r)]
            if not match:
                row += ["-", "-", "-"]
            elif "error" in match[0]:
                row += ["fails: " + match[0]["error"][:40].replace("|", "/"), "-", "-"]
            else:
                p = match[0]
                row += [f'{p["step_ms_median"]:.2f}', f'{r["step_ms_median"] / p["step_ms_median"]:.2f}',
                        str(p.get("peak_mib") or "-")]
                entry["peers"][label] = dict(ms=p["step_ms_median"], items_per_s=p["items_per_s"],
                                             peak_mib=p.get("peak_mib"))
        print("| " + " | ".join(row) + " |")
        joined.append(entry)
    folder = os.path.dirname(os.path.abspath(argv[1]))
    with open(os.path.join(folder, "joined.json"), "w") as f:
        json.dump(joined, f, indent=1)
    with open(os.path.join(folder, "joined.dat"), "w") as f:  # items/s; "-" where a peer has none
        names = ["reel"] + ["torch_" + label.replace(" ", "_").replace(",", "") for label in labels]
        f.write("config " + " ".join(names) + "\n")
        for e in joined:
            cols = [str(e["reel_items_per_s"])] + [str(e["peers"][l]["items_per_s"]) if l in e["peers"] else "-"
                                                    for l in labels]
            b = "" if e["B"] == "default" else f"/B{e['B']}"
            f.write(f'{e["model"]}/{e["prec"]}{b}/{e["mode"]} ' + " ".join(cols) + "\n")
    if figures_dir:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import figures
        figures.write_figures(joined, figures_dir, note or "", source=os.path.basename(argv[1]))


if __name__ == "__main__":
    main(sys.argv)
