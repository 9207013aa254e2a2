#!/usr/bin/env bash
# Builds the CUDA tests and benchmarks on this (GPU-less) machine and copies them, with the
# non-CUDA shared libraries they need, into .gpu-carry/ (git-ignored) for the device machine.
# usage: tools/gpu/package.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD="${1:-build-cuda}"
cmake -S . -B "$BUILD" -DLOCUS_CUDA=ON -DLOCUS_BUILD_BENCH=ON -G Ninja >/dev/null
# What the device runs: tests, benchmarks and probes, the CLI.
BINS=(locus_cuda_tests cuda_gemm_bench cuda_forkjoin_bench cuda_stream_probe cuda_row_copy_probe cuda_green_overlap_probe
      cuda_bmm_timeline_bench cuda_stream_timeline_bench cuda_gemv_timeline_bench cuda_moe_experts_bench cuda_attention_bench locus_tests locus)
cmake --build "$BUILD" -j2 --target "${BINS[@]}"
grep -qx '/.gpu-carry/' .git/info/exclude 2>/dev/null || echo '/.gpu-carry/' >> .git/info/exclude
rm -rf .gpu-carry && mkdir -p .gpu-carry
for bin in "${BINS[@]}" liblocus.so; do cp "$BUILD/$bin" .gpu-carry/; done
# The kernel tracer (LD_PRELOAD) and the CUPTI it needs, which the device's image may not have.
cmake --build "$BUILD" -j2 --target cuda_kernel_trace
cp "$BUILD/libcuda_kernel_trace.so" .gpu-carry/
cp -L "$(ldd "$BUILD/libcuda_kernel_trace.so" | awk '/libcupti/ {print $3}')" .gpu-carry/
# Non-CUDA, non-libc dependencies (yaml-cpp, httplib, ...); cuBLAS/cudart come from the device.
for lib in $(ldd "$BUILD"/liblocus.so "$BUILD"/locus_cuda_tests "$BUILD"/locus_tests "$BUILD"/locus | awk '/=>/ {print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libgcc_s.so*|libstdc++.so*|libcuda*|libcublas*|liblocus.so) ;;
    *) cp -L "$lib" .gpu-carry/ ;;
  esac
done
du -sh .gpu-carry
