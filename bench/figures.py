#!/usr/bin/env python3
"""Draws the side-by-side benchmark pictures from the same joined data as the table (bench/join.py).

usage: bench/figures.py JOINED.json OUTDIR [--note TEXT]   pictures of a joined.json (join.py's)
       bench/join.py reel.jsonl peer.jsonl... --figures OUTDIR [--note TEXT]   table and pictures in one run
       bench/figures.py --self-test                           runs on a small sample and checks the output
Writes into OUTDIR (python3's standard library and gnuplot, pngcairo or else png terminal):
  throughput.png / .dat  items/s of each reel mode and each PyTorch configuration, a group of bars per
                         model (and precision / micro-batch where the data has several), log scale
  speedup.png / .dat     torch ms / reel ms for each PyTorch configuration, per model, on a linear
                         scale with the 1x line (above 1: reel is faster); reel's step is its fastest
                         mode of that model, named in speedup.dat's reel_mode column
The .dat files are plain columns (a header line of names, "-" where a configuration has no figure) for
re-plotting. The titles carry --note (e.g. "2026-12-03, build 49b68b0") or, when the joined rows have
them, their "date" and "build" fields.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

MISSING = "-"


def column_name(label):
    """A .dat column name without spaces: 'torch reduce-overhead (trees off), sdpa' -> torch_reduce-overhead_trees_off_sdpa."""
    out = label.replace(",", "").replace("(", "").replace(")", "").split()
    return "_".join(out)


def group_key(e, many_precs, many_bs):
    key = e["model"]
    if many_precs:
        key += "/" + e["prec"]
    if many_bs and str(e.get("B", "default")) != "default":
        key += "/B" + str(e["B"])
    return key


def tables(joined):
    """(groups, series, peers, throughput, speedup, common) from join.py's joined rows.

    series: labels, reel modes first ('reel MODE'), then every peer configuration ('torch LABEL', the
    LABEL alone in peers);
    throughput[group][label] = items/s; speedup[group] = (reel mode, {peer label: torch ms / reel ms});
    common: what every row shares (precision, micro-batch), for the titles."""
    precs = sorted({e["prec"] for e in joined})
    bs = sorted({str(e.get("B", "default")) for e in joined})
    groups, modes, peers = [], [], []
    throughput, fastest, peer_ms = {}, {}, {}
    for e in joined:
        g = group_key(e, len(precs) > 1, len(bs) > 1)
        if g not in groups:
            groups.append(g)
        if e["mode"] not in modes:
            modes.append(e["mode"])
        row = throughput.setdefault(g, {})
        row["reel " + e["mode"]] = e["reel_items_per_s"]
        if g not in fastest or e["reel_ms"] < fastest[g][1]:
            fastest[g] = (e["mode"], e["reel_ms"])
        for label, p in e["peers"].items():
            if label not in peers:
                peers.append(label)
            row["torch " + label] = p["items_per_s"]
            peer_ms.setdefault(g, {})[label] = p["ms"]
    series = ["reel " + m for m in modes] + ["torch " + p for p in peers]
    speedup = {g: (fastest[g][0], {p: ms / fastest[g][1] for p, ms in peer_ms.get(g, {}).items()}) for g in groups}
    common = {}
    if len(precs) == 1:
        common["prec"] = precs[0]
    if len(bs) == 1 and bs[0] != "default":
        common["B"] = bs[0]
    return groups, series, peers, throughput, speedup, common


def note_of(joined, note):
    if note:
        return note
    dates = sorted({str(e["date"]) for e in joined if e.get("date")})
    builds = sorted({str(e["build"]) for e in joined if e.get("build")})
    parts = dates + ["build " + b for b in builds]
    return ", ".join(parts)


def fmt(v, digits):
    return MISSING if v is None else f"{v:.{digits}f}"


def write_dat(path, comment, names, rows):
    with open(path, "w") as f:
        for line in comment:
            f.write("# " + line + "\n")
        f.write(" ".join(names) + "\n")
        for row in rows:
            f.write(" ".join(row) + "\n")


def terminal():
    """pngcairo where gnuplot has it (anti-aliased), the libgd png terminal otherwise; None without gnuplot."""
    if shutil.which("gnuplot") is None:
        print("figures: no gnuplot here: .dat files only, no pictures", file=sys.stderr)
        return None
    out = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True, text=True)
    text = out.stdout + out.stderr
    if "pngcairo" in text:
        return "pngcairo size 1400,700 noenhanced font 'DejaVu Sans,11'"
    return "png size 1400,700 noenhanced"


def quote(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


PEER_COLOURS = ["#c0392b", "#e67e22", "#27ae60", "#8e44ad", "#7f8c8d", "#b7950b"]


def colours(series):
    """reel's modes in blues, the peer configurations in other colours, each keeping its colour in both pictures."""
    reel = [s for s in series if s.startswith("reel ")]
    blues = ["#1f4e9c", "#4a7fd0", "#8fb6ea", "#bcd3f3"]
    out = {}
    for i, s in enumerate(reel):
        out[s] = blues[i % len(blues)]
    for i, s in enumerate(s for s in series if not s.startswith("reel ")):
        out[s] = PEER_COLOURS[i % len(PEER_COLOURS)]
    return out


def bars(dat, series, colour, label_fmt, label_y, label_fn="sprintf"):
    """plot clauses: one set of boxes per series (column 2 onwards), beside each other in a group, and their
    value labels. The group width is 0.8; x = the group's row number."""
    n = len(series)
    width = 0.8 / n
    clauses, labels = [], []
    for j, s in enumerate(series):
        c = j + 2
        off = (j - (n - 1) / 2) * width
        x = f"($0{off:+.4f})"
        clauses.append(f"{quote(dat)} using {x}:{c} with boxes "
                       f"lc rgb {quote(colour[s])} title {quote(s)}")
        fmt_arg = quote(label_fmt) + ", " if label_fmt else ""
        labels.append(f"{quote(dat)} using {x}:({label_y.format(c=c)}):({label_fn}({fmt_arg}${c})) "
                      f"with labels rotate by 90 left font ',9' boxed notitle")
    return clauses, labels


def xtics(groups):
    """The groups' names under their bars' centres (x = 0, 1, ...)."""
    return "set xtics (" + ", ".join(f"{quote(g)} {i}" for i, g in enumerate(groups)) + ") nomirror scale 0"


def gnuplot(term, script):
    """Runs the script under the terminal; nothing without one (no gnuplot here)."""
    if term is None:
        return
    script = f"set terminal {term}\n" + script
    out = subprocess.run(["gnuplot"], input=script, capture_output=True, text=True)
    if out.returncode != 0 or "error" in out.stderr.lower():
        sys.exit("gnuplot failed:\n" + out.stderr + "\n--- script:\n" + script)


def write_figures(joined, outdir, note="", source=""):
    """Writes throughput.{dat,png} and speedup.{dat,png} into outdir; returns their paths."""
    if not joined:
        sys.exit("figures: no joined rows")
    os.makedirs(outdir, exist_ok=True)
    groups, series, peers, throughput, speedup, common = tables(joined)
    note = note_of(joined, note)
    setting = ", ".join(filter(None, [common.get("prec"), "micro-batch " + common["B"] if "B" in common else ""]))
    suffix = "".join(f" — {t}" for t in [setting, note] if t)
    src = f" from {source}" if source else ""
    many_bs = len({str(e.get("B", "default")) for e in joined}) > 1
    xlabel = "model" + ("" if "prec" in common else " / precision") + (" / micro-batch" if many_bs else "")
    colour = colours(series)
    term = terminal()

    tdat = os.path.join(outdir, "throughput.dat")
    write_dat(tdat, [f"bench/figures.py: training-step throughput, items/s (higher is better){src}{suffix}",
                     "columns: group, then " + "; ".join(f"{column_name(s)} = {s}" for s in series),
                     f'"{MISSING}": no figure for that configuration (not run, or it failed)'],
              ["group"] + [column_name(s) for s in series],
              [[g] + [fmt(throughput[g].get(s), 0) for s in series] for g in groups])
    top = max(v for row in throughput.values() for v in row.values())
    low = min(v for row in throughput.values() for v in row.values())
    boxes, labels = bars(tdat, series, colour, "", "${c}*1.12", "si")
    tpng = os.path.join(outdir, "throughput.png")
    gnuplot(term, f"""set output {quote(tpng)}
set datafile columnheaders
set datafile missing {quote(MISSING)}
set title {quote("Training-step throughput, reel beside PyTorch (items/s, higher is better; log scale)" + suffix)}
set ylabel "items/s (images or tokens per second)"
set xlabel {quote(xlabel)}
set logscale y
si(x) = x >= 1e6 ? sprintf(x >= 1e7 ? "%.1fM" : "%.2fM", x / 1e6) : x >= 1e3 ? sprintf(x >= 1e5 ? "%.0fk" : x >= 1e4 ? "%.1fk" : "%.2fk", x / 1e3) : sprintf("%.0f", x)
set yrange [{low / 3:g}:{top * 12:g}]
set format y "%.0s%c"
set xrange [-0.6:{len(groups) - 0.4}]
set boxwidth {0.8 / len(series):.4f}
set style fill solid 0.9 border lc rgb "#333333"
set grid ytics lc rgb "#dddddd"
{xtics(groups)}
set key top left horizontal maxcols 3 box opaque
set style textbox opaque noborder margins 1,1
plot {", ".join(boxes + labels)}
""")

    sdat = os.path.join(outdir, "speedup.dat")
    speer = ["torch " + p for p in peers]
    sgroups = [g for g in groups if speedup[g][1]]  # those with at least one peer figure
    write_dat(sdat, [f"bench/figures.py: torch ms / reel ms per step (above 1: reel is faster){src}{suffix}",
                     "reel_mode: reel's fastest mode of the group, whose step is the denominator",
                     "columns before reel_mode: " + "; ".join(f"{column_name(s)} = {s}" for s in speer),
                     f'"{MISSING}": no figure for that configuration (not run, or it failed)'],
              ["group"] + [column_name(s) for s in speer] + ["reel_mode"],
              [[g] + [fmt(speedup[g][1].get(p), 3) for p in peers] + [speedup[g][0]] for g in sgroups])
    ratios = [r for g in sgroups for r in speedup[g][1].values()]
    modes = sorted({speedup[g][0] for g in sgroups})
    which = f"reel {modes[0]}" if len(modes) == 1 else "reel's fastest mode per model"
    spng = os.path.join(outdir, "speedup.png")
    if ratios:
        # a bar below 1x has its value just above the 1x line, not across it
        boxes, labels = bars(sdat, speer, colour, "%.2fx", "(${c} < 1 ? 1 : ${c}) + " + f"{max(ratios) * 0.02:g}")
        ymax = max(max(ratios) * 1.25, 1.3)
        gnuplot(term, f"""set output {quote(spng)}
set datafile columnheaders
set datafile missing {quote(MISSING)}
set title {quote(f"Speedup of {which} over each PyTorch configuration (torch ms / reel ms; above 1: reel is faster)" + suffix)}
set ylabel "torch ms per step / reel ms per step"
set xlabel {quote(xlabel)}
set yrange [0:{ymax:g}]
set xrange [-0.6:{len(sgroups) - 0.4}]
set boxwidth {0.8 / len(speer):.4f}
set style fill solid 0.9 border lc rgb "#333333"
set grid ytics lc rgb "#dddddd"
{xtics(sgroups)}
set key top left horizontal box opaque
set format y "%gx"
set ytics add ("1x" 1)
set style textbox opaque noborder margins 1,1
plot {", ".join(boxes)}, 1 with lines dt 2 lw 2 lc rgb "#000000" title "1x: as fast as reel", \\
     {", ".join(labels)}
""")
    return tdat, tpng, sdat, spng


# ---- self-test: a tiny sample through join.py and through the joined.json, numbers checked ----

SAMPLE_REEL = [
    {"engine": "reel", "model": "cnn-small", "mode": "reduce-overhead", "prec": "bf16", "dev": "cuda:0",
     "step_ms_median": 2.0, "items_per_s": 64000, "peak_mib": 60.0, "kernels_per_step": 100, "B": "default"},
    {"engine": "reel", "model": "cnn-small", "mode": "max-autotune", "prec": "bf16", "dev": "cuda:0",
     "step_ms_median": 2.5, "items_per_s": 51200, "peak_mib": 60.0, "kernels_per_step": 100, "B": "default"},
    {"engine": "reel", "model": "gpt-tiny", "mode": "reduce-overhead", "prec": "bf16", "dev": "cuda:0",
     "step_ms_median": 4.0, "items_per_s": 1000000, "peak_mib": 150.0, "kernels_per_step": 400, "B": "default"},
]
SAMPLE_PEERS = {
    "torch_default.jsonl": [
        {"engine": "torch", "model": "cnn-small", "mode": "default", "prec": "bf16", "dev": "cuda",
         "step_ms_median": 10.0, "items_per_s": 12800, "peak_mib": 80.0},
        {"engine": "torch", "model": "gpt-tiny", "mode": "default", "prec": "bf16", "dev": "cuda",
         "error": "compile timed out"}],
    "torch_graphed.jsonl": [
        {"engine": "torch", "model": "cnn-small", "mode": "graphed-whole-step", "attn": "sdpa", "prec": "bf16",
         "dev": "cuda", "step_ms_median": 3.0, "items_per_s": 42667, "peak_mib": 130.0},
        {"engine": "torch", "model": "gpt-tiny", "mode": "graphed-whole-step", "attn": "sdpa", "prec": "bf16",
         "dev": "cuda", "step_ms_median": 3.2, "items_per_s": 1250000, "peak_mib": 400.0}],
}


def read_dat(path):
    rows = [line.split() for line in open(path) if line.strip() and not line.startswith("#")]
    head = rows[0]
    return {r[0]: dict(zip(head[1:], r[1:])) for r in rows[1:]}


def self_test():
    here = os.path.dirname(os.path.abspath(__file__))
    tmp = tempfile.mkdtemp(prefix="figures_test_")
    try:
        with open(os.path.join(tmp, "reel.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in SAMPLE_REEL)
        for name, rows in SAMPLE_PEERS.items():
            with open(os.path.join(tmp, name), "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        figs = os.path.join(tmp, "figs")
        out = subprocess.run([sys.executable, os.path.join(here, "join.py"), os.path.join(tmp, "reel.jsonl"),
                              os.path.join(tmp, "torch_default.jsonl"), os.path.join(tmp, "torch_graphed.jsonl"),
                              "--figures", figs, "--note", "2026-01-01, build abc1234"],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("| model |"), "join.py's table still goes to stdout: " + out.stdout[:200]
        again = os.path.join(tmp, "again")  # the same pictures from the joined.json join.py wrote
        with open(os.path.join(tmp, "joined.json")) as f:
            write_figures(json.load(f), again, "2026-01-01, build abc1234")
        for d in (figs, again):
            for name in ("throughput.png", "speedup.png"):
                with open(os.path.join(d, name), "rb") as f:
                    head = f.read(8)
                assert head == b"\x89PNG\r\n\x1a\n", f"{d}/{name} is not a PNG"
                assert os.path.getsize(os.path.join(d, name)) > 5000, f"{d}/{name} is nearly empty"
            t = read_dat(os.path.join(d, "throughput.dat"))
            assert list(t) == ["cnn-small", "gpt-tiny"], t
            assert t["cnn-small"] == {"reel_reduce-overhead": "64000", "reel_max-autotune": "51200",
                                      "torch_default": "12800", "torch_graphed-whole-step_sdpa": "42667"}, t
            assert t["gpt-tiny"] == {"reel_reduce-overhead": "1000000", "reel_max-autotune": MISSING,
                                     "torch_default": MISSING, "torch_graphed-whole-step_sdpa": "1250000"}, t
            s = read_dat(os.path.join(d, "speedup.dat"))
            # torch ms / reel ms, reel's fastest mode (reduce-overhead: 2.0 ms) for cnn-small
            assert s["cnn-small"] == {"torch_default": "5.000", "torch_graphed-whole-step_sdpa": "1.500",
                                      "reel_mode": "reduce-overhead"}, s
            assert s["gpt-tiny"] == {"torch_default": MISSING, "torch_graphed-whole-step_sdpa": "0.800",
                                     "reel_mode": "reduce-overhead"}, s
            assert "2026-01-01, build abc1234" in open(os.path.join(d, "speedup.dat")).readline()
        print(f"figures self-test passed (pictures in {tmp}/figs: kept for a look)" if "--keep" in sys.argv
              else "figures self-test passed")
    finally:
        if "--keep" not in sys.argv:
            shutil.rmtree(tmp)


def main(argv):
    if "--self-test" in argv:
        self_test()
        return
    note = ""
    if "--note" in argv:
        i = argv.index("--note")
        note = argv[i + 1]
        del argv[i:i + 2]
    if len(argv) != 3:
        sys.exit(__doc__)
    with open(argv[1]) as f:
        joined = json.load(f)
    for path in write_figures(joined, argv[2], note, source=os.path.basename(argv[1])):
        print(path)


if __name__ == "__main__":
    main(list(sys.argv))
