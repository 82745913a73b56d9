#!/usr/bin/env bash
# Builds, where cargo is, what benches/gpu/run_all.sh needs on a GPU machine without cargo:
# .gpu/bin/{ladle,cuda-tests,cuda_check} (stripped) and .gpu/wheels/ladle-*.whl (abi3, any
# CPython >= 3.11). Same processor architecture as the GPU machine only (x86-64 here).
# Usage: benches/gpu/prebuild.sh [DIR]   (default .gpu, which git ignores)
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-.gpu}
rm -rf "$DIR/bin" "$DIR/wheels"
mkdir -p "$DIR/bin" "$DIR/wheels"
cargo build --release -p ladle --locked
cargo build --release -p ladle-consumer --features cuda --example cuda_check --locked
tests=$(cargo test --release -p ladle-consumer --features cuda --test cuda --no-run --locked \
  --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cuda":
        print(m["executable"])')
strip -o "$DIR/bin/ladle" target/release/ladle
strip -o "$DIR/bin/cuda_check" target/release/examples/cuda_check
strip -o "$DIR/bin/cuda-tests" "$tests"
if ! command -v maturin >/dev/null; then
  python3 -m venv target/maturin-venv
  target/maturin-venv/bin/pip install -q 'maturin>=1.9,<2'
  PATH=$PWD/target/maturin-venv/bin:$PATH
fi
(cd python && maturin build --release --out "../$DIR/wheels")
du -sh "$DIR"/bin/* "$DIR"/wheels/*
