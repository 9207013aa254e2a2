# Sourced by the per-session call scripts (tools/gpu/s*.sh): strict mode, the repository root as
# the working folder, carry_env.sh (CARRY, the library path); R, the results folder, packed into
# $OUT/r.tgz after every step (so a call cut short still returns what it ran); step NAME MAX
# CMD...: CMD under a MAX-second limit into $R/NAME.log, its exit status and seconds noted (and
# its log's last lines shown); at exit, the notes in $R/summary.txt.
# unpack_main_library: main's liblocus.so from .gpu-ab/ (xz) into /tmp/mainlib, and MAINENV, the
# library path that makes a binary load it (env "$MAINENV" BIN ...: an A/B in one call).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tools/gpu/carry_env.sh
R=/tmp/r; mkdir -p $R
summary=()
pack() { tar czf "$OUT/r.tgz" -C $R . 2>/dev/null; }
step() { local name=$1 max=$2; shift 2; local t0=$SECONDS
  timeout "$max" "$@" > "$R/$name.log" 2>&1; local rc=$?
  summary+=("$name rc=$rc $((SECONDS - t0))s"); echo "== $name rc=$rc $((SECONDS - t0))s"; tail -2 "$R/$name.log"; pack; }
trap 'printf "%s\n" "${summary[@]}" > $R/summary.txt; pack; cat $R/summary.txt' EXIT
unpack_main_library() {
  mkdir -p /tmp/mainlib
  xz -dc .gpu-ab/liblocus.so.xz > /tmp/mainlib/liblocus.so
  MAINENV="LD_LIBRARY_PATH=/tmp/mainlib:$LD_LIBRARY_PATH"
}
