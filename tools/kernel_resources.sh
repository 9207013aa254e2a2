#!/usr/bin/env bash
# Registers, spills and static shared memory of every kernel in one CUDA source file, as ptxas
# reports them for the build's own compile command (no GPU needed).
# usage: tools/kernel_resources.sh src/backends/cuda/FILE.cu [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
src="$1"; build="${2:-build-cuda}"
[[ -f "$src" ]] || { echo "no such file: $src" >&2; exit 2; }
[[ -f "$build/build.ninja" ]] || { echo "no CUDA build in $build (tools/gpu/package.sh makes one)" >&2; exit 2; }
cmd=$(cd "$build" && ninja -t commands liblocus.so | grep -m1 -F "$src" || true)
[[ -n "$cmd" ]] || { echo "$src is not compiled into liblocus.so" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# The same command with its object written elsewhere (not over the build's), ptxas reporting.
cmd=$(sed -E 's/ -o [^ ]+/ /' <<< "$cmd")
(cd "$build" && eval "${cmd/ -c / -Xptxas -v -o $out -c }") 2>&1 |
  awk '/Compiling entry function/ { name = $0; sub(/.*function .?/, "", name); sub(/.? for .*/, "", name) }
       /bytes stack frame/ { frame = $0; sub(/^ +/, "", frame) }
       /Used [0-9]+ registers/ { line = $0; sub(/.*Used /, "", line); print name ": " line "; " frame }' |
  c++filt | sed -E 's/locus::cuda::detail::(\(anonymous namespace\)::)?//g'
