# Sourced by the GPU machine's scripts that run the tiny model (after carry_env.sh): the prompts
# of their decode runs (one list, so that their tokens/s compare), and two helpers:
#   make_tiny_models DIR LOG  writes the BF16 tiny model to DIR/bf16 and the NVFP4 one to
#                             DIR/nvfp4 (seed 1), their output appended to LOG;
#   set_ld_flags off|on...    sets ld_flags to the flags for locality domains off, or on (any
#                             word starting with "on": 2 emulated domains).
tiny_prompts=(--prompt "Locality domains split a GPU" --prompt "abc" --prompt "DeepSeek" --prompt "x")
# The decode runs at DeepSeek-V3's widths (e2e_floor.sh, decode_ab.sh): batch N takes the first N.
all_prompts=("Locality domains split a GPU" "abc" "DeepSeek" "x" "the weights of a layer" "MLA attention" "experts"
             "one two three four")
# set_prompts N: prompts=(--prompt P ...) for the first N of all_prompts (a batch of N sequences).
set_prompts() {
  prompts=()
  for ((i = 0; i < $1; ++i)); do prompts+=(--prompt "${all_prompts[i]}"); done
}
make_tiny_models() {
  "$CARRY/locus" make-tiny-model "$1/bf16" --seed 1 >> "$2" 2>&1 &&
    "$CARRY/locus" make-tiny-model "$1/nvfp4" --nvfp4 --seed 1 >> "$2" 2>&1
}
set_ld_flags() {
  ld_flags=()
  [[ $1 == on* ]] && ld_flags=(--enable-locality-domains --locality-domains-emulate 2)
  return 0
}
