#!/usr/bin/env bash
# Forty-second session, call 4 (branch s42-scratch): the NVFP4 domain-aware launch asks the
# stream's scratch for claim words only where it may claim. The CUDA tests that run the NVFP4
# launches (domain-aware, traced, partitioned, MoE, model), then the decode-M table once.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/carry_env.sh
R=/tmp/r; mkdir -p $R
summary=()
pack() { tar czf "$OUT/r.tgz" -C $R . 2>/dev/null; }
step() { local name=$1 max=$2; shift 2; local t0=$SECONDS
  timeout "$max" "$@" > "$R/$name.log" 2>&1; local rc=$?
  summary+=("$name rc=$rc $((SECONDS - t0))s"); echo "== $name rc=$rc $((SECONDS - t0))s"; tail -2 "$R/$name.log"; pack; }
trap 'printf "%s\n" "${summary[@]}" > $R/summary.txt; pack; cat $R/summary.txt' EXIT
step tests 150 $CARRY/locus_cuda_tests --gtest_brief=1 --gtest_filter='*Nvfp4*:*ClaimedBlocks*:*PartitionedOps*:*Moe*:*CudaModel*'
step t1 30 $CARRY/cuda_gemm_bench --m 1,8 --out $R/t1.md
