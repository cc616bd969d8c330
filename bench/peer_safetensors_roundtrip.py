#!/usr/bin/env python3
"""Round trips of every benchmark model's weights between reel and PyTorch through safetensors files.

For each model M:
  1. reel writes its freshly built weights:  $REEL weights --model M --save a.safetensors
  2. PyTorch builds the peer's model (torch_anchor.py in PEER_DIR, by reel's name as
     tools/torch_to_reel.py builds it), loads a.safetensors with load_state_dict(strict=True) and
     checks that every tensor of its state_dict equals the file's, bit for bit (dtype, shape, bytes);
  3. PyTorch writes its state_dict to b.safetensors (save_file: its own layout, data sorted by dtype
     then name, unlike reel's module order);
  4. reel loads b and compares with a:  $REEL weights --model M --init-from b.safetensors --compare a.safetensors
     which must print "same bits: K tensors".

    REEL=build/reel python3 bench/peer_safetensors_roundtrip.py [PEER_DIR] [MODELS] > roundtrip.jsonl
PEER_DIR: the folder holding torch_anchor.py (default .peer); MODELS: comma-separated (default: cnn-small,
resnet18-cifar, vit-tiny, yolov8n-cls, gpt-tiny, gpt-small). One JSON line per model: ok true with the
tensor count and what reel printed, or ok false with the error; exit code 1 if any model failed.
The files are read and written by the `safetensors` package (safetensors.torch.load_file / save_file)
where it is installed; otherwise by the small reader and writer below (json + struct, laid out as the
package lays files out), and each line's "io" says which. Runs on the CPU; needs PyTorch, not a GPU.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import torch

# The peer's models built by reel's names, as tools/torch_to_reel.py builds them.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from torch_to_reel import GPT_CONFIGS, IMAGE_MODELS, build_peer_model, load_peer  # noqa: E402

MODELS = list(IMAGE_MODELS) + list(GPT_CONFIGS)

DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64}
NAMES = {v: k for k, v in DTYPES.items()}
# The package's data order: by dtype, largest alignment first (its enum, descending), then by name.
DATA_ORDER = ["I64", "F64", "F32", "BF16", "F16"]


def load_file_by_hand(path):
    """A safetensors file -> {name: tensor}, in the header's order."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        flat = (torch.frombuffer(bytearray(data[begin:end]), dtype=dtype) if end > begin
                else torch.empty(0, dtype=dtype))
        out[name] = flat.reshape(info["shape"])
    return out


def save_file_by_hand(tensors, path):
    """{name: tensor} -> a safetensors file laid out as the package writes it (compact JSON, padded to 8)."""
    items = sorted(tensors.items(), key=lambda kv: (DATA_ORDER.index(NAMES[kv[1].dtype]), kv[0]))
    header, chunks, pos = {}, [], 0
    for name, t in items:
        raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [pos, pos + len(raw)]}
        chunks.append(raw)
        pos += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


try:
    import safetensors
    from safetensors.torch import load_file, save_file
    IO = f"safetensors {getattr(safetensors, '__version__', '?')}"
except ImportError:
    load_file, save_file = load_file_by_hand, save_file_by_hand
    IO = "by hand (json + struct): the safetensors package is not installed"


def same_bits(x, y):
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    as_bytes = lambda t: t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return torch.equal(as_bytes(x), as_bytes(y))


def reel(*args):
    """Runs `$REEL args`; its output, or RuntimeError with its last line."""
    r = subprocess.run([os.environ.get("REEL", "build/reel"), *args], capture_output=True, text=True)
    if r.returncode != 0:
        lines = (r.stderr or r.stdout).strip().splitlines()
        raise RuntimeError(f"reel {' '.join(args)}: exit {r.returncode}: {lines[-1] if lines else ''}")
    return r.stdout


def roundtrip(peer, name, work):
    a, b = os.path.join(work, f"{name}.a.safetensors"), os.path.join(work, f"{name}.b.safetensors")
    reel("weights", "--model", name, "--save", a)
    torch.manual_seed(0)
    model = build_peer_model(peer, name)
    tensors = load_file(a)
    model.load_state_dict(tensors, strict=True)  # raises listing missing/unexpected keys and shape mismatches
    state = model.state_dict()
    differ = [k for k, v in state.items() if not same_bits(v, tensors[k])]
    if differ:
        raise RuntimeError(f"{len(differ)} of {len(state)} tensors differ after PyTorch's load: {', '.join(differ[:8])}")
    save_file({k: v.contiguous() for k, v in state.items()}, b)
    out = reel("weights", "--model", name, "--init-from", b, "--compare", a)
    same = [line for line in out.splitlines() if line.startswith("same bits")]
    if not same:
        raise RuntimeError(f"reel did not report same bits: {out.strip()[-300:]}")
    return dict(model=name, ok=True, tensors=len(state), parameters=sum(p.numel() for p in model.parameters()),
                a_bytes=os.path.getsize(a), b_bytes=os.path.getsize(b), reel=same[0], io=IO)


def main(argv):
    peer_dir = argv[1] if len(argv) > 1 else ".peer"
    models = argv[2].split(",") if len(argv) > 2 else MODELS
    peer = load_peer(os.path.join(peer_dir, "torch_anchor.py"))
    work = tempfile.mkdtemp(prefix="reel_safetensors_")
    failed = 0
    try:
        for name in models:
            try:
                line = roundtrip(peer, name, work)
            except Exception as e:  # one model's failure is its line; the others still run
                failed += 1
                line = dict(model=name, ok=False, error=repr(e)[:600], io=IO)
            print(json.dumps(line), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
