#!/usr/bin/env bash
# reel and the PyTorch peer, side by side in one GPU-machine call (issue 5's joined tables).
#   bench/side_by_side.sh PHASE...      logs and JSON lines under $OUT/PHASE (or ./bench-out/PHASE)
# Phases (each runs reel and the peer one after the other, so each ratio is taken in one run):
#   eager     reel eager on the GPU vs torch eager (fp32, bf16, fp16) and the whole-step CUDA graph
#   compiled  reel eager and compiled (default, reduce-overhead) on the GPU vs torch.compile default,
#             reduce-overhead with CUDA-graph trees off, and the whole-step CUDA graph
#   scaling   micro-batch 8, 32, 128 for cnn-small and gpt-tiny, reel vs torch eager
#   cpu       the CPU, 2 threads each, cnn-small and gpt-tiny fp32
#   cpu-threads  the CPU at 2 and 8 threads: reel (oneDNN kernels, and the Eigen/im2col ones by env), eager
#             and compiled, beside torch eager; cnn-small and gpt-tiny fp32
#   profile   torch's kernel profile of gpt-small (bench/torch_profile.py), to set beside reel's
#   kernels   reel's own kernel profile: one compiled step (bf16, reduce-overhead) of cnn-small, gpt-tiny
#             and gpt-small under Nsight Compute, summed by kernel and family (bench/ncu_summary.py),
#             then the same three in reduce-overhead and max-autotune side by side (what timing the
#             GEMMs', convolutions' and attention's candidates gains)
#   families  the six models of MODELS.md in bf16: reel reduce-overhead (and max-autotune for the
#             CNNs) vs the whole-step CUDA graph, torch.compile default and reduce-overhead with
#             CUDA-graph trees off (each peer run under a time limit: compiling takes tens of seconds)
#   graph-memory  the six models in bf16: reel reduce-overhead's peak beside what the peer's whole-step
#             graph holds at rest and while its step runs (bench/peer_graph_memory.py, a process each)
#   frontier  gpt-small bf16 reduce-overhead at an effective batch of 64 under the budgets 256 MiB,
#             512 MiB, 1 GiB, 2 GiB: reel's choice (micro-batch, recomputation), planned and measured
#             peak, tokens/s; frontier-peer: PyTorch at the same budgets (bench/peer_memory_frontier.py:
#             eager, checkpointed, graphed, both)
#   limits    gpt-small bf16 reduce-overhead micro-batch 16 x ACCUM 4 under arena limits (none, 640,
#             512, 384, 256 MiB): what the planner recomputed, planned and measured peak, step time
#   eager-memory  cnn-small, gpt-tiny, gpt-small bf16 eager: reel's peak beside torch eager's
#   variable  gpt-small bf16 on lines of text (the repository's own sources and documents, one item
#             per line), micro-batch 16 x ACCUM 4: reel train --items lines --compile reduce-overhead
#             (each micro-batch in its own length bucket) beside PyTorch's dynamic, mark_dynamic and
#             padded whole-step graph (bench/peer_variable_length.py)
#   ab        this build against itself with a change named by the environment, AB="VAR=value ..." (say
#             AB="REEL_PASSES=+elementwise_column_sums", or REEL_PROGRAMMATIC_LAUNCH=0 with it): ROUNDS
#             rounds (default 2) alternating, the three models in bf16 and fp16, reduce-overhead;
#             bench/ab_table.py joins them
#   memory    micro-batch 1..128 (powers of two), bf16: reel's planned peak (--plan-memory) beside its
#             measured one, eager (every B) and reduce-overhead (B 1, 8, 64: each costs a compilation),
#             and torch eager's measured peak (bench/memory_table.py joins them)
# Needs the peer scripts copied into .peer/ (cp -r ../shared/peer .peer) and a reel binary ($REEL,
# default .gpu/reel from `make gpu-bundle`). Prints each joined table last.
set -uo pipefail
cd "$(dirname "$0")/.."
root="${OUT:-bench-out}"
reel="${REEL:-.gpu/reel}"
export LD_LIBRARY_PATH="$PWD/.gpu:${LD_LIBRARY_PATH:-}"
models="cnn-small,gpt-tiny,gpt-small"
precs="fp32,bf16,fp16"

join() {  # join DIR FILES...: the joined table of DIR's reel.jsonl with the peer files, its pictures beside it
  local dir="$1"; shift
  local note; note="$(date -u +%F)$(git rev-parse --short HEAD 2>/dev/null | sed 's/^/, build /')"
  CG_TREES_FILE=torch_trees_off.jsonl python3 bench/join.py "$dir/reel.jsonl" "$@" --figures "$dir" --note "$note" \
    > "$dir/joined.md"
}

for phase in "$@"; do
  out="$root/$phase"
  mkdir -p "$out"
  case "$phase" in
    eager)
      "$reel" bench --models "$models" --precisions "$precs" --profile 1 --json "$out/reel.jsonl" > "$out/reel.txt" 2>&1
      python3 .peer/torch_anchor.py cuda "$models" eager "$precs" > "$out/torch_eager.jsonl" 2> "$out/torch_eager.err"
      ATTN=sdpa python3 .peer/torch_graphed.py "$models" bf16 > "$out/torch_graphed.jsonl" 2> "$out/torch_graphed.err"
      join "$out" "$out/torch_eager.jsonl" "$out/torch_graphed.jsonl" ;;
    compiled)
      "$reel" bench --models "$models" --precisions "$precs" --compile eager,default,reduce-overhead \
        --json "$out/reel.jsonl" > "$out/reel.txt" 2>&1
      ATTN=sdpa python3 .peer/torch_graphed.py "$models" bf16 > "$out/torch_graphed.jsonl" 2> "$out/torch_graphed.err"
      # 16-bit only: each compiled configuration costs tens of seconds of compilation, and a device
      # call is limited to 10 minutes (MODELS.md's table also gives these modes in 16-bit).
      # PEER_PRECS narrows them further when a call's time is short.
      python3 .peer/torch_anchor.py cuda "$models" default "${PEER_PRECS:-bf16,fp16}" > "$out/torch_default.jsonl" \
        2> "$out/torch_default.err"
      CG_TREES=0 python3 .peer/torch_anchor.py cuda "$models" reduce-overhead "${PEER_PRECS:-bf16,fp16}" \
        > "$out/torch_trees_off.jsonl" 2> "$out/torch_trees_off.err"
      join "$out" "$out/torch_default.jsonl" "$out/torch_trees_off.jsonl" "$out/torch_graphed.jsonl" ;;
    scaling)
      : > "$out/reel.jsonl"; : > "$out/torch_eager.jsonl"
      for b in 8 32 128; do
        "$reel" bench --models cnn-small,gpt-tiny --precisions fp32,bf16 --micro-batch "$b" --json "$out/reel_$b.jsonl" \
          >> "$out/reel.txt" 2>&1
        cat "$out/reel_$b.jsonl" >> "$out/reel.jsonl"
        B="$b" python3 .peer/torch_anchor.py cuda cnn-small,gpt-tiny eager fp32,bf16 >> "$out/torch_eager.jsonl" \
          2>> "$out/torch_eager.err"
      done
      join "$out" "$out/torch_eager.jsonl" ;;
    cpu)
      OMP_NUM_THREADS=2 "$reel" bench --device cpu --models cnn-small,gpt-tiny --precisions fp32 --steps 5 --warmup 1 \
        --json "$out/reel.jsonl" > "$out/reel.txt" 2>&1
      THREADS=2 STEPS=5 python3 .peer/torch_anchor.py cpu cnn-small,gpt-tiny eager fp32 > "$out/torch_eager.jsonl" \
        2> "$out/torch_eager.err"
      join "$out" "$out/torch_eager.jsonl" ;;
    cpu-threads)
      # reel (oneDNN convolutions and GEMMs; and the Eigen/im2col kernels they replaced, selected by
      # REEL_CPU_CONV=im2col REEL_CPU_GEMM=eigen, in the same binary) beside torch eager, fp32, at 2
      # and 8 threads; eager and the compiled plan.
      # ROUNDS=N repeats the whole sequence (reel, reel before, torch at 2 then 8 threads) N times, so
      # a noisy machine's swings show as the spread between rounds; BEFORE=0 skips the old kernels.
      # reel warms up 5 steps before timing, as the peer script does (WARMUP=N changes it). Even rounds
      # run the compiled plan before eager, so a machine that slows during the call does not always
      # charge the same mode.
      : > "$out/reel.jsonl"; : > "$out/torch_eager.jsonl"
      for round in $(seq "${ROUNDS:-1}"); do
      modes=eager,default; [ $((round % 2)) = 0 ] && modes=default,eager
      for t in 2 8; do
        "$reel" bench --device cpu --threads "$t" --models cnn-small,gpt-tiny --precisions fp32 --compile "$modes" \
          --steps "${STEPS:-3}" --warmup "${WARMUP:-5}" --json "$out/reel_$t.jsonl" >> "$out/reel.txt" 2>&1
        if [ "${BEFORE:-1}" = 1 ]; then
          REEL_CPU_CONV=im2col REEL_CPU_GEMM=eigen "$reel" bench --device cpu --threads "$t" --models cnn-small,gpt-tiny \
            --precisions fp32 --compile eager,default --steps "${STEPS:-3}" --warmup "${WARMUP:-5}" --json "$out/reel_before_$t.jsonl" \
            >> "$out/reel.txt" 2>&1
          sed 's/"engine": "reel"/"engine": "reel-before"/' "$out/reel_before_$t.jsonl" >> "$out/reel.jsonl"
        fi
        cat "$out/reel_$t.jsonl" >> "$out/reel.jsonl"
        THREADS="$t" STEPS="${STEPS:-3}" python3 .peer/torch_anchor.py cpu cnn-small,gpt-tiny eager fp32 \
          >> "$out/torch_eager.jsonl" 2>> "$out/torch_eager.err"
      done
      done
      { grep -o '"engine": "[^"]*"\|"model": "[^"]*"\|"mode": "[^"]*"\|"step_ms_median": [0-9.]*\|"threads": [0-9]*' \
          "$out/reel.jsonl" | paste - - - - -; echo "torch eager:"; cat "$out/torch_eager.jsonl"; } > "$out/joined.md" ;;
    families)
      m6=cnn-small,resnet18-cifar,vit-tiny,yolov8n-cls,gpt-tiny,gpt-small
      "$reel" bench --models "$m6" --precisions bf16 --compile reduce-overhead --json "$out/reel.jsonl" > "$out/reel.txt" 2>&1
      "$reel" bench --models cnn-small,resnet18-cifar,yolov8n-cls --precisions bf16 --compile max-autotune \
        --json "$out/reel_autotune.jsonl" > "$out/reel_autotune.txt" 2>&1
      ATTN=sdpa timeout 90 python3 .peer/torch_graphed.py "$m6" bf16 > "$out/torch_graphed.jsonl" 2> "$out/torch_graphed.err"
      ATTN=sdpa timeout 170 python3 .peer/torch_anchor.py cuda "$m6" default bf16 > "$out/torch_default.jsonl" \
        2> "$out/torch_default.err"
      CG_TREES=0 ATTN=sdpa timeout 170 python3 .peer/torch_anchor.py cuda "$m6" reduce-overhead bf16 \
        > "$out/torch_trees_off.jsonl" 2> "$out/torch_trees_off.err"
      cat "$out/reel_autotune.jsonl" >> "$out/reel.jsonl"
      join "$out" "$out/torch_default.jsonl" "$out/torch_trees_off.jsonl" "$out/torch_graphed.jsonl" ;;
    graph-memory)
      m6=cnn-small,resnet18-cifar,vit-tiny,yolov8n-cls,gpt-tiny,gpt-small
      "$reel" bench --models "$m6" --precisions bf16 --compile reduce-overhead --json "$out/reel.jsonl" > "$out/reel.txt" 2>&1
      : > "$out/torch_graph_memory.jsonl"
      for m in ${m6//,/ }; do
        ATTN=sdpa timeout 90 python3 bench/peer_graph_memory.py .peer "$m" bf16 >> "$out/torch_graph_memory.jsonl" \
          2>> "$out/torch_graph_memory.err"
      done
      { echo "reel (peak_mib):"; grep -o '"model": "[^"]*"\|"peak_mib": [0-9.]*' "$out/reel.jsonl" | paste - -;
        echo "peer whole-step graph:"; cat "$out/torch_graph_memory.jsonl"; } > "$out/joined.md" ;;
    frontier)
      : > "$out/reel.jsonl"
      for b in 256MiB 512MiB 1GiB 2GiB; do
        "$reel" bench --models gpt-small --precisions bf16 --compile reduce-overhead --effective-batch 64 \
          --memory-budget "$b" --steps 10 --warmup 2 --json "$out/reel_$b.jsonl" >> "$out/reel.txt" 2>&1 ||
          echo "budget $b: reel bench exited $?" >> "$out/reel.txt"
        cat "$out/reel_$b.jsonl" >> "$out/reel.jsonl" 2>/dev/null
      done
      { grep -h "chosen\|nothing fits\|exited\|planned peak" "$out/reel.txt"; cat "$out/reel.jsonl"; } > "$out/joined.md" ;;
    frontier-peer)
      # BUDGETS picks budgets; START (peer_memory_frontier.py) resumes a search cut short before.
      timeout "${PEER_TIMEOUT:-540}" python3 bench/peer_memory_frontier.py .peer "${BUDGETS:-256MiB,512MiB,1GiB,2GiB}" \
        > "$out/torch_frontier.jsonl" 2> "$out/torch_frontier.err"
      [ -s "$out/torch_frontier.jsonl" ] || cp "$out/torch_frontier.err" "$out/torch_frontier.jsonl"  # rows so far
      cp "$out/torch_frontier.jsonl" "$out/joined.md" ;;
    limits)
      : > "$out/reel.jsonl"
      for lim in 0 640MiB 512MiB 384MiB 256MiB; do
        args=(); [ "$lim" != 0 ] && args=(--memory-limit "$lim")
        "$reel" bench --models gpt-small --precisions bf16 --compile reduce-overhead --plan-memory 1 "${args[@]}" \
          --json "$out/reel_$lim.jsonl" >> "$out/reel.txt" 2>&1
        cat "$out/reel_$lim.jsonl" >> "$out/reel.jsonl"
      done
      { grep -h "recompute" "$out/reel.txt"; cat "$out/reel.jsonl"; } > "$out/joined.md" ;;
    variable)
      find . -path ./.peer -prune -o \( -name '*.md' -o -name '*.h' -o -name '*.cpp' \) -type f -print | sort |
        xargs cat > "$out/lines.txt"
      [ "${REEL_STEPS:-2000}" != 0 ] &&
        "$reel" train --model gpt-small --items lines --text "$out/lines.txt" --compile reduce-overhead --precision bf16 \
          --micro-batch 16 --accum 4 --lr 1e-3 --steps "${REEL_STEPS:-2000}" > "$out/reel.txt" 2>&1
      # Each PyTorch configuration in its own process and time limit (a compile that runs long costs
      # only its own row); PEER_CONFIGS picks some, REEL_STEPS=0 skips reel's run.
      : > "$out/torch.jsonl"
      for c in $(echo "${PEER_CONFIGS:-dynamic,mark_dynamic,padded_graph}" | tr , ' '); do
        CONFIGS="$c" timeout "${PEER_TIMEOUT:-200}" python3 bench/peer_variable_length.py .peer "$out/lines.txt" \
          "${PEER_STEPS:-300}" 16 4 >> "$out/torch.jsonl" 2>> "$out/torch.err" ||
          echo "{\"engine\": \"torch\", \"config\": \"$c\", \"error\": \"exit $? (timeout ${PEER_TIMEOUT:-200} s?)\"}" >> "$out/torch.jsonl"
      done
      { grep -E "^lines|tokens|length buckets|throughput|memory|done" "$out/reel.txt"; cat "$out/torch.jsonl"; } \
        > "$out/joined.md" ;;
    eager-memory)
      "$reel" bench --models "$models" --precisions bf16 --json "$out/reel.jsonl" > "$out/reel.txt" 2>&1
      python3 .peer/torch_anchor.py cuda "$models" eager bf16 > "$out/torch_eager.jsonl" 2> "$out/torch_eager.err"
      { grep -o '"model": "[^"]*"\|"peak_mib": [0-9.]*\|"step_ms_median": [0-9.]*' "$out/reel.jsonl" | paste - - -;
        echo "torch eager:"; cat "$out/torch_eager.jsonl"; } > "$out/joined.md" ;;
    profile)
      for p in fp32 bf16; do python3 bench/torch_profile.py gpt-small "$p" 25; done > "$out/torch_profile.txt" 2>&1 ;;
    kernels)
      # Each kernel replayed alone with warm caches (--cache-control none): the sums run a little above
      # the step. NCU_TIMEOUT bounds each model's profile (seconds).
      : > "$out/joined.md"
      for m in cnn-small gpt-tiny gpt-small; do
        timeout "${NCU_TIMEOUT:-150}" ncu --profile-from-start off --csv --metrics gpu__time_duration.sum \
          --cache-control none --clock-control none --graph-profiling node "$reel" bench --models "$m" \
          --precisions bf16 --compile reduce-overhead --steps 1 --warmup 1 --profiler-range 1 \
          > "$out/ncu_$m.csv" 2> "$out/ncu_$m.err"
        python3 bench/ncu_summary.py "$out/ncu_$m.csv" "$m" --top 25 >> "$out/joined.md" 2>&1
      done
      "$reel" bench --models "$models" --precisions bf16 --compile reduce-overhead,max-autotune \
        --json "$out/reel.jsonl" > "$out/reel.txt" 2>&1
      grep -E "^(cnn|gpt)" "$out/reel.txt" >> "$out/joined.md" ;;
    ab)
      read -r -a change <<< "${AB:?the ab phase needs AB=\"VAR=value ...\", the change to measure}"
      echo "${AB}" > "$out/change.txt"
      for r in $(seq 1 "${ROUNDS:-2}"); do
        for side in base test; do
          env_args=()
          [ "$side" = test ] && env_args=("${change[@]}")
          env "${env_args[@]}" "$reel" bench --models "$models" --precisions bf16,fp16 --compile reduce-overhead \
            --json "$out/$side.r$r.jsonl" > "$out/$side.r$r.txt" 2>&1
        done
      done
      python3 bench/ab_table.py "$out" > "$out/joined.md" ;;
    memory)
      : > "$out/reel.jsonl"; : > "$out/torch_eager.jsonl"
      for b in 1 2 4 8 16 32 64 128; do
        modes=eager
        case "$b" in 1|8|64) modes=eager,reduce-overhead ;; esac
        "$reel" bench --models "$models" --precisions bf16 --compile "$modes" --micro-batch "$b" --steps 3 --warmup 1 \
          --plan-memory 1 --json "$out/reel_$b.jsonl" >> "$out/reel.txt" 2>&1
        cat "$out/reel_$b.jsonl" >> "$out/reel.jsonl"
        B="$b" STEPS=3 python3 .peer/torch_anchor.py cuda "$models" eager bf16 >> "$out/torch_eager.jsonl" \
          2>> "$out/torch_eager.err"
      done
      python3 bench/memory_table.py "$out/reel.jsonl" "$out/torch_eager.jsonl" > "$out/joined.md" ;;
    *) echo "unknown phase $phase (eager, compiled, families, graph-memory, frontier, frontier-peer, limits, eager-memory, variable, scaling, cpu, cpu-threads, profile, ab, memory)" >&2
       exit 2 ;;
  esac
done
for phase in "$@"; do
  [ -f "$root/$phase/joined.md" ] && { echo "== $phase"; cat "$root/$phase/joined.md"; }
done
exit 0
