#!/usr/bin/env bash
# Benchmark: seconds per round of one FedPSD-grid CIFAR-10 FedAvg cell
# (100 clients, 10 a round, 5 epochs, batch 50, SimpleCNN) under several
# TFF worker concurrency caps and TensorFlow thread settings. 8 rounds each;
# rounds 3-8 are the steady state (round 1 traces). Needs cifar10_jpeg.zip
# in DATA_DIR (default ../shared/data). Run it on an otherwise idle machine.
#
#   bash scripts/bench_concurrency.sh [DATA_DIR] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR="${1:-../shared/data}"
OUT="${2:-/tmp/bench_concurrency}"
if [[ ! -f "$DATA_DIR/cifar10_jpeg.zip" ]]; then
  echo "bench_concurrency.sh: $DATA_DIR/cifar10_jpeg.zip not found; pass the data folder." >&2
  exit 1
fi
mkdir -p "$OUT"
run() {  # name, extra program flags, then environment assignments
  local name=$1 extra=$2; shift 2
  rm -rf "${OUT:?}/$name"
  env "$@" .venv/bin/python -m programs.run \
    --algorithm=fedavg --dataset=cifar10 --data_dir="$DATA_DIR" \
    --partition=shards --shards_per_client=2 --num_clients=100 \
    --clients_per_round=10 --rounds=8 --local_epochs=5 --model=simple_cnn \
    --batch_size=50 --learning_rate=0.01 --momentum=0.9 --weight_decay=1e-5 \
    --learning_rate_decay=0.99 --augment=crop_flip_normalize --seed=0 \
    --eval_every=100 --output_dir="$OUT/$name" --noresume --progress=false \
    $extra > "$OUT/$name.log" 2>&1
  .venv/bin/python - "$OUT/$name" "$name" <<'PY'
import glob, sys
import pandas as pd
seconds = pd.read_csv(glob.glob(sys.argv[1] + '/**/rounds.csv',
                                recursive=True)[0])['round_seconds']
print(f'{sys.argv[2]:>14}: rounds 3-8 {seconds.iloc[2:].mean():.2f} s/round '
      f'(round 1 {seconds.iloc[0]:.2f} s)')
PY
}
run default '' X=1
run cap2 --max_concurrent_clients=2 X=1
run cap1 --max_concurrent_clients=1 X=1
run intra1_inter1 '' TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1
run cap2_intra1 --max_concurrent_clients=2 TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=2
