#!/usr/bin/env bash
# Runs on the GPU machine (from the repository root, binaries from tools/gpu/package.sh): how the
# partitioned MLA BMM chooses between its two paths (one domain-aware launch of the TMA kernel, or
# a fork/join of cuBLASLt calls over the domains' streams; path_choice.h), and what each choice
# costs:
#   1. `cuda_gemm_bench --bmm` with LOCUS_PATH_CHOICE_LOG=1, ROUNDS times: each timed choice (key,
#      each path's time, the pick) beside the table's graph timings of both paths;
#   2. the same table with LOCUS_PATH_AUTOTUNE=0 (always the first path, the kernel);
#   3. the tiny model's decode with locality domains on, BF16 and NVFP4, with the choices logged,
#      then with LOCUS_PATH_AUTOTUNE=0; and with domains off for reference.
# Logs go to $OUT (or /tmp/locus-bmm-choice); summary.txt comes last.
# usage: tools/gpu/bmm_choice.sh [--rounds N]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/locus-bmm-choice}"
mkdir -p "$OUT"
source tools/gpu/carry_env.sh  # CARRY, LD_LIBRARY_PATH
rounds=2
while (($#)); do
  case "$1" in
    --rounds) rounds="$2"; shift ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
  shift
done
: > "$OUT/summary.txt"
note() { echo "$1" | tee -a "$OUT/summary.txt"; }

for r in $(seq 1 "$rounds"); do
  LOCUS_PATH_CHOICE_LOG=1 timeout 150 "$CARRY/cuda_gemm_bench" --bmm --out "$OUT/bmm_round$r.md" \
    > "$OUT/bmm_round$r.log" 2>&1
  note "cuda_gemm_bench --bmm round $r: exit $?"
  grep '^locus: path choice' "$OUT/bmm_round$r.log" | sed 's/^locus: path choice //' >> "$OUT/summary.txt"
  grep '^| 128' "$OUT/bmm_round$r.md" >> "$OUT/summary.txt"
done
LOCUS_PATH_AUTOTUNE=0 timeout 150 "$CARRY/cuda_gemm_bench" --bmm --out "$OUT/bmm_kernel_always.md" \
  > "$OUT/bmm_kernel_always.log" 2>&1
note "cuda_gemm_bench --bmm, LOCUS_PATH_AUTOTUNE=0: exit $?"
grep '^| 128' "$OUT/bmm_kernel_always.md" >> "$OUT/summary.txt"

TINY="$(mktemp -d)/tiny"
"$CARRY/locus" make-tiny-model "$TINY/bf16" --seed 1 > /dev/null 2>&1 &&
  "$CARRY/locus" make-tiny-model "$TINY/nvfp4" --nvfp4 --seed 1 > /dev/null 2>&1 || note "make-tiny-model FAILED"
prompts=(--prompt "Locality domains split a GPU" --prompt "abc" --prompt "DeepSeek" --prompt "x")
for fmt in bf16 nvfp4; do
  for mode in off on on_kernel_always; do
    env=(LOCUS_PATH_CHOICE_LOG=1); ld=()
    [[ $mode != off ]] && ld=(--enable-locality-domains --locality-domains-emulate 2)
    [[ $mode == on_kernel_always ]] && env+=(LOCUS_PATH_AUTOTUNE=0)
    for rep in 1 2; do
      env "${env[@]}" timeout 120 "$CARRY/locus" generate --model "$TINY/$fmt" --backend cuda "${prompts[@]}" \
        --max-new-tokens 64 --quiet "${ld[@]}" > "$OUT/generate_${fmt}_${mode}_$rep.log" 2>&1
      note "generate $fmt LD $mode rep $rep: exit $?, $(grep -o 'decode [^;]*' "$OUT/generate_${fmt}_${mode}_$rep.log" | tail -1)"
    done
    grep '^locus: path choice' "$OUT/generate_${fmt}_${mode}_1.log" | sed 's/^locus: path choice /  /' >> "$OUT/summary.txt"
  done
done
echo "==== summary"
cat "$OUT/summary.txt"
