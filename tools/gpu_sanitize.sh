#!/usr/bin/env bash
# compute-sanitizer over reel's test suite on a GPU machine, in gtest shards run side by side (one
# process each: memcheck slows the compiled-model tests enough that the whole suite does not fit in
# one 10-minute run). Every shard's tool summary, test counts and first reports go to one summary;
# the logs into one tarball. A shard cut by the time limit shows how many tests it finished.
#   tools/gpu_sanitize.sh TOOL SHARDS "INDICES" LIMIT_S [gtest filter] [extra compute-sanitizer options]
#   e.g. tools/gpu_sanitize.sh memcheck 16 "0 1 2 3" 540
#        tools/gpu_sanitize.sh racecheck 1 "0" 300 'AttentionCuda.*'
# BIN (default .gpu, where make gpu-bundle puts them) holds reel_tests and reel; logs under $OUT (or ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
tool=$1 shards=$2 indices=$3 limit=$4 filter=${5:-*} extra=${6:-}
bin=${BIN:-.gpu} out=${OUT:-gpu-out}
logs="$out/sanitize_logs_$1"; mkdir -p "$logs"
export LD_LIBRARY_PATH="$PWD/$bin:${LD_LIBRARY_PATH:-}" REEL_BIN="$PWD/$bin/reel"
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
t0=$(date +%s)
for i in $indices; do
  # shellcheck disable=SC2086
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "$limit" "$cs" --tool "$tool" $extra --print-limit 6 \
    "$bin/reel_tests" --gtest_filter="$filter" > "$logs/${tool}_${shards}shard$i.log" 2>&1 &
done
wait
summary="$out/${tool}_summary.txt"
echo "$tool over shards {$indices} of $shards, filter '$filter', in $(( $(date +%s) - t0 )) s (limit $limit s)" > "$summary"
for f in "$logs/${tool}_${shards}"shard*.log; do
  echo "== $(basename "$f"): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$f" | sort | uniq -c | tr -s ' ' | tr '\n' ';')" \
       "$(grep -E '^\[  (PASSED|FAILED) +\] [0-9]+ tests?\.' "$f" | tr '\n' ' ')" \
       "finished $(grep -cE '^\[ +(OK|SKIPPED|FAILED) +\] .* \([0-9]+ ms\)$' "$f") of $(grep -m1 -oE 'Running [0-9]+ tests?' "$f" | grep -oE '[0-9]+')" >> "$summary"
  grep -m3 -E "^\[  FAILED  \]" "$f" >> "$summary"
  # Reports grouped by kind and kernel (offsets dropped), most frequent first.
  grep -E "^========= (Invalid|Uninit|Error|Race|Warning|Internal)" "$f" | sed -E 's/\+0x[0-9a-f]+//' | sort | uniq -c |
    sort -rn | head -5 | cut -c1-300 >> "$summary"
done
tar -C "$out" -cJf "$out/${tool}_logs.tar.xz" "sanitize_logs_$tool" && rm -rf "$logs"
cat "$summary"
