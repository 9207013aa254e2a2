#!/usr/bin/env bash
# Runs the Hugging Face logits parity check (tools/parity/hf_parity.py) against a locus
# executable. Needs python3 with torch and transformers 5.x (the GPU machine has them).
#   LOCUS_BIN=path/to/locus tools/parity/run_parity.sh [hf_parity.py args]   # use a built binary
#   tools/parity/run_parity.sh [args]        # builds build-parity/locus first (needs the build deps)
# Extra arguments go to hf_parity.py (e.g. --backends cuda --domains 4, or --self-test).
# A binary built elsewhere works when its shared libraries come along: put locus, liblocus.so and
# libyaml-cpp.so.0.7 in one folder and set LD_LIBRARY_PATH to it (how it ran on the H200).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -z "${LOCUS_BIN:-}" ]]; then
  BUILD_DIR="${BUILD_DIR:-build-parity}"
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DLOCUS_BUILD_TESTS=OFF -DLOCUS_BUILD_BENCH=OFF
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target locus
  LOCUS_BIN="$BUILD_DIR/locus"
fi
exec python3 tools/parity/hf_parity.py --locus "$LOCUS_BIN" "$@"
