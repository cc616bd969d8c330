#!/usr/bin/env bash
# compute-sanitizer over reel's test suite on a GPU machine, in shards run side by side (one process
# each: memcheck slows the compiled-model tests enough that the whole suite does not fit in one
# 10-minute run). Every shard's tool summary, test counts and first reports go to one summary; the
# logs into one tarball. A shard cut by the time limit shows how many tests it finished and the test
# it was in.
#   tools/gpu_sanitize.sh TOOL SHARDS "INDICES" LIMIT_S [gtest filter] [extra compute-sanitizer options]
#   e.g. tools/gpu_sanitize.sh memcheck 16 "0 1 2 3" 540
#        tools/gpu_sanitize.sh racecheck 1 "0" 300 'AttentionCuda.*'
# Shard k holds the tests whose position in the full test list (as this machine lists it) is k modulo
# SHARDS, as GTEST_TOTAL_SHARDS deals them; the filter then picks among them. The shards are computed
# here rather than by gtest because a negative filter given to gtest would re-deal the shards, and a
# shard of one run would no longer be the same tests as that shard of another.
# SKIP: whole test names (space-separated) left out of every shard, for the few whole-model tests that
# take longer than a call's limit under a sanitizer; run them alone if needed.
# BIN (default .gpu, where make gpu-bundle puts them) holds reel_tests and reel; logs under $OUT (or ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
tool=$1 shards=$2 indices=$3 limit=$4 filter=${5:-*} extra=${6:-}
bin=${BIN:-.gpu} out=${OUT:-gpu-out}
logs="$out/sanitize_logs_$1"; mkdir -p "$logs"
export LD_LIBRARY_PATH="$PWD/$bin:${LD_LIBRARY_PATH:-}" REEL_BIN="$PWD/$bin/reel"
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
"$bin/reel_tests" --gtest_list_tests --gtest_filter="$filter" |
  awk '/^Running|^Note/ {next} /^[^ ]/ {s=$1; next} {print s $1}' > "$logs/selected.txt"
"$bin/reel_tests" --gtest_list_tests | awk '/^Running|^Note/ {next} /^[^ ]/ {s=$1; next} {print s $1}' > "$logs/all.txt"
t0=$(date +%s)
for i in $indices; do
  # The shard's tests: position i mod SHARDS in the full list, selected by the filter, not in SKIP.
  names=$(awk -v n="$shards" -v i="$i" -v skip=" ${SKIP:-} " 'NR == FNR { sel[$0] = 1; next }
          (FNR - 1) % n == i && ($0 in sel) && !index(skip, " " $0 " ")' "$logs/selected.txt" "$logs/all.txt" | paste -sd: -)
  [ -n "$names" ] || { echo "shard $i: no tests" > "$logs/${tool}_${shards}shard$i.log"; continue; }
  # shellcheck disable=SC2086
  GTEST_FILTER="$names" timeout "$limit" "$cs" --tool "$tool" $extra --print-limit 6 \
    "$bin/reel_tests" > "$logs/${tool}_${shards}shard$i.log" 2>&1 &
done
wait
summary="$out/${tool}_summary.txt"
echo "$tool over shards {$indices} of $shards, filter '$filter', skipping '${SKIP:-}', in $(( $(date +%s) - t0 )) s (limit $limit s)" > "$summary"
for f in "$logs/${tool}_${shards}"shard*.log; do
  echo "== $(basename "$f"): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$f" | sort | uniq -c | tr -s ' ' | tr '\n' ';')" \
       "$(grep -E '^\[  (PASSED|FAILED) +\] [0-9]+ tests?\.' "$f" | tr '\n' ' ')" \
       "finished $(grep -cE '^\[ +(OK|SKIPPED|FAILED) +\] .* \([0-9]+ ms\)$' "$f") of $(grep -m1 -oE 'Running [0-9]+ tests?' "$f" | grep -oE '[0-9]+')" >> "$summary"
  grep -m3 -E "^\[  FAILED  \]" "$f" >> "$summary"
  grep -q 'SUMMARY' "$f" || grep -E '^\[ RUN' "$f" | tail -1 | sed 's/^/   cut in: /' >> "$summary"
  # Reports grouped by kind and kernel (offsets dropped), most frequent first.
  grep -E "^========= (Invalid|Uninit|Error|Race|Warning|Internal)" "$f" | sed -E 's/\+0x[0-9a-f]+//' | sort | uniq -c |
    sort -rn | head -5 | cut -c1-300 >> "$summary"
done
tar -C "$out" -cJf "$out/${tool}_logs.tar.xz" "sanitize_logs_$tool" && rm -rf "$logs"
cat "$summary"
