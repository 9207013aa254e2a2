#!/usr/bin/env bash
# Runs on the GPU machine (from the repository root, binaries from tools/gpu/package.sh): the model
# end to end at DeepSeek-V3's own widths, against its decode floor. The tiny model is launch-bound
# and says nothing of the kernels; this one reads about 2-3 GB of weights per token.
#   1. the device's copy bandwidth (cuda_gemm_bench --copy-bandwidth, bytes read + written);
#   2. `locus make-tiny-model --shape deepseek-v3` with LAYERS layers (the first dense) and EXPERTS
#      routed experts (8 per token, as V3; fewer experts than V3's 256 keep the files a few GB and
#      the per-token reads the same), BF16 and NVFP4;
#   3. `locus plan --decode-batch 1,8 --bandwidth-gbs BW`: the weight bytes a decode step reads and
#      the floor, the tokens/s that reading them at the copy bandwidth allows;
#   4. `locus generate --backend cuda --ignore-eos --warmup` at batch 1 and 8, locality domains off and on
#      (NVFP4 also with LOCUS_NVFP4_ROW_BLOCKS=0, one launch per expert, and LOCUS_MOE_INDEXED=0, experts
#      grouped with their offsets read back; and with --cuda-graphs, decode steps replayed from CUDA
#      graphs): decode tokens/s and floor / measured (DESIGN.md section 7: within 1.5x of the floor);
#   5. where a decode step's host time goes (LOCUS_HOST_PROFILE=1), batch 1, LD off, eager and with
#      --cuda-graphs (run before 4);
#   6. where the device's time goes, by kernel (libcuda_kernel_trace.so, when packaged), batch 1 and 8, LD off
#      (NVFP4 also with --cuda-graphs, then the last decode step launch by launch), and the median
#      step (cut at each embedding launch) by kind of work, with the device's idle time;
#   7. logits CUDA vs the CPU following CUDA's routing (tools/gpu/logits_env.sh) at these widths.
# PROFILE_PER_EXPERT=1 profiles NVFP4 with one launch per expert too. BACKEND=cpu and BW_GBS=N run it without a GPU (no logits step then). Logs and the table
# (e2e_floor.md) go to $OUT (or /tmp/locus-e2e-floor).
# --models DIR keeps the checkpoints in DIR/<format> and uses one already there (made with the same
# --layers and --experts, e.g. in the background while other work runs).
# usage: tools/gpu/e2e_floor.sh [--layers L] [--experts E] [--tokens N] [--formats "bf16 nvfp4"] [--models DIR]
#                               [--batches "1 8"] [--lds "off on"]   (batches: 1 to 8)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/locus-e2e-floor}"
mkdir -p "$OUT"
BACKEND="${BACKEND:-cuda}"
source tools/gpu/carry_env.sh  # CARRY, LD_LIBRARY_PATH
source tools/gpu/tiny_model_env.sh  # set_ld_flags
source tools/gpu/logits_env.sh  # logits_vs_cpu
# 128 new tokens: about 0.13 s of decode at batch 1 on an H100; runs of 32 moved by 5 % from run to run.
layers=3; experts=32; tokens=128; formats="bf16 nvfp4"; models=""; batches="1 8"; lds="off on"
while (($#)); do
  case "$1" in
    --layers) layers="$2"; shift ;;
    --experts) experts="$2"; shift ;;
    --tokens) tokens="$2"; shift ;;
    --formats) formats="$2"; shift ;;
    --models) models="$2"; shift ;;
    --batches) batches="$2"; shift ;;
    --lds) lds="$2"; shift ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
  shift
done
LOG="$OUT/e2e_floor.log"; : > "$LOG"
TABLE="$OUT/e2e_floor.md"
PROFILE="$OUT/e2e_profile.md"; : > "$PROFILE"  # appended to the table at the end
rc=0

bw="${BW_GBS:-}"
if [[ -z "$bw" ]]; then
  bw=$(timeout 120 "$CARRY/cuda_gemm_bench" --copy-bandwidth 2>>"$LOG" | tee -a "$LOG" |
       sed -n 's/.*copy bandwidth \([0-9]*\) GB\/s.*/\1/p')
  [[ -n "$bw" ]] || { echo "no copy bandwidth (see $LOG)"; exit 1; }
fi

prompts1=(--prompt "${all_prompts[0]}")
for batch in $batches; do
  ((batch >= 1 && batch <= ${#all_prompts[@]})) || { echo "--batches: $batch is not in 1..${#all_prompts[@]}"; exit 2; }
done
{
  echo "Device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) ($BACKEND backend);" \
       "copy bandwidth $bw GB/s; $(date -u '+%Y-%m-%d %H:%M UTC')."
  echo "Model: DeepSeek-V3 widths, $layers layers (1 dense), $experts routed experts (8 per token) + 1 shared;" \
       "$tokens new tokens per sequence (--ignore-eos)."
  echo
  echo "| format | LD | batch | weights per step GiB | floor tok/s | decode tok/s | floor / measured |"
  echo "|---|---|---|---|---|---|---|"
} > "$TABLE"

MODELS="${models:-$(mktemp -d)}"  # not under $OUT: the checkpoints need not come back
for fmt in $formats; do
  dir="$MODELS/$fmt"
  fmt_flag=(); [[ $fmt == nvfp4 ]] && fmt_flag=(--nvfp4)
  start=$(date +%s)
  if [[ -f "$dir/config.json" ]]; then
    echo "$fmt model: using $dir"
  else
    timeout 600 "$CARRY/locus" make-tiny-model "$dir" --shape deepseek-v3 --layers "$layers" --experts "$experts" \
      --seed 1 "${fmt_flag[@]}" >> "$LOG" 2>&1 || { echo "make-tiny-model $fmt FAILED (see $LOG)"; rc=1; continue; }
    echo "$fmt model written in $(($(date +%s) - start)) s: $(tail -1 "$LOG")"
  fi
  plan=$("$CARRY/locus" plan --model "$dir" --decode-batch "${batches// /,}" --bandwidth-gbs "$bw" | grep -E '^  batch [0-9]+:')
  echo "$plan" >> "$LOG"
  # Where a decode step's host time goes (LOCUS_HOST_PROFILE=1: enqueueing, and waits for the
  # device inside a region), batch 1, LD off; eagerly and (CUDA) with decode graphs, where the
  # host's time between steps is the device's idle time.
  profile_runs=("|")
  [[ $BACKEND == cuda ]] && profile_runs+=("|--cuda-graphs")
  [[ $fmt == nvfp4 && -n "${PROFILE_PER_EXPERT:-}" ]] && profile_runs+=("LOCUS_NVFP4_ROW_BLOCKS=0|")
  for run in "${profile_runs[@]}"; do
    IFS='|' read -r envs flags <<< "$run"
    timeout 300 env LOCUS_HOST_PROFILE=1 $envs "$CARRY/locus" generate --model "$dir" --backend "$BACKEND" \
      "${prompts1[@]}" --max-new-tokens "$tokens" --ignore-eos --warmup --quiet $flags > "$OUT/profile.out" 2>&1
    { echo; echo "$fmt, batch 1, LD off${envs:+, $envs}${flags:+, $flags}: decode steps' host time"; echo '```';
      sed -n '/^host time by region/,$p' "$OUT/profile.out"; echo '```'; } >> "$PROFILE"
  done
  # Where the device's time goes (bench/cuda/kernel_trace.cpp, CUPTI): kernels, copies and idle
  # gaps over the last 20 ms of a longer timed decode, LD off, each batch.
  if [[ $BACKEND == cuda && -f "$CARRY/libcuda_kernel_trace.so" ]]; then
    trace_flags=("")
    [[ $fmt == nvfp4 ]] && trace_flags+=("--cuda-graphs")
    for flags in "${trace_flags[@]}"; do
      for batch in $batches; do
        set_prompts "$batch"
        trace="$OUT/trace_${fmt}_b$batch${flags:+_graphs}.md"
        # With graphs, also the last step launch by launch (a 3-layer step is about 120 activities).
        seq=0; [[ -n $flags ]] && seq=$((40 + 45 * layers))
        timeout 300 env LD_PRELOAD="$PWD/$CARRY/libcuda_kernel_trace.so" LOCUS_KERNEL_TRACE="$trace" \
          LOCUS_KERNEL_TRACE_LAST_MS=20 LOCUS_KERNEL_TRACE_SEQUENCE=$seq LOCUS_KERNEL_TRACE_STEP=embedding_kernel "$CARRY/locus" generate --model "$dir" --backend cuda "${prompts[@]}" \
          --max-new-tokens $((tokens * 2)) --ignore-eos --warmup --quiet $flags > "$OUT/trace.out" 2>&1
        { echo; echo "$fmt, batch $batch, LD off${flags:+, $flags}: device time by kernel ($(grep -a '^locus: [0-9]' "$OUT/trace.out" |
            sed -E 's/.*decode ([0-9]+ tokens in [0-9.]+ s \([0-9.]+ tok\/s\)).*/decode \1/') under the tracer)";
          grep -a '^locus: decode graphs' "$OUT/trace.out";
          echo; cat "$trace" 2>/dev/null || { echo "no trace (see below)"; tail -5 "$OUT/trace.out"; }; } >> "$PROFILE"
      done
    done
  fi
  # Runs: "label|LD|environment|flags". NVFP4 also with one launch per expert and projection
  # (LOCUS_NVFP4_ROW_BLOCKS=0; by default experts with equal row counts share a launch).
  runs=()
  for ld in $lds; do runs+=("$ld|$ld||"); done
  # Decode steps replayed from CUDA graphs (every LD setting; steps a graph cannot hold run eagerly,
  # as the "decode graphs" line in the log says).
  [[ $BACKEND == cuda ]] && for ld in $lds; do runs+=("$ld, graphs|$ld||--cuda-graphs"); done
  if [[ $fmt == nvfp4 && " $lds " == *" off "* ]]; then
    runs+=("off, per expert|off|LOCUS_NVFP4_ROW_BLOCKS=0|")
    # Decode MoE takes its experts by id on the device where few pairs share an expert; this run
    # groups them by expert with the offsets read back, as every batch did before.
    runs+=("off, grouped experts|off|LOCUS_MOE_INDEXED=0|")
    # Experts by id at every batch (an expert several tokens chose is streamed once per token), so
    # that batch 8 of this model's 32 experts fits a graph too.
    [[ $BACKEND == cuda ]] && runs+=("off, graphs, experts by id|off|LOCUS_MOE_INDEXED=all|--cuda-graphs")
    # Graphs with the lookahead (each greedy step launched from the device's tokens before they come back).
    [[ $BACKEND == cuda ]] && runs+=("off, graphs, lookahead|off||--cuda-graphs --decode-lookahead")
    # The same with one executable for the chained steps (each launch then queues behind the last).
    [[ $BACKEND == cuda ]] && runs+=("off, graphs, lookahead, one executable|off|LOCUS_CHAINED_GRAPH_TWINS=0|--cuda-graphs --decode-lookahead")
  fi
  for run in "${runs[@]}"; do
    IFS='|' read -r label ld envs flags <<< "$run"
    set_ld_flags "$ld"
    for batch in $batches; do
      # "  batch 8: 2.178 GiB per step; floor at 4197 GB/s: 0.557 ms per step, 14357.2 tok/s"
      line=$(grep "^  batch $batch:" <<< "$plan")
      gib=$(sed -E 's/.*: ([0-9.]+) GiB per step.*/\1/' <<< "$line")
      floor=$(sed -E 's/.* ([0-9.]+) tok\/s$/\1/' <<< "$line")
      set_prompts "$batch"
      echo "== generate $fmt LD $label batch $batch" >> "$LOG"
      timeout 300 env $envs "$CARRY/locus" generate --model "$dir" --backend "$BACKEND" "${prompts[@]}" \
        --max-new-tokens "$tokens" --ignore-eos --warmup --quiet "${ld_flags[@]}" $flags > "$OUT/generate.out" 2>&1
      g_rc=$?
      cat "$OUT/generate.out" >> "$LOG"
      # "locus: 8 sequences, ...; decode 248 tokens in 0.255 s (972.5 tok/s); finished: ..."
      tps=$(sed -n -E 's/^locus: [0-9].*decode [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/p' "$OUT/generate.out")
      if [[ $g_rc -ne 0 || -z "$tps" ]]; then
        echo "generate $fmt LD $label batch $batch: FAILED (see $LOG)"; rc=1; continue
      fi
      ratio=$(awk -v f="$floor" -v t="$tps" 'BEGIN { printf "%.2f", f / t }')
      echo "| $fmt | $label | $batch | $gib | $floor | $tps | $ratio |" >> "$TABLE"
      echo "generate $fmt LD $label batch $batch: $tps tok/s, floor $floor, floor / measured $ratio"
      grep -a '^locus: decode graphs' "$OUT/generate.out"
    done
  done
  [[ $BACKEND == cuda ]] || continue
  logits_vs_cpu "$dir" "$fmt" "$LOG" || rc=1
  printf '%s\n' "${logits_results[@]}" | tee -a "$TABLE"
  [[ -n "$models" ]] || rm -rf "$dir"
done
[[ -n "$models" ]] || rm -rf "$MODELS"
cat "$PROFILE" >> "$TABLE"
echo "==== $TABLE"
cat "$TABLE"
exit "$rc"
