#!/usr/bin/env python3
"""Joins reel's and the PyTorch peer's JSON lines (same field names) into one table.

usage: bench/join.py reel.jsonl peer1.jsonl [peer2.jsonl ...] > joined.md
Each row is one reel configuration (model, prec, micro-batch, mode): its step time beside every peer
configuration of the same model, precision and micro-batch measured in the same run, with the ratio reel/peer (below 1: reel is faster), and peak memory of each. A peer line with
an "error" field (e.g. reduce-overhead failing with accumulation) is shown as the error's first words.
Also writes joined.json, joined.dat (items/s per row) and throughput.dat (items/s per model and
precision, a column per reel mode and per peer configuration: what bench/plot.gp draws) beside the
first argument.
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


def main(argv):
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
    head = ["model", "prec", "B", "reel mode", "reel ms", "reel peak MiB", "reel kernels/step"]
    for label in labels:
        head += [f"torch {label} ms", "reel/torch", "torch peak MiB"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    joined = []
    for r in reel:
        row = [r["model"], r["prec"], str(r.get("B", "default")), r.get("mode", "eager"), f'{r["step_ms_median"]:.2f}',
               str(r.get("peak_mib") or "-"), f'{r.get("kernels_per_step", 0):.0f}']
        entry = dict(model=r["model"], prec=r["prec"], B=str(r.get("B", "default")), mode=r.get("mode", "eager"), reel_ms=r["step_ms_median"], reel_items_per_s=r["items_per_s"],
                     peers={})
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
    write_pivot(folder, joined, labels)
    with open(os.path.join(folder, "joined.dat"), "w") as f:  # items/s; "-" where a peer has none
        names = ["reel"] + ["torch_" + label.replace(" ", "_").replace(",", "") for label in labels]
        f.write("config " + " ".join(names) + "\n")
        for e in joined:
            cols = [str(e["reel_items_per_s"])] + [str(e["peers"][l]["items_per_s"]) if l in e["peers"] else "-"
                                                    for l in labels]
            b = "" if e["B"] == "default" else f"/B{e['B']}"
            f.write(f'{e["model"]}/{e["prec"]}{b}/{e["mode"]} ' + " ".join(cols) + "\n")


def write_pivot(folder, joined, labels):
    """throughput.dat: one row per (model, prec, B), items/s of each reel mode and each peer config."""
    modes = []
    for e in joined:
        if e["mode"] not in modes:
            modes.append(e["mode"])
    rows = {}
    for e in joined:
        key = f'{e["model"]}/{e["prec"]}' + ("" if e["B"] == "default" else f'/B{e["B"]}')
        row = rows.setdefault(key, {})
        row["reel_" + e["mode"]] = e["reel_items_per_s"]
        for label, p in e["peers"].items():
            row["torch_" + label.replace(" ", "_").replace(",", "")] = p["items_per_s"]
    names = ["reel_" + m for m in modes] + ["torch_" + l.replace(" ", "_").replace(",", "") for l in labels]
    with open(os.path.join(folder, "throughput.dat"), "w") as f:
        f.write("config " + " ".join(names) + "\n")
        for key, row in rows.items():
            f.write(key + " " + " ".join(str(row.get(n, "-")) for n in names) + "\n")


if __name__ == "__main__":
    main(sys.argv)
