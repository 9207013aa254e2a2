#!/usr/bin/env bash
# Runs on the GPU machine (from the repository root), from .gpu-carry/ (tools/gpu/package.sh):
# writes the tiny model, starts `locus serve --backend cuda` (BACKEND=cpu: the CPU one) with locality domains off and then
# on (2 emulated domains), and sends it a greedy completion, four concurrent chat requests and a
# bad request. Prints one line per answer; the two greedy completions must be equal.
# usage: tools/gpu/serve_smoke.sh [port]
set -uo pipefail
cd "$(dirname "$0")/../.."
PORT="${1:-18123}"
BACKEND="${BACKEND:-cuda}"  # BACKEND=cpu runs the same checks without a GPU
source tools/gpu/carry_env.sh  # CARRY, LD_LIBRARY_PATH
source tools/gpu/tiny_model_env.sh  # set_ld_flags
T=$(mktemp -d)
"$CARRY/locus" make-tiny-model "$T/tiny" --seed 1 > /dev/null || exit 1
field() { python3 -c 'import json, sys; j = json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }
completions=()
for ld in off on; do
  set_ld_flags "$ld"
  "$CARRY/locus" serve --model "$T/tiny" --backend "$BACKEND" --port "$PORT" --quiet "${ld_flags[@]}" > "$T/serve_$ld.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 60); do curl -s "localhost:$PORT/health" > /dev/null && break; sleep 1; done
  c=$(curl -s "localhost:$PORT/v1/completions" \
        -d '{"model": "tiny", "prompt": "Locality domains", "max_tokens": 16, "temperature": 0}' | field 'repr(j["choices"][0]["text"])')
  completions+=("$c")
  echo "LD $ld: greedy completion $c"
  pids=()
  for i in 1 2 3 4; do
    curl -s "localhost:$PORT/v1/chat/completions" \
      -d '{"model": "tiny", "messages": [{"role": "user", "content": "hi '"$i"'"}], "max_tokens": 12, "seed": 7}' > "$T/chat$i.json" &
    pids+=($!)
  done
  wait "${pids[@]}"
  for i in 1 2 3 4; do
    echo "LD $ld: chat $i: $(field 'j["choices"][0]["finish_reason"] + ", " + str(j["usage"]["completion_tokens"]) + " tokens"' < "$T/chat$i.json")"
  done
  echo "LD $ld: bad request: $(curl -s "localhost:$PORT/v1/completions" -d '{"model": "tiny", "prompt": "x", "top_p": 3}')"
  kill -TERM "$pid"; wait "$pid"
done
[[ "${completions[0]}" == "${completions[1]}" ]] && echo "greedy completions LD off == LD on: PASS" || { echo "greedy completions differ: FAIL"; exit 1; }
