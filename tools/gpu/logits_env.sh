# Sourced by the GPU machine's scripts (after carry_env.sh and tiny_model_env.sh): one helper,
#   logits_vs_cpu DIR FMT LOG   `locus logits` of the model in DIR on a few fixed prompts, on the
#                               CPU (locality domains off) and on CUDA (off; on; with FMT nvfp4
#                               also LOCUS_NVFP4_ROW_BLOCKS=0), dumps in $OUT, output appended to
#                               LOG. The MoE routing of a random model has near-ties that BF16
#                               rounding flips, so each CUDA run is checked against a CPU run that
#                               follows its routing (LOCUS_ROUTING_REPLAY of its
#                               LOCUS_ROUTING_DUMP); then CUDA (LD off) against the CPU and LD on
#                               against LD off, each with its own routing (informative), and their
#                               routings compared (tools/gpu/compare_routing.py): which tokens
#                               chose other experts, and whether by near-ties.
#                               The result lines go to the array logits_results; it returns 1
#                               when a run failed, a check is above tolerance, or a routing
#                               difference is not explained by rounding.
logits_vs_cpu() {
  local dir=$1 fmt=$2 log=$3 failed=0 run backend ld tag envs pair a b label res dump
  local ids=(--ids 1,2,3,4,5,6,7,8 --ids 9 --ids 200,17,33)
  # CPU runs that replay a CUDA run's routing come after that run.
  local runs=("cpu off off" "cuda off off" "cuda on on"
              "cpu off replay_cuda_off LOCUS_ROUTING_REPLAY=$OUT/routing_${fmt}_cuda_off.bin"
              "cpu off replay_cuda_on LOCUS_ROUTING_REPLAY=$OUT/routing_${fmt}_cuda_on.bin")
  # Pairs "A|B|label": the checks that decide (each CUDA run against the CPU following its routing).
  local pairs=("cuda_off|cpu_replay_cuda_off|cuda LD off vs cpu following its routing"
               "cuda_on|cpu_replay_cuda_on|cuda LD on vs cpu following its routing")
  if [[ $fmt == nvfp4 ]]; then
    runs+=("cuda off off_perexpert LOCUS_NVFP4_ROW_BLOCKS=0"
           "cpu off replay_cuda_off_perexpert LOCUS_ROUTING_REPLAY=$OUT/routing_${fmt}_cuda_off_perexpert.bin")
    pairs+=("cuda_off_perexpert|cpu_replay_cuda_off_perexpert|cuda LD off, per expert vs cpu following its routing")
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
    IFS='|' read -r a b label <<< "$pair"
    res=$(python3 tools/gpu/compare_logits.py "$OUT/logits_${fmt}_$a.bin" "$OUT/logits_${fmt}_$b.bin" \
          --label "logits $fmt $label" 2>&1) || failed=1
    logits_results+=("$res")
  done
  # CUDA against the CPU's own routing: where the two chose other experts, by near-ties only
  # (compare_routing.py exits 0), a difference above tolerance is explained, and the pair above
  # that follows CUDA's routing decides; a routing difference rounding does not explain fails.
  own_routings cuda_off cpu_off "cuda LD off vs cpu LD off" "cuda LD off vs cpu" || failed=1
  # LD on against LD off: the same where they route alike (informative: a near-tie may route them
  # apart, as it may CUDA and the CPU).
  own_routings cuda_on cuda_off "cuda LD on vs cuda LD off" "cuda LD on vs LD off" || failed=1
  return "$failed"
}

# own_routings A B LOGITS_LABEL ROUTING_LABEL (inside logits_vs_cpu: fmt, log, logits_results): the
# logits of runs A and B, each with its own routing (informative), and their routings compared;
# returns 1 when a routing difference is not explained by rounding.
own_routings() {
  local a="$OUT/routing_${fmt}_$1.bin" b="$OUT/routing_${fmt}_$2.bin" res rc
  [[ -s $a && -s $b ]] || return 0
  res=$(python3 tools/gpu/compare_routing.py "$a" "$b" 2>&1); rc=$?
  printf '%s\n' "$res" >> "$log"
  logits_results+=("$(python3 tools/gpu/compare_logits.py "$OUT/logits_${fmt}_$1.bin" "$OUT/logits_${fmt}_$2.bin" \
                      --label "logits $fmt $3 (each its own routing; informative)" 2>&1)")
  logits_results+=("routing $fmt $4: $(tail -1 <<< "$res")")
  return "$rc"
}
