"""Sums an Nsight Compute CSV (`ncu --csv --metrics gpu__time_duration.sum`) by kernel: the device
time of each kernel name and of each family (convolutions, GEMMs, norms, copies, elementwise, ...),
with counts, so that two programs' steps (reel's and the peer's) can be laid side by side.
    python3 bench/ncu_summary.py reel.csv [label] [--top N]"""
import csv
import re
import sys
from collections import defaultdict

UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}

# First match wins: (family, pattern over the kernel's name).
# Attention first: cuDNN's fused attention kernels are named cudnn_..._sdpa_..._fprop/bprop_..., and its
# deterministic backward's helpers cudnn::matmul_dq and cudnn::compute_dot_do_o, which the convolution
# pattern would otherwise take.
FAMILIES = [
    ("attention", r"attention|flash|fmha|sdpa|matmul_dq|dot_do_o"),
    ("conv (cuDNN)", r"conv|dgrad|wgrad|fprop|implicit|xmma|cudnn|nchwToNhwc|nhwcToNchw|winograd|fft"),
    ("gemm", r"gemm|cutlass|cublas|matmul|sm90_|nvjet"),
    ("batch/group norm", r"batch_norm|group_norm|bn_|batchnorm"),
    ("layer norm", r"layer_norm|layernorm"),
    ("optimizer", r"adam|multi_tensor|optim|clip|global_norm|unscale|foreach"),
    ("reduce", r"reduce|sum_|mean|bias_grad|column"),
    ("elementwise", r"map_(contiguous|packed|strided)_kernel"),  # reel's unfused elementwise ops
    ("copy / cast", r"copy|cast|convert|transpose|permute|contiguous"),
    ("fused elementwise", r"fused|reel_jit|triton"),
    ("elementwise", r"elementwise|vectorized|unrolled|relu|silu|gelu|add|mul"),
]


def family(name):
    low = name.lower()
    for fam, pat in FAMILIES:
        if re.search(pat, low):
            return fam
    return "other"


def read(path):
    times = []  # (name, us)
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(line for line in f if line.startswith('"'))]
    head = rows[0]
    idx = {k: head.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")}
    for r in rows[1:]:
        if r[idx["Metric Name"]] != "gpu__time_duration.sum":
            continue
        v = float(r[idx["Metric Value"]].replace(",", ""))
        times.append((r[idx["Kernel Name"]], v * UNITS.get(r[idx["Metric Unit"]], 1.0)))
    return times


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 15
    if "--top" in sys.argv:
        args.remove(str(top))
    path, label = args[0], args[1] if len(args) > 1 else args[0]
    times = read(path)
    total = sum(t for _, t in times)
    fam, names = defaultdict(lambda: [0, 0.0]), defaultdict(lambda: [0, 0.0])
    for n, t in times:
        for d, key in ((fam, family(n)), (names, n[:90])):
            d[key][0] += 1
            d[key][1] += t
    print(f"{label}: {len(times)} kernels, {total / 1e3:.3f} ms of kernel time (sum of durations, no gaps)")
    print(f"  {'family':<22}{'kernels':>8}{'ms':>9}{'share':>8}")
    for k, (c, t) in sorted(fam.items(), key=lambda kv: -kv[1][1]):
        print(f"  {k:<22}{c:>8}{t / 1e3:>9.3f}{100 * t / total:>7.1f}%")
    print(f"  {'kernel':<92}{'count':>6}{'ms':>9}{'us/call':>9}")
    for k, (c, t) in sorted(names.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {k:<92}{c:>6}{t / 1e3:>9.3f}{t / c:>9.2f}")


if __name__ == "__main__":
    main()
