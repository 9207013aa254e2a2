#!/usr/bin/env bash
# Installs dependencies, builds Locus, writes the embedded tiny DeepSeek-V3-shaped model and
# generates text with it. This is the README's main command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
BUILD_DIR="${BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$(nproc)" --target locus
MODEL_DIR="${MODEL_DIR:-$BUILD_DIR/tiny-deepseek-v3}"
"$BUILD_DIR/locus" make-tiny-model "$MODEL_DIR"
"$BUILD_DIR/locus" generate --model "$MODEL_DIR" --prompt "Locality domains" --max-new-tokens 24 "$@"
