#!/usr/bin/env bash
# Fetches the cuDNN frontend's headers (header-only C++ over cuDNN's graph API; NVIDIA publishes them
# in PyPI's nvidia-cudnn-frontend wheel, under include/) into DEST/include, and writes DEST/flags: the
# nvcc flags that build kernels/cuda/attention_cudnn.cu against them, or nothing when they could not
# be fetched (no pip, no network): that file then builds without cuDNN's fused attention, and the
# attention op runs reel's own kernels. Called by the Makefile; a second call finds DEST/flags and
# does nothing. Usage: tools/fetch_cudnn_frontend.sh DEST
set -uo pipefail
dest=${1:?usage: fetch_cudnn_frontend.sh DEST}
version=1.32.0  # pinned: the build is the same on every machine
mkdir -p "$dest"
if [ -f "$dest/include/cudnn_frontend.h" ] && grep -q "$version" "$dest/version" 2>/dev/null; then
  echo "-DREEL_CUDNN_FRONTEND -isystem $dest/include" > "$dest/flags"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok=0
for py in python3 python; do
  command -v "$py" >/dev/null 2>&1 || continue
  if "$py" -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "nvidia-cudnn-frontend==$version" >/dev/null 2>&1 &&
     "$py" - "$tmp" "$dest" <<'EOF'
import glob, os, shutil, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
out = os.path.join(tmp, "unpacked")
with zipfile.ZipFile(wheel) as z:
    z.extractall(out, [n for n in z.namelist() if n.startswith("include/")])
target = os.path.join(dest, "include")
shutil.rmtree(target, ignore_errors=True)
shutil.move(os.path.join(out, "include"), target)
EOF
  then ok=1; break; fi
done
if [ $ok -eq 1 ] && [ -f "$dest/include/cudnn_frontend.h" ]; then
  echo "$version" > "$dest/version"
  echo "-DREEL_CUDNN_FRONTEND -isystem $dest/include" > "$dest/flags"
  echo "fetch_cudnn_frontend: cuDNN frontend $version headers in $dest/include"
else
  : > "$dest/flags"
  echo "fetch_cudnn_frontend: could not fetch nvidia-cudnn-frontend==$version; attention runs reel's own CUDA kernels only"
fi
exit 0
