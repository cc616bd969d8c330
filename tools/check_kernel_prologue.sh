#!/usr/bin/env bash
# check_kernel_prologue.sh — fails when a CUDA kernel of reel could start before the kernel it depends on.
#
# reel launches its kernels with programmatic dependent launch (kernels/cuda/launch.cuh): a kernel's
# blocks may start while the kernel before it is still running, and are kept in order only by the
# griddepcontrol.wait that opens every kernel. So, in every .cu and .cuh file under kernels/:
#   - every __global__ function's body opens with grid_dependency_wait(); (FILE:LINE otherwise);
#   - no kernel is launched with <<<...>>> (launch_kernel() instead), outside comments.
# The fused-elementwise kernels NVRTC compiles open with the same instruction (kernels/jit/
# codegen_cuda.cpp; tests/test_codegen_cuda.cpp checks the text). Exit status 1 on any finding;
# `make test` runs this with the layer check. Bash, grep and awk only.
set -euo pipefail
cd "$(dirname "$0")/.."

files=$(find kernels -name '*.cu' -o -name '*.cuh' | sort)
counts=$(mktemp)
status=0
for f in $files; do
  awk -v file="$f" '
  { text = text $0 "\n" }
  END {
    bad = 0
    n = length(text)
    # Blank out comments (keeping newlines) so that mentions in prose are not read as code.
    clean = ""
    i = 1
    while (i <= n) {
      two = substr(text, i, 2)
      if (two == "//") { j = index(substr(text, i), "\n"); if (j == 0) j = n - i + 2; clean = clean sprintf("%*s", j - 1, ""); i += j - 1; continue }
      if (two == "/*") { j = index(substr(text, i + 2), "*/"); if (j == 0) j = n; seg = substr(text, i, j + 3); gsub(/[^\n]/, " ", seg); clean = clean seg; i += length(seg); continue }
      clean = clean substr(text, i, 1)
      i++
    }
    rest = clean
    offset = 0
    while ((p = index(rest, "__global__")) > 0) {
      k = p + 10
      depth = 0; seen = 0; decl = 0
      while (k <= length(rest)) {
        c = substr(rest, k, 1)
        if (c == "(") { depth++; seen = 1 }
        else if (c == ")") depth--
        else if (c == ";" && depth == 0) { decl = 1; break }
        else if (c == "{" && depth == 0 && seen) break
        k++
      }
      if (!decl) {
        kernels++
        body = substr(rest, k + 1, 200)
        sub(/^[ \t\n]+/, "", body)
        if (substr(body, 1, 23) != "grid_dependency_wait();") {
          before = substr(clean, 1, offset + p); line = gsub(/\n/, "\n", before) + 1
          printf "%s:%d: a __global__ function that does not open with grid_dependency_wait();\n", file, line
          bad++
        }
      }
      offset += k
      rest = substr(rest, k + 1)
    }
    rest = clean
    offset = 0
    while ((p = index(rest, "<<<")) > 0) {
      before = substr(clean, 1, offset + p); line = gsub(/\n/, "\n", before) + 1
      printf "%s:%d: a <<<...>>> launch: use launch_kernel() (kernels/cuda/launch.cuh)\n", file, line
      bad++
      offset += p + 2
      rest = substr(rest, p + 3)
    }
    print kernels > "/dev/stderr"
    exit bad > 0
  }' "$f" 2>>"$counts" || status=1
done
total=$(awk '{ n += $1 } END { print n + 0 }' "$counts")
rm -f "$counts"
if [ $status -ne 0 ]; then
  echo "check_kernel_prologue: kernels that may run before the kernel they depend on (see kernels/cuda/launch.cuh)" >&2
else
  echo "check_kernel_prologue: $total kernels in $(echo "$files" | wc -l) files open with grid_dependency_wait(); no <<<>>> launch"
fi
exit $status
