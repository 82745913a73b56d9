#!/usr/bin/env bash
# A 4-run learning-rate sweep of examples/train_resnet18.py from one ladle feed, each run
# admitted by the scheduler; prints the sweep's report (each run's log holds its JSON line).
# Usage: examples/sweep.sh [DATASET]   (default: the cached demo dataset)
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-$HOME/.cache/ladle/demo-imagefolder-v2-1000}
LADLE=${LADLE:-target/release/ladle}
[ -d "$DATA" ] || "$LADLE" dataset generate --format imagefolder --count 1000 --out "$DATA"
exec "$LADLE" sweep --dataset "$DATA" -- python examples/train_resnet18.py --lr '{0.1,0.05,0.02,0.01}' --steps 300
