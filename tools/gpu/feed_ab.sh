#!/usr/bin/env bash
# Runs on the GPU machine (from the repository root, binaries from tools/gpu/package.sh): the NVFP4
# streaming GEMM's two feeds side by side (StreamGemmTuning::feed; stream_gemm_tma_kernel.cu).
#   1. the streaming GEMM's GPU tests (both feeds), then the TMA feed's under compute-sanitizer
#      (memcheck, synccheck);
#   2. the timeline of every DeepSeek-V3 shape at M = 1 and 16 with the cp.async rings, the TMA
#      feed, and the TMA feed with 256 KB per CTA asked of L2 early, alternating, two rounds;
#   3. the K-split sweep (its last three columns are the TMA feed).
# Logs and tables go to $OUT (or /tmp/locus-feed-ab); a summary comes last.
# usage: tools/gpu/feed_ab.sh [--shape NxK] [--no-sanitizer]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/locus-feed-ab}"
mkdir -p "$OUT"
CARRY=.gpu-carry
shape=(); sanitize=1
while (($#)); do
  case "$1" in
    --shape) shape=(--shape "$2"); shift ;;
    --no-sanitizer) sanitize=0 ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
  shift
done
CUDA_LIBS=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$PWD/$CARRY:/usr/local/cuda/lib64:$CUDA_LIBS:${LD_LIBRARY_PATH:-}"
summary=()
note() { summary+=("$1"); echo "$1"; }

timeout 240 "$CARRY/locus_cuda_tests" --gtest_brief=1 --gtest_filter='CudaStreamGemm*:CudaStreamDomains*' \
  > "$OUT/tests.log" 2>&1
note "streaming GEMM tests: exit $?, $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/tests.log" | head -3 | tr '\n' ' ')"
if ((sanitize)); then
  SAN=/usr/local/cuda/bin/compute-sanitizer
  for tool in memcheck synccheck; do
    timeout 240 "$SAN" --tool "$tool" --error-exitcode 9 "$CARRY/locus_cuda_tests" --gtest_brief=1 \
      --gtest_filter='CudaStreamGemmTma*' > "$OUT/sanitizer_$tool.log" 2>&1
    note "compute-sanitizer $tool (TMA feed tests): exit $?, $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1)"
  done
fi
# Variants: the cp.async rings; the TMA feed; the TMA feed asking L2 for 256 KB more per CTA early.
for round in 1 2; do
  for variant in "0 0" "1 0" "1 256"; do
    set -- $variant
    name="feed$1_prefetch$2"
    timeout 150 "$CARRY/cuda_stream_timeline_bench" "${shape[@]}" --m 1,16 --tuning "0,0,0,1,$2,$1" \
      > "$OUT/timeline_${name}_round$round.md" 2>&1
    note "timeline $name round $round: exit $?, $OUT/timeline_${name}_round$round.md"
  done
done
timeout 200 "$CARRY/cuda_gemm_bench" --sweep --quick --m 1 "${shape[@]}" > "$OUT/sweep.log" 2>&1
note "sweep: exit $?, $OUT/sweep.log"
echo "==== summary ($OUT)"
printf '%s\n' "${summary[@]}"
