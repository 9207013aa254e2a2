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
source tools/gpu/tiny_model_env.sh  # tiny_prompts, make_tiny_models, set_ld_flags
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
make_tiny_models "$TINY" "$OUT/make_tiny_models.log" || note "make-tiny-model FAILED (see $OUT/make_tiny_models.log)"
for fmt in bf16 nvfp4; do
  for mode in off on on_kernel_always; do
    env=(LOCUS_PATH_CHOICE_LOG=1)
    set_ld_flags "$mode"
    [[ $mode == on_kernel_always ]] && env+=(LOCUS_PATH_AUTOTUNE=0)
    for rep in 1 2; do
      env "${env[@]}" timeout 120 "$CARRY/locus" generate --model "$TINY/$fmt" --backend cuda "${tiny_prompts[@]}" \
        --max-new-tokens 64 --quiet "${ld_flags[@]}" > "$OUT/generate_${fmt}_${mode}_$rep.log" 2>&1
      note "generate $fmt LD $mode rep $rep: exit $?, $(grep -o 'decode [^;]*' "$OUT/generate_${fmt}_${mode}_$rep.log" | tail -1)"
    done
    grep '^locus: path choice' "$OUT/generate_${fmt}_${mode}_1.log" | sed 's/^locus: path choice /  /' >> "$OUT/summary.txt"
  done
done
echo "==== summary"
cat "$OUT/summary.txt"
