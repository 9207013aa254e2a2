#!/usr/bin/env bash
# On the GPU machine: one Nsight Compute profile (--set full, source imported) of a kernel that a
# command launches, then its sections and its per-source-line and per-instruction metrics (stall
# samples) as CSV, for reading where a latency-bound kernel waits.
# usage: tools/gpu/ncu_kernel.sh NAME_REGEX SKIP OUT_PREFIX -- command [args...]
#   e.g. tools/gpu/ncu_kernel.sh attn_tc_kernel 5 $OUT/attn -- .gpu-carry/cuda_attention_bench --batches 1 --keys 64
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/carry_env.sh  # LD_LIBRARY_PATH
(($# >= 5)) && [[ $4 == -- ]] || { echo "usage: $0 NAME_REGEX SKIP OUT_PREFIX -- command [args...]"; exit 2; }
name=$1; skip=$2; prefix=$3; shift 4
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[[ -n $NCU ]] || { echo "no ncu on this machine"; exit 1; }
timeout 300 "$NCU" --clock-control none -k "regex:$name" -s "$skip" -c 1 --set full --import-source yes \
  -f -o "$prefix" "$@" > "$prefix.run.txt" 2>&1 || { echo "ncu failed:"; tail -5 "$prefix.run.txt"; exit 1; }
"$NCU" -i "$prefix.ncu-rep" --page details > "$prefix.details.txt" 2>&1
"$NCU" -i "$prefix.ncu-rep" --page source --csv --print-source cuda > "$prefix.source_cuda.csv" 2>&1
"$NCU" -i "$prefix.ncu-rep" --page source --csv --print-source sass > "$prefix.source_sass.csv" 2>&1
grep -E "Duration|Elapsed Cycles|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issued Ipc|Stall|No Eligible|Grid Size|Block Size" \
  "$prefix.details.txt" | head -30
