#!/usr/bin/env bash
# A 4-run learning-rate sweep of examples/train_resnet18.py, first from one ladle producer,
# then from four private DataLoaders over the same files. Prints each run's JSON line.
# Usage: examples/sweep.sh [STEPS] [DATASET]   (defaults: 300, the cached demo dataset)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-300}
DATA=${2:-$HOME/.cache/ladle/demo-imagefolder-v2-1000}
LADLE=${LADLE:-target/release/ladle}
[ -d "$DATA" ] || "$LADLE" dataset generate --format imagefolder --count 1000 --out "$DATA"
SOCK=$(mktemp -u /tmp/ladle-sweep-XXXXXX.sock)

echo "== ladle: one producer, four training runs"
"$LADLE" serve --dataset "$DATA" --socket "$SOCK" 2>/dev/null >/dev/null &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
while [ ! -S "$SOCK" ]; do sleep 0.1; done
RUNS=()
for lr in 0.1 0.05 0.02 0.01; do
  python examples/train_resnet18.py --socket "$SOCK" --lr $lr --steps "$STEPS" &
  RUNS+=($!)
done
wait "${RUNS[@]}"
kill $SERVE; wait $SERVE 2>/dev/null || true

echo "== DataLoader: four training runs, each decoding for itself"
WORKERS=$(( $(nproc) / 4 )); [ "$WORKERS" -ge 1 ] || WORKERS=1
for lr in 0.1 0.05 0.02 0.01; do
  python examples/train_resnet18.py --dataloader "$DATA" --workers $WORKERS --lr $lr --steps "$STEPS" &
done
wait
