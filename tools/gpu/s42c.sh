#!/usr/bin/env bash
# Forty-second session, call 4 (branch s42-scratch): the NVFP4 domain-aware launch asks the
# stream's scratch for claim words only where it may claim. The CUDA tests that run the NVFP4
# launches (domain-aware, traced, partitioned, MoE, model), then the decode-M table once.
source "$(dirname "$0")/call_steps.sh"  # the repository root; CARRY, R, step
step tests 150 $CARRY/locus_cuda_tests --gtest_brief=1 --gtest_filter='*Nvfp4*:*ClaimedBlocks*:*PartitionedOps*:*Moe*:*CudaModel*'
step t1 30 $CARRY/cuda_gemm_bench --m 1,8 --out $R/t1.md
