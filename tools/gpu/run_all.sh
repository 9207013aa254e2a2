#!/usr/bin/env bash
# Runs on the GPU machine (from the repository root), from the binaries that tools/gpu/package.sh
# put into .gpu-carry/: the CUDA unit tests and the whole CPU suite (its CLI tests start
# .gpu-carry/locus through LOCUS_BIN), then the model end to end on the GPU (make-tiny-model;
# generate --backend cuda for BF16 and NVFP4 with locality domains off and on, tokens/s;
# logits CUDA vs CPU; NVFP4 also with LOCUS_NVFP4_ROW_BLOCKS=0), then the GEMM benchmarks and the BMM and NVFP4 kernels' timelines (the
# BMM's also with its ring never sized for the next launch beside, the NVFP4 one for both feeds). Logs go to $OUT
# (or /tmp/locus-gpu); each step prints a line or two, and a summary comes last.
# usage: tools/gpu/run_all.sh [--quick] [--tests-only] [--e2e-only] [--split backfill|aligned]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/locus-gpu}"
mkdir -p "$OUT"
source tools/gpu/carry_env.sh  # CARRY, LD_LIBRARY_PATH
source tools/gpu/tiny_model_env.sh  # tiny_prompts, make_tiny_models, set_ld_flags
source tools/gpu/logits_env.sh  # logits_vs_cpu
quick=""; tests=1; e2e=1; bench=1; split=backfill
while (($#)); do
  case "$1" in
    --quick) quick="--quick" ;;
    --tests-only) e2e=0; bench=0 ;;
    --e2e-only) tests=0; bench=0 ;;
    --split) split="$2"; shift ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
  shift
done
export LOCUS_BIN="$PWD/$CARRY/locus"  # the CLI tests start this, not the build machine's path
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
} > "$OUT/env.txt" 2>&1
head -2 "$OUT/env.txt"
ldd "$CARRY/locus_cuda_tests" | grep -E "not found" && echo "MISSING LIBRARIES"

summary=()
rc=0
note() { summary+=("$1"); echo "$1"; }

if ((tests)); then
  timeout 300 "$CARRY/locus_cuda_tests" --gtest_brief=1 > "$OUT/tests.log" 2>&1
  t_rc=$?
  grep -E "^\[  FAILED  \]|Failure$" "$OUT/tests.log" | head -20
  note "locus_cuda_tests: exit $t_rc, $(grep -E '^\[  PASSED  \]' "$OUT/tests.log" | head -1)"
  # The whole CPU suite too: its CudaLocality.* tests (topology, green-context domains,
  # partitioned ops in a graph) only run where a GPU is present.
  timeout 300 "$CARRY/locus_tests" --gtest_brief=1 > "$OUT/locus_tests.log" 2>&1
  c_rc=$?
  grep -E "^\[  FAILED  \]" "$OUT/locus_tests.log" | head -20
  note "locus_tests: exit $c_rc, $(grep -E '^\[  PASSED  \]' "$OUT/locus_tests.log" | head -1)"
  ((t_rc || c_rc)) && rc=1
fi

if ((e2e)); then
  LOG="$OUT/e2e.log"; : > "$LOG"
  TINY="$(mktemp -d)/tiny"  # not under $OUT: the checkpoints need not come back
  rm -rf "$TINY"
  make_tiny_models "$TINY" "$LOG" || { note "make-tiny-model FAILED (see $LOG)"; rc=1; }
  for fmt in bf16 nvfp4; do
    for ld in off on; do
      set_ld_flags "$ld"
      echo "== generate cuda $fmt LD $ld" >> "$LOG"
      timeout 300 "$LOCUS_BIN" generate --model "$TINY/$fmt" --backend cuda "${tiny_prompts[@]}" \
        --max-new-tokens 64 --quiet "${ld_flags[@]}" > "$OUT/generate.out" 2>&1
      g_rc=$?
      cat "$OUT/generate.out" >> "$LOG"
      line=$(grep '^locus: .*tok/s' "$OUT/generate.out" | tail -1)
      if [[ $g_rc -eq 0 && -n "$line" ]]; then
        # "locus: 4 sequences, ...; prompt N tokens in S s (X tok/s); decode M tokens in S s (Y tok/s); ..."
        note "generate cuda $fmt LD $ld: $(sed -E 's/.*; (prompt [^;]*); (decode [^;]*);.*/\1; \2/' <<< "$line")"
      else
        note "generate cuda $fmt LD $ld: FAILED (see $LOG)"; rc=1
      fi
    done
    logits_vs_cpu "$TINY/$fmt" "$fmt" "$LOG" || rc=1
    for res in "${logits_results[@]}"; do note "$res"; done
  done
fi

if ((bench)); then
  timeout 420 "$CARRY/cuda_gemm_bench" --split "$split" $quick --out "$OUT/bench_${split}.md" > "$OUT/bench_${split}.log" 2>&1
  note "cuda_gemm_bench: exit $?, table in $OUT/bench_${split}.md"
  timeout 120 "$CARRY/cuda_bmm_timeline_bench" --split "$split" > "$OUT/bmm_timeline_${split}.md" 2>&1
  note "cuda_bmm_timeline_bench: exit $?, table in $OUT/bmm_timeline_${split}.md"
  # The same with the ring never sized for the next launch beside (BmmTmaTuning::beside_next = 0;
  # by default it is, where a launch spans several domains).
  timeout 120 "$CARRY/cuda_bmm_timeline_bench" --split "$split" --bmm-tuning 0,0,1,256,1,2,0 \
    > "$OUT/bmm_timeline_${split}_apart.md" 2>&1
  note "cuda_bmm_timeline_bench, ring never beside the next launch: exit $?, table in $OUT/bmm_timeline_${split}_apart.md"
  timeout 120 "$CARRY/cuda_stream_timeline_bench" > "$OUT/stream_timeline.md" 2>&1
  note "cuda_stream_timeline_bench: exit $?, table in $OUT/stream_timeline.md"
  timeout 120 "$CARRY/cuda_stream_timeline_bench" --tuning 0,0,0,1,0,1 > "$OUT/stream_timeline_tma.md" 2>&1
  note "cuda_stream_timeline_bench, TMA feed: exit $?, table in $OUT/stream_timeline_tma.md"
fi

echo "==== summary ($OUT)"
printf '%s\n' "${summary[@]}"
exit "$rc"
