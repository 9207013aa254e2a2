#!/usr/bin/env bash
# Runs on the GPU machine (from the repository root, binaries from tools/gpu/package.sh): is the
# TMA feed of the NVFP4 streaming GEMM (StreamGemmTuning::feed = 1) slow for want of bytes in
# flight? Times its timeline on one shape at M = 1 and 16 for every ring depth that fits, with 8
# and with 16 consumer warps, with and without an L2 prefetch of 256 KB per CTA ahead of the
# rings; the cp.async rings for reference. If the streaming time falls with depth or prefetch, the
# feed is latency bound (its stages turn around slowly); if flat, the copies' issue or the
# dequantizing warps limit it. (A CTA count of 264 in a table means the TMA feed declined the
# depth and the rings ran.) Then cuda_stream_probe --producer: a producer warp issuing 1 or 3
# copies per stage against each consumer warp's lane 0 issuing its own. Tables go to $OUT (or
# /tmp/locus-tma-depth).
# usage: tools/gpu/tma_depth.sh [--shape NxK]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/locus-tma-depth}"
mkdir -p "$OUT"
source tools/gpu/carry_env.sh  # CARRY, LD_LIBRARY_PATH
shape=18432x7168
[[ ${1:-} == --shape ]] && shape=$2
timeline() {  # timeline NAME TUNING
  echo "== $1 (--tuning $2)"
  timeout 60 "$CARRY/cuda_stream_timeline_bench" --shape "$shape" --m 1,16 --tuning "$2" | tail -n +3
}
{
  timeline rings 0,0,0,1,0,0
  for s in 2 3 4 5 6; do timeline "tma8 stages $s" "0,8,$s,1,0,1"; done
  timeline "tma8 prefetch 256 KB" 0,8,0,1,256,1
  for s in 2 3 4; do timeline "tma16 stages $s" "0,16,$s,1,0,1"; done
  timeline "tma16 prefetch 256 KB" 0,16,0,1,256,1
} > "$OUT/tma_depth.md" 2>&1
# The same question apart from the GEMM: a producer warp's copies against each consumer warp's own.
timeout 120 "$CARRY/cuda_stream_probe" --producer > "$OUT/stream_probe_producer.md" 2>&1
cat "$OUT/tma_depth.md" "$OUT/stream_probe_producer.md"
