#!/usr/bin/env python3
"""Converts a PyTorch peer model's state_dict into a reel state_dict file (nn/state_dict.h), so that
`reel train --model NAME --init-from FILE` loads it with no renaming.

The peer's models (peer/torch_anchor.py, imported from the path given) carry the names reel's models
do (torchvision's, timm's, Ultralytics' and the peer GPT's), so each tensor is written under its own
key, every one of them: BatchNorm's num_batches_tracked too (a 0-dim int64, as reel's BatchNorm keeps
it), so the file has exactly the entries of the peer's state_dict.

  python3 tools/torch_to_reel.py --peer PATH/torch_anchor.py --model resnet18-cifar --out resnet.reelsd [--seed 0]
  python3 tools/torch_to_reel.py --peer PATH/torch_anchor.py --model vit-tiny --list     # keys and shapes only
  python3 tools/torch_to_reel.py --roundtrip FILE     # parse a reel file and write it back: the same bytes

The file format (all integers little-endian, entries in the peer's state_dict order):
  magic    8 bytes  "REELSD01"
  count    u64      number of entries
  entry    name_len u32, name (UTF-8), dtype u8 (0 f32, 1 f64, 2 f16, 3 bf16, 4 i64), ndim u32,
           shape i64 x ndim, nbytes u64 (= numel * element size), data (row-major, little-endian)
  checksum u64      FNV-1a 64 of every byte before it
Only --peer needs PyTorch; writing, reading and --roundtrip use the standard library alone.
"""
import argparse
import ctypes
import importlib.util
import struct
import sys

MAGIC = b"REELSD01"
DTYPE_CODES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int64": 4}
ELEMENT_SIZE = {0: 4, 1: 8, 2: 2, 3: 2, 4: 8}

# reel's model names -> how torch_anchor.py builds them
IMAGE_MODELS = ("cnn-small", "resnet18-cifar", "vit-tiny", "yolov8n-cls")
GPT_CONFIGS = {"gpt-tiny": dict(d=256, h=4, L=4, T=128), "gpt-small": dict(d=512, h=8, L=8, T=256)}


def fnv1a64(data, h=0xcbf29ce484222325):
    """FNV-1a 64 (offset basis 0xcbf29ce484222325, prime 0x100000001b3), as nn::fnv1a64."""
    prime, mask = 0x100000001b3, 0xFFFFFFFFFFFFFFFF
    for b in data:
        h = ((h ^ b) * prime) & mask
    return h


def encode(entries):
    """entries: (name, dtype_code, shape, data bytes) in file order -> the file's bytes."""
    parts = [MAGIC, struct.pack("<Q", len(entries))]
    for name, code, shape, data in entries:
        numel = 1
        for s in shape:
            numel *= s
        if len(data) != numel * ELEMENT_SIZE[code]:
            raise ValueError(f"torch_to_reel: '{name}' holds {len(data)} bytes, shape {tuple(shape)} needs "
                             f"{numel * ELEMENT_SIZE[code]}")
        raw = name.encode("utf-8")
        parts += [struct.pack("<I", len(raw)), raw, struct.pack("<BI", code, len(shape)),
                  struct.pack(f"<{len(shape)}q", *shape), struct.pack("<Q", len(data)), data]
    body = b"".join(parts)
    return body + struct.pack("<Q", fnv1a64(body))


def decode(blob, path="<bytes>"):
    """A reel state_dict file's bytes -> entries, checking magic, structure and checksum."""
    if blob[:8] != MAGIC:
        raise ValueError(f"torch_to_reel: '{path}' is not a reel state_dict file (bad magic)")
    body, (stored,) = blob[:-8], struct.unpack("<Q", blob[-8:])
    if fnv1a64(body) != stored:
        raise ValueError(f"torch_to_reel: '{path}' failed its checksum")
    (count,), pos, entries = struct.unpack_from("<Q", body, 8), 16, []
    for _ in range(count):
        (n,) = struct.unpack_from("<I", body, pos); pos += 4
        name = body[pos:pos + n].decode("utf-8"); pos += n
        code, ndim = struct.unpack_from("<BI", body, pos); pos += 5
        shape = list(struct.unpack_from(f"<{ndim}q", body, pos)); pos += 8 * ndim
        (nbytes,) = struct.unpack_from("<Q", body, pos); pos += 8
        entries.append((name, code, shape, body[pos:pos + nbytes])); pos += nbytes
    if pos != len(body):
        raise ValueError(f"torch_to_reel: '{path}' has {len(body) - pos} bytes after its last entry")
    return entries


def load_peer(path):
    spec = importlib.util.spec_from_file_location("torch_anchor", path)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    return peer


def build_peer_model(peer, name):
    if name in IMAGE_MODELS:
        return peer.IMAGE_MODELS[name][0]()
    if name in GPT_CONFIGS:
        return peer.GPT(**GPT_CONFIGS[name])
    raise SystemExit(f"torch_to_reel: unknown model {name} (expected {', '.join(IMAGE_MODELS + tuple(GPT_CONFIGS))})")


def tensor_entries(state_dict):
    """A torch state_dict -> entries, one per key, in its order."""
    entries = []
    for key, t in state_dict.items():
        dtype = str(t.dtype).replace("torch.", "")
        if dtype not in DTYPE_CODES:
            raise SystemExit(f"torch_to_reel: '{key}' is {dtype}; reel's files hold {', '.join(DTYPE_CODES)}")
        c = t.detach().cpu().contiguous()
        data = ctypes.string_at(c.data_ptr(), c.numel() * c.element_size()) if c.numel() else b""
        entries.append((key, DTYPE_CODES[dtype], list(c.shape), data))
    return entries


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", help="path of peer/torch_anchor.py")
    ap.add_argument("--model", help="reel's name: " + ", ".join(IMAGE_MODELS + tuple(GPT_CONFIGS)))
    ap.add_argument("--out", help="reel state_dict file to write")
    ap.add_argument("--seed", type=int, default=0, help="torch.manual_seed before building (default 0, the peer's)")
    ap.add_argument("--list", action="store_true", help="print the peer model's keys and shapes, write nothing")
    ap.add_argument("--roundtrip", metavar="FILE", help="parse a reel file and re-encode it (format self-check)")
    a = ap.parse_args()

    if a.roundtrip:
        blob = open(a.roundtrip, "rb").read()
        entries = decode(blob, a.roundtrip)
        same = encode(entries) == blob
        print(f"{a.roundtrip}: {len(entries)} tensors, {sum(len(e[3]) for e in entries)} bytes of data; "
              f"re-encoded {'to the same bytes' if same else 'DIFFERENTLY'}")
        return 0 if same else 1

    if not (a.peer and a.model and (a.out or a.list)):
        ap.error("--peer, --model and --out (or --list) are needed")
    import torch  # only here: the format helpers above run without PyTorch
    torch.manual_seed(a.seed)
    model = build_peer_model(load_peer(a.peer), a.model)
    entries = tensor_entries(model.state_dict())
    params = sum(p.numel() for p in model.parameters())
    if a.list:
        for name, code, shape, _ in entries:
            print(f"{name} {[k for k, v in DTYPE_CODES.items() if v == code][0]} {tuple(shape)}")
        print(f"{a.model}: {len(entries)} tensors, {params} parameters")
        return 0
    blob = encode(entries)
    assert decode(blob, a.out) == entries
    with open(a.out, "wb") as f:
        f.write(blob)
    counters = sum(name.endswith("num_batches_tracked") for name, *_ in entries)
    print(f"{a.model}: wrote {len(entries)} tensors ({params} parameters) to {a.out}, "
          f"{counters} of them BatchNorm's num_batches_tracked")
    print(f"check: reel train --model {a.model} --init-from {a.out} ...  (prints 'init: {len(entries)} tensors loaded')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
