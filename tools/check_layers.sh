#!/usr/bin/env bash
# check_layers.sh — fails when a library folder includes a folder above it (DESIGN.md's "Layers").
#
# The order, lowest first; a folder may include itself and the folders it sits on:
#   tensor <- kernels <- autograd <- distributed <- nn
#   autograd <- optim                    (optim sits on autograd, beside nn, not above it)
#   tensor, kernels, autograd <- data
#   nn, optim <- compile <- tools        (compile/ sees kernels only through dispatch and ops.def:
#                                         never kernels/cuda/)
#   distributed, nn, optim <- parallel <- tools
# Every `#include "folder/..."` of the library folders and tools/ is read; an include of a folder
# that is not below is listed as FILE:LINE, the include, and the rule it breaks. tests/, bench/ and
# reel.h may include anything and are not read.
#
# tools/layer_exceptions.txt lists known violations, one a line: FILE INCLUDE REASON (the reason is
# required; `#` starts a comment). An exception that no longer matches a violation is an error too,
# so the list shrinks as violations are fixed. Exit status 1 on any violation; `make test` runs this
# first. Bash, grep and awk only.
set -euo pipefail
cd "$(dirname "$0")/.."

exceptions=tools/layer_exceptions.txt
folders="tensor kernels autograd distributed nn optim data compile parallel tools"

present=""
for d in $folders; do [ -d "$d" ] && present="$present $d"; done
# grep's status 1 (no include at all) is not an error here.
includes=$(grep -rnE --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' --include='*.def' \
                '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' $present || [ $? -eq 1 ])

printf '%s\n' "$includes" | awk -v exceptions="$exceptions" -v folders="$folders" '
BEGIN {
  # What each folder may include besides itself.
  below["tensor"]      = ""
  below["kernels"]     = "tensor"
  below["autograd"]    = "tensor kernels"
  below["distributed"] = "tensor kernels autograd"
  below["nn"]          = "tensor kernels autograd distributed"
  below["optim"]       = "tensor kernels autograd"
  below["data"]        = "tensor kernels autograd"
  below["compile"]     = "tensor kernels autograd distributed nn optim"
  below["parallel"]    = "tensor kernels autograd distributed nn optim"
  below["tools"]       = "tensor kernels autograd distributed nn optim data compile parallel"
  n = split(folders, list, " ")
  for (i = 1; i <= n; i++) library[list[i]] = 1

  bad_exceptions = 0
  line_no = 0
  while ((getline line < exceptions) > 0) {
    line_no++
    sub(/#.*/, "", line)
    if (split(line, f, " ") == 0) continue
    if (f[3] == "") {
      printf "%s:%d: an exception needs a reason: FILE INCLUDE REASON\n", exceptions, line_no
      bad_exceptions++
      continue
    }
    key = f[1] " " f[2]
    excepted[key] = line_no
  }
  close(exceptions)
}
{
  # grep -n: FILE:LINE:TEXT (paths here hold no colon).
  if ($0 == "") next
  file = $0; sub(/:.*/, "", file)
  rest = substr($0, length(file) + 2)
  lineno = rest; sub(/:.*/, "", lineno)
  text = substr(rest, length(lineno) + 2)
  inc = text; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
  folder = file; sub(/\/.*/, "", folder)
  if (index(inc, "/") == 0) next          # "reel.h", a file beside it: no folder named
  top = inc; sub(/\/.*/, "", top)
  checked++

  rule = ""
  if (top == "..") {
    rule = "includes by folder name, not ../"
  } else if ((top in library) && top != folder && index(" " below[folder] " ", " " top " ") == 0) {
    rule = top "/ is not below " folder "/ (" folder "/ may include " \
           (below[folder] == "" ? "only itself" : below[folder] " and itself") ")"
  } else if (folder == "compile" && inc ~ /^kernels\/cuda\//) {
    rule = "compile/ sees kernels only through dispatch and ops.def, not kernels/cuda/"
  }
  if (rule == "") next

  key = file " " inc
  if (key in excepted) { used[key] = 1; known++; next }
  printf "%s:%s: #include \"%s\": %s\n", file, lineno, inc, rule
  violations++
}
END {
  stale = 0
  for (key in excepted)
    if (!(key in used)) {
      printf "%s:%d: \"%s\" is no longer a violation: remove the line\n", exceptions, excepted[key], key
      stale++
    }
  printf "check_layers: %d includes of library folders read, %d violations, %d known (%s)\n", \
         checked, violations, known, exceptions
  exit (violations + stale + bad_exceptions > 0) ? 1 : 0
}'
