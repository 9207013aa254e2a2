#!/usr/bin/env bash
# Builds the locus executable (CUDA backend when nvcc is present) and runs the Hugging Face logits
# parity check (tools/parity/hf_parity.py) on it. Needs python3 with torch and transformers 5.x.
# Extra arguments go to hf_parity.py (e.g. --backends cuda --domains 4, or --self-test).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR="${BUILD_DIR:-build-parity}"
if [[ ! -x "$BUILD_DIR/locus" || "${REBUILD:-1}" == "1" ]]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DLOCUS_BUILD_TESTS=OFF -DLOCUS_BUILD_BENCH=OFF
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target locus
fi
exec python3 tools/parity/hf_parity.py --locus "$BUILD_DIR/locus" "$@"
