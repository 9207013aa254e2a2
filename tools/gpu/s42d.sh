#!/usr/bin/env bash
# Forty-second session, call 5 (branch s42-bmm): the MLA BMM's rank-claiming launch counts each
# CTA's arrival in a word of its own instead of one word for all. .gpu-carry: this branch's build
# (package.sh); .gpu-ab: main's 70142e2 liblocus.so (xz; its BMM code is main's) and benches. The
# BMM and MLA tests, then the BMM rows this build / main's library twice (in turn), and both
# builds' BMM timelines.
source "$(dirname "$0")/call_steps.sh"  # the repository root; CARRY, R, step, unpack_main_library
unpack_main_library  # MAINENV
step tests 120 $CARRY/locus_cuda_tests --gtest_brief=1 --gtest_filter='*Bmm*:*CudaMla*'
for r in 1 2; do
  step t$r.words 30 $CARRY/cuda_gemm_bench --bmm --m 1,8,16 --out $R/t$r.words.md
  step t$r.main 30 env "$MAINENV" .gpu-ab/cuda_gemm_bench --bmm --m 1,8,16 --out $R/t$r.main.md
done
step tl.words 30 $CARRY/cuda_bmm_timeline_bench --m 1,16
step tl.main 30 env "$MAINENV" $CARRY/cuda_bmm_timeline_bench --m 1,16
