#!/usr/bin/env bash
# Forty-first session, call 2 (branch s41-scratch: the NVFP4 domain-aware launch asks the stream's
# scratch once for its counters and claim words). .gpu-carry: this branch's build (package.sh);
# .gpu-ab: main's 70142e2 liblocus.so (xz; its kernels are main's) and benches. The CUDA tests that
# run the NVFP4 launches (domain-aware, traced, partitioned, MoE, model), then the decode-M table
# this build / main's library, twice.
source "$(dirname "$0")/call_steps.sh"  # the repository root; CARRY, R, step, unpack_main_library
unpack_main_library  # MAINENV
step tests 150 $CARRY/locus_cuda_tests --gtest_brief=1 --gtest_filter='*Nvfp4*:*ClaimedBlocks*:*PartitionedOps*:*Moe*:*CudaModel*'
for r in 1 2; do
  step t$r.scratch 30 $CARRY/cuda_gemm_bench --m 1,8 --out $R/t$r.scratch.md
  step t$r.main 30 env "$MAINENV" .gpu-ab/cuda_gemm_bench --m 1,8 --out $R/t$r.main.md
done
