#!/usr/bin/env bash
# reel and the PyTorch peer, side by side in one run on the GPU machine (issue 5's joined table).
#   bench/side_by_side.sh [models] [precisions]     (logs and JSON lines under $OUT, or ./bench-out)
# Needs the peer scripts copied into .peer/ (cp -r ../shared/peer .peer) and a reel binary
# ($REEL, default .gpu/reel from `make gpu-bundle`). Prints the joined table last.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench-out}"
mkdir -p "$out"
models="${1:-cnn-small,gpt-tiny,gpt-small}"
precs="${2:-fp32,bf16,fp16}"
reel="${REEL:-.gpu/reel}"
"$reel" bench --models "$models" --precisions "$precs" --json "$out/reel.jsonl" > "$out/reel.txt" 2>&1
python3 .peer/torch_anchor.py cuda "$models" eager,default "$precs" > "$out/torch_anchor.jsonl" 2> "$out/torch_anchor.err"
CG_TREES=0 python3 .peer/torch_anchor.py cuda "$models" reduce-overhead "$precs" \
  > "$out/torch_trees_off.jsonl" 2> "$out/torch_trees_off.err"
ATTN=sdpa python3 .peer/torch_graphed.py "$models" bf16 > "$out/torch_graphed.jsonl" 2> "$out/torch_graphed.err"
CG_TREES_FILE=torch_trees_off.jsonl python3 bench/join.py "$out/reel.jsonl" "$out/torch_anchor.jsonl" \
  "$out/torch_trees_off.jsonl" "$out/torch_graphed.jsonl" | tee "$out/joined.md"
