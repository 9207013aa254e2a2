#!/usr/bin/env bash
# Runs on the GPU machine (from the repository root): the CUDA unit tests, then the GEMM
# benchmarks, from the binaries that tools/gpu/package.sh put into .gpu-carry/. Logs go to
# $OUT (or /tmp/locus-gpu); a short summary is printed last.
# usage: tools/gpu/run_all.sh [--quick] [--tests-only] [--split backfill|aligned]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/locus-gpu}"
mkdir -p "$OUT"
CARRY=.gpu-carry
quick=""; tests_only=0; split=backfill
while (($#)); do
  case "$1" in
    --quick) quick="--quick" ;;
    --tests-only) tests_only=1 ;;
    --split) split="$2"; shift ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
  shift
done
CUDA_LIBS=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$PWD/$CARRY:/usr/local/cuda/lib64:$CUDA_LIBS:${LD_LIBRARY_PATH:-}"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  echo "cuBLAS from: $CUDA_LIBS"
} 2>&1 | tee "$OUT/env.txt"
ldd "$CARRY/locus_cuda_tests" | grep -E "not found" && echo "MISSING LIBRARIES"

timeout 300 "$CARRY/locus_cuda_tests" --gtest_brief=0 2>&1 | tee "$OUT/tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |FAILED|Failure|error" | head -60
test_rc=${PIPESTATUS[0]}
echo "locus_cuda_tests exit code: $test_rc"
# The whole CPU suite too: its CudaLocality.* tests (topology, green-context domains, partitioned
# ops in a graph) only run where a GPU is present.
if [[ -x "$CARRY/locus_tests" ]]; then
  timeout 300 "$CARRY/locus_tests" --gtest_brief=1 2>&1 | tee "$OUT/locus_tests.log" | tail -n 15
  cpu_rc=${PIPESTATUS[0]}
  echo "locus_tests exit code: $cpu_rc"
  ((test_rc == 0)) && test_rc=$cpu_rc
fi
((tests_only)) && exit "$test_rc"

timeout 420 "$CARRY/cuda_gemm_bench" --split "$split" $quick --out "$OUT/bench_${split}.md" 2>&1 | tee "$OUT/bench_${split}.log" | tail -n 80
echo "bench exit code: ${PIPESTATUS[0]}"
grep -E "^\[  (PASSED|FAILED) " "$OUT/tests.log"
