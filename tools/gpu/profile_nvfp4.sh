#!/usr/bin/env bash
# On the GPU machine: instruction mix of the M <= 8 NVFP4 kernel (cuobjdump) and a short Nsight
# Compute profile of its first launches (7168 x 7168, M = 1) from the benchmark. Writes to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/locus-gpu}"
mkdir -p "$OUT"
source tools/gpu/carry_env.sh  # CARRY, LD_LIBRARY_PATH
OBJ=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null)
if [ -n "$OBJ" ]; then
  "$OBJ" -sass .gpu-carry/liblocus.so > "$OUT/sass_all.txt" 2>&1
  awk '/Function : .*nvfp4_gemm_kernelILi1ELi8ELb0/{on=1} on&&/Function : /&&!/ILi1ELi8ELb0/{on=0} on' "$OUT/sass_all.txt" > "$OUT/sass_nvfp4_m1.txt"
  echo "SASS mix of nvfp4_gemm_kernel<1,8,false>:"
  for op in LDG HMMA HFMA2 LOP3 SHF IMAD IADD3 BAR MEMBAR ATOM BRA; do
    printf "  %-7s %s\n" "$op" "$(grep -c "\b$op" "$OUT/sass_nvfp4_m1.txt")"
  done
  rm -f "$OUT/sass_all.txt"
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  timeout 240 "$NCU" --clock-control none -k regex:nvfp4_gemm_kernel -c 2 --section SpeedOfLight \
    --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis \
    .gpu-carry/cuda_gemm_bench --quick > "$OUT/ncu_nvfp4.txt" 2>&1
  grep -E "DRAM Throughput|Memory Throughput|Duration|Achieved Occupancy|Stall|Warp Cycles Per Issued|Compute \(SM\)|Theoretical Occupancy|One or More|No Eligible" "$OUT/ncu_nvfp4.txt" | head -40
fi
