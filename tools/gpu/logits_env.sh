# Sourced by the GPU machine's scripts (after carry_env.sh and tiny_model_env.sh): one helper,
#   logits_vs_cpu DIR FMT LOG   `locus logits` of the model in DIR on a few fixed prompts, on the
#                               CPU (locality domains off) and on CUDA (off; on; with FMT nvfp4
#                               also LOCUS_NVFP4_ROW_BLOCKS=0), dumps in $OUT, output appended to
#                               LOG; then each CUDA run against the CPU, and LD on against LD off;
#                               then the MoE routing of CUDA (LD off) against the CPU's
#                               (LOCUS_ROUTING_DUMP, tools/gpu/compare_routing.py): which tokens
#                               chose other experts, and whether by near-ties.
#                               The result lines go to the array logits_results; it returns 1
#                               when a run failed or a comparison is above tolerance.
logits_vs_cpu() {
  local dir=$1 fmt=$2 log=$3 failed=0 run backend ld tag envs pair a b res dump
  local ids=(--ids 1,2,3,4,5,6,7,8 --ids 9 --ids 200,17,33)
  local runs=("cpu off off" "cuda off off" "cuda on on")
  local pairs=("cuda_off cpu_off" "cuda_on cuda_off")
  if [[ $fmt == nvfp4 ]]; then
    runs+=("cuda off off_perexpert LOCUS_NVFP4_ROW_BLOCKS=0")
    pairs+=("cuda_off_perexpert cpu_off")
  fi
  logits_results=()
  for run in "${runs[@]}"; do
    read -r backend ld tag envs <<< "$run"
    set_ld_flags "$ld"
    dump="$OUT/routing_${fmt}_${backend}_$tag.bin"
    rm -f "$dump"
    timeout 300 env LOCUS_ROUTING_DUMP="$dump" $envs "$CARRY/locus" logits --model "$dir" --backend "$backend" "${ids[@]}" --quiet \
      --out "$OUT/logits_${fmt}_${backend}_$tag.bin" "${ld_flags[@]}" >> "$log" 2>&1 ||
      { logits_results+=("logits $fmt $backend LD $tag: FAILED (see $log)"); failed=1; }
  done
  for pair in "${pairs[@]}"; do
    read -r a b <<< "$pair"
    res=$(python3 tools/gpu/compare_logits.py "$OUT/logits_${fmt}_$a.bin" "$OUT/logits_${fmt}_$b.bin" \
          --label "logits $fmt ${a/_/ LD } vs ${b/_/ LD }" 2>&1) || failed=1
    logits_results+=("$res")
  done
  a="$OUT/routing_${fmt}_cuda_off.bin"; b="$OUT/routing_${fmt}_cpu_off.bin"
  if [[ -s $a && -s $b ]]; then
    res=$(python3 tools/gpu/compare_routing.py "$a" "$b" 2>&1)
    printf '%s\n' "$res" >> "$log"
    logits_results+=("routing $fmt cuda LD off vs cpu: $(tail -1 <<< "$res")")
  fi
  return "$failed"
}
