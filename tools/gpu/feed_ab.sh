#!/usr/bin/env bash
# Runs on the GPU machine (from the repository root, binaries from tools/gpu/package.sh): the NVFP4
# streaming GEMM's two feeds side by side (StreamGemmTuning::feed; stream_gemm_tma_kernel.cu).
#   0. the TMA feed's GPU tests one at a time, each under a short timeout, so that a hang costs
#      seconds and names its test (the feed had never run when this was written);
#   1. the other streaming GEMM tests (both feeds);
#   2. the timeline of every DeepSeek-V3 shape at M = 1 and 16 with the cp.async rings and (unless
#      a TMA test hung or crashed) the TMA feed with 8 and with 16 consumer warps, alternating, two
#      rounds;
#   3. the K-split sweep (its last four columns are the TMA feed);
#   4. (unless a TMA test hung or crashed) each TMA test under compute-sanitizer (memcheck,
#      synccheck), with what is left of the budget.
# Every step's timeout is cut to what is left of the budget (--budget S, default 570 s: the device
# tool's 600 s per call), and a step that cannot get 20 s is skipped. Logs, tables and
# summary.txt (written as it goes) go to $OUT (or /tmp/locus-feed-ab); the summary comes last.
# usage: tools/gpu/feed_ab.sh [--shape NxK] [--no-sanitizer] [--budget S]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/locus-feed-ab}"
mkdir -p "$OUT"
source tools/gpu/carry_env.sh  # CARRY, LD_LIBRARY_PATH
shape=(); sanitize=1; budget=570
while (($#)); do
  case "$1" in
    --shape) shape=(--shape "$2"); shift ;;
    --no-sanitizer) sanitize=0 ;;
    --budget) budget="$2"; shift ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
  shift
done
: > "$OUT/summary.txt"
note() { echo "$1" | tee -a "$OUT/summary.txt"; }
# run WANT_S LOG CMD...: CMD under a timeout of WANT_S seconds or what is left of the budget;
# returns its exit status (124: timed out), or 125 (and says so) when not even 20 s are left.
run() {
  local want=$1 log=$2; shift 2
  local left=$((budget - SECONDS))
  ((left < want)) && want=$left
  if ((want < 20)); then note "skipped (budget spent): $*"; return 125; fi
  timeout "$want" "$@" > "$log" 2>&1
}

# 0. The TMA feed's tests, one process each. A hang, a crash or no GPU (tma_ok=0) leaves the TMA
#    feed out of the later steps.
tma_ok=1
mapfile -t tma_tests < <("$CARRY/locus_cuda_tests" --gtest_list_tests --gtest_filter='CudaStreamGemmTma*' |
  awk '/^[^ ]/ {suite=$1} /^  [^ ]/ {print suite $1}')
((${#tma_tests[@]})) || { note "no CudaStreamGemmTma* tests listed"; tma_ok=0; }
for t in "${tma_tests[@]}"; do
  run 45 "$OUT/tma_${t//[^A-Za-z0-9]/_}.log" "$CARRY/locus_cuda_tests" --gtest_filter="$t"
  rc=$?
  case $rc in
    0) if grep -q '^\[  SKIPPED \]' "$OUT/tma_${t//[^A-Za-z0-9]/_}.log"; then note "TMA test $t: SKIPPED (no GPU?)"; tma_ok=0
       else note "TMA test $t: passed"; fi ;;
    124) note "TMA test $t: HUNG (killed after its timeout)"; tma_ok=0 ;;
    *) note "TMA test $t: FAILED, exit $rc ($(grep -m1 -E 'Failure|error|what\(\)' "$OUT/tma_${t//[^A-Za-z0-9]/_}.log"))"
       ((rc > 128)) && tma_ok=0 ;;  # a crash stops the TMA steps; a wrong result does not (time it, sanitize it)
  esac
done

# 1. The other streaming tests (the traced and chained ones run both feeds).
run 180 "$OUT/tests.log" "$CARRY/locus_cuda_tests" --gtest_brief=1 \
  --gtest_filter='CudaStreamGemm*:CudaStreamDomains*:-CudaStreamGemmTma*'
note "other streaming GEMM tests: exit $?, $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/tests.log" | head -3 | tr '\n' ' ')"
# 2. Variants (feed, consumer warps): the cp.async rings; the TMA feed with 8 consumer warps (the
#    next launch's CTA beside); the TMA feed with 16 (one CTA per SM, none beside).
variants=("0 0"); ((tma_ok)) && variants+=("1 8" "1 16")
for round in 1 2; do
  for variant in "${variants[@]}"; do
    set -- $variant
    name="feed$1_warps$2"
    run 60 "$OUT/timeline_${name}_round$round.md" "$CARRY/cuda_stream_timeline_bench" "${shape[@]}" --m 1,16 \
      --tuning "0,$2,0,1,0,$1"
    note "timeline $name round $round: exit $?, $OUT/timeline_${name}_round$round.md"
  done
done
# 3. The sweep (its TMA columns only mean something when the TMA tests ran).
run 120 "$OUT/sweep.log" "$CARRY/cuda_gemm_bench" --sweep --quick --m 1 "${shape[@]}"
note "sweep: exit $?, $OUT/sweep.log"
# 4. Last, with what is left of the budget: the TMA feed's tests under compute-sanitizer, one
#    process per test and tool (a slow one then costs only its own timeout).
if ((sanitize && tma_ok)); then
  for tool in memcheck synccheck; do
    for t in "${tma_tests[@]}"; do
      # The tuning checks make no CUDA call, which compute-sanitizer reports as an error (exit 255).
      [[ $t == CudaStreamGemmTmaTuning.* ]] && continue
      log="$OUT/sanitizer_${tool}_${t//[^A-Za-z0-9]/_}.log"
      run 90 "$log" /usr/local/cuda/bin/compute-sanitizer --tool "$tool" --error-exitcode 9 \
        "$CARRY/locus_cuda_tests" --gtest_brief=1 --gtest_filter="$t"
      rc=$?
      ((rc == 125)) && break 2
      note "compute-sanitizer $tool $t: exit $rc$( ((rc == 124)) && echo ' (timed out)'), $(grep -E 'ERROR SUMMARY' "$log" | tail -1)"
    done
  done
fi
echo "==== summary ($OUT, ${SECONDS} s)"
cat "$OUT/summary.txt"
