#!/usr/bin/env bash
# Runs reel's test binary (and, when present, the benchmarks) on a GPU machine from a build made
# elsewhere: `make gpu-bundle` copies the binaries into .gpu/, which travels to the GPU machine.
# Logs go to $OUT (or ./gpu-out); a short table is printed last.
#   tools/gpu_check.sh [gtest filter] [bench filter, or "none"]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
filter="${1:-*}"
bench_filter="${2:-none}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
export LD_LIBRARY_PATH="$PWD/.gpu:${LD_LIBRARY_PATH:-}"
.gpu/reel_tests --gtest_filter="$filter" --gtest_brief=1 > "$out/tests.log" 2>&1
tests_rc=$?
if [ "$bench_filter" != "none" ] && [ -x .gpu/reel_bench ]; then
  .gpu/reel_bench --benchmark_filter="$bench_filter" --benchmark_repetitions=5 \
    --benchmark_report_aggregates_only=true --benchmark_out="$out/bench.json" \
    --benchmark_out_format=json > "$out/bench.log" 2>&1
fi
echo "== GPU: $(cat "$out/gpu.txt")"
grep -E "^\[  FAILED  \]" "$out/tests.log" | sort -u | head -60
if [ -f "$out/bench.log" ]; then grep -E "median" "$out/bench.log"; fi
tail -n 4 "$out/tests.log" | grep -E "PASSED|FAILED|SKIPPED|tests ran"
grep -E "tests ran|PASSED  \]|FAILED TEST" "$out/tests.log" | tail -3
exit $tests_rc
