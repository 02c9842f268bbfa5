#!/usr/bin/env bash
# Benchmark: peak RSS of each TFF worker_binary and the wall time of one
# `programs.run` call that runs several algorithms in a row (embedded digits,
# MLP, 10 clients, 10 rounds each). Since the programs end the worker after
# each algorithm or cell, every algorithm shows its own worker; before, one
# worker ran them all. Sampled every 0.5 s with ps.
#
#   bash scripts/bench_worker_memory.sh [OUT_DIR] [extra programs.run flags]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-/tmp/bench_worker_memory}"
shift || true
rm -rf "$OUT" && mkdir -p "$OUT"
start=$(date +%s.%N)
.venv/bin/python -m programs.run \
  --algorithm=fedavg,fedprox,moon,scaffold,fedntd,fedlmd --rounds=10 \
  --noprogress --seed=0 --output_dir="$OUT/run" "$@" > "$OUT/run.log" 2>&1 &
parent=$!
while kill -0 "$parent" 2>/dev/null; do
  for w in $(pgrep -P "$parent" worker_binary || true); do
    echo "$w $(ps -o rss= -p "$w" || echo 0)"
  done
  sleep 0.5
done > "$OUT/rss.txt"
wait "$parent"
end=$(date +%s.%N)
awk -v a="$start" -v b="$end" 'BEGIN { printf "wall %.1f s\n", b - a }'
echo "workers (pid: peak RSS MB, in start order):"
awk '{ if (!($1 in peak)) order[n++] = $1; if ($2 > peak[$1]) peak[$1] = $2 }
     END { for (i = 0; i < n; i++) printf "  %s: %d\n", order[i], peak[order[i]] / 1024 }' "$OUT/rss.txt"
grep '^| ' "$OUT/run.log"
