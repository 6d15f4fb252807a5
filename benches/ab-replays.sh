#!/usr/bin/env bash
# A/B of the replay workloads between two `radixkv` binaries, alternating, N rounds; one
# JSON line per run (workload, side, round, wall_s, hit tokens, match/insert p50, evict p99).
#
#   OLD=/path/to/old/radixkv NEW=target/release/radixkv N=5 benches/ab-replays.sh > ab.jsonl
#
# The trace: $TRACE, else ../shared/traces/mooncake_synthetic_trace.jsonl beside the
# checkout. BENCHMARKS.md's "before/after" tables take the medians of wall_s per workload.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OLD=${OLD:?OLD: the baseline radixkv binary}
NEW=${NEW:-target/release/radixkv}
T=${TRACE:-../shared/traces/mooncake_synthetic_trace.jsonl}
N=${N:-5}
declare -a W=(
  "builtin|replay --json"
  "mooncake_unlimited_p16|replay --trace $T --page-size 16 --json"
  "mooncake_2M_p16|replay --trace $T --page-size 16 --capacity 2000000 --json"
  "mooncake_2M_p1|replay --trace $T --capacity 2000000 --json"
  "tier_write_through_p16|replay --trace $T --page-size 16 --capacity 2000000 --host-capacity 20000000 --write-policy write_through --json"
  "tier_selective_p16|replay --trace $T --page-size 16 --capacity 2000000 --host-capacity 20000000 --json"
)
for r in $(seq 1 "$N"); do
  for w in "${W[@]}"; do
    name=${w%%|*}
    args=${w#*|}
    for side in old new; do
      bin=$OLD
      [ "$side" = new ] && bin=$NEW
      # shellcheck disable=SC2086 # the workload's arguments split on purpose
      out=$("$bin" $args 2>/dev/null)
      python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(json.dumps({'w':'$name','side':'$side','round':$r,'wall_s':d.get('wall_s'),'hit_tokens':d.get('hit_tokens'),'match_p50_us':d.get('match_p50_us'),'insert_p50_us':d.get('insert_p50_us'),'evict_p99_us':d.get('evict_p99_us')}))" "$out"
    done
  done
done
