#!/usr/bin/env bash
# Runs on the GPU machine (from the repository root, binaries from tools/gpu/package.sh): an A/B of
# decode speed end to end. The NVFP4 model at DeepSeek-V3's widths (as tools/gpu/e2e_floor.sh
# makes it: LAYERS layers, EXPERTS routed experts) decodes with --cuda-graphs under each of the
# given environment settings in turn, ROUNDS times (alternating, so that the device's drift falls
# on every setting alike); each line of the table is one `locus generate`, decode tok/s. A
# setting's words that start with "--" are added to that run's flags (e.g. "--decode-lookahead";
# a flag's value joined by "=": "--locality-domains-emulate=2"); its other words are its environment.
# usage: tools/gpu/decode_ab.sh [--layers L] [--experts E] [--tokens N] [--batches "1 2"] [--rounds R]
#                               [--models DIR] [--flags "..."] -- "VAR=A" "VAR=B" ...   ("" is the default)
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/carry_env.sh  # CARRY, LD_LIBRARY_PATH
source tools/gpu/tiny_model_env.sh  # all_prompts, set_prompts
layers=3; experts=32; tokens=256; batches="1"; rounds=3; models=""; flags="--cuda-graphs"
while (($#)); do
  case "$1" in
    --layers) layers="$2"; shift ;;
    --experts) experts="$2"; shift ;;
    --tokens) tokens="$2"; shift ;;
    --batches) batches="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --models) models="$2"; shift ;;
    --flags) flags="$2"; shift ;;
    --) shift; break ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
  shift
done
(($#)) || { echo "usage: $0 [options] -- \"VAR=A\" \"VAR=B\" ..."; exit 2; }
# A setting's words that start with "--" are flags of its runs (extra), the VAR=value ones their
# environment (envs); returns 1 for any other word.
split_setting() {
  envs=(); extra=()
  local word
  for word in $1; do
    if [[ $word == --* ]]; then extra+=("$word")
    elif [[ $word == *=* ]]; then envs+=("$word")
    else echo "setting '$1': '$word' is neither a --flag nor VAR=value (join a flag's value with '=')"; return 1
    fi
  done
}
for setting in "$@"; do split_setting "$setting" || exit 2; done
dir="${models:-$(mktemp -d)}/nvfp4"
if [[ ! -f "$dir/config.json" ]]; then
  "$CARRY/locus" make-tiny-model "$dir" --shape deepseek-v3 --layers "$layers" --experts "$experts" --seed 1 --nvfp4 \
    > /dev/null || { echo "make-tiny-model failed"; exit 1; }
fi
echo "Device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); $(date -u '+%Y-%m-%d %H:%M UTC');" \
     "NVFP4, DeepSeek-V3 widths, $layers layers, $experts experts; $tokens new tokens per sequence; $flags"
echo
echo "| batch | setting | round | decode tok/s |"
echo "|---|---|---|---|"
rc=0
for batch in $batches; do
  ((batch >= 1 && batch <= ${#all_prompts[@]})) || { echo "--batches: $batch is not in 1..${#all_prompts[@]}"; exit 2; }
  set_prompts "$batch"
  for ((r = 1; r <= rounds; ++r)); do
    for setting in "$@"; do
      split_setting "$setting"
      out=$(timeout 300 env "${envs[@]}" "$CARRY/locus" generate --model "$dir" --backend cuda "${prompts[@]}" \
              --max-new-tokens "$tokens" --ignore-eos --warmup --quiet $flags "${extra[@]}" 2>&1 >/dev/null)
      tps=$(sed -n -E 's/^locus: [0-9].*decode [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/p' <<< "$out")
      [[ -n "$tps" ]] || { tps="FAILED"; rc=1; echo "$out" | tail -3 >&2; }
      echo "| $batch | ${setting:-default} | $r | $tps |"
    done
  done
done
exit "$rc"
