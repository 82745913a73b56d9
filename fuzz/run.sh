#!/usr/bin/env bash
# Fuzzes ladle-datasets' decoders, dataset readers and transform specs, ladle-ring's schemas, ladle-consumer's saved positions and the scheduler's inputs for a bounded time per target.
#
# Usage: fuzz/run.sh [SECONDS_PER_TARGET]     (default 60; from anywhere in the repository)
#        FUZZ_TARGETS="decode wds_shard" fuzz/run.sh 300    (a subset of the targets)
#
# - Installs cargo-fuzz if it is missing (`cargo install cargo-fuzz --locked`).
# - On first run, seeds fuzz/corpus/<target>/ from a tiny dataset made by ladle's own CLI
#   (`ladle dataset generate`); the corpus then grows across runs (it is git-ignored).
# - Runs every target with libFuzzer, AddressSanitizer and debug assertions for
#   SECONDS_PER_TARGET seconds (`-max_total_time`), with a 2 GiB RSS limit.
# - Exits non-zero if any target found a crash (panic), OOM or timeout, naming the target and
#   the artifact under fuzz/artifacts/<target>/. Reproduce one with
#   `RUSTC_BOOTSTRAP=1 cargo fuzz run -O -a TARGET fuzz/artifacts/TARGET/crash-...` from the
#   repository root, and shrink it with `cargo fuzz tmin -O -a TARGET ARTIFACT`.
#
# cargo-fuzz passes nightly-only flags (-Zsanitizer=address, ...) to rustc; on a stable
# toolchain this script sets RUSTC_BOOTSTRAP=1 so that stable accepts them.
set -euo pipefail

secs="${1:-60}"
case "$secs" in
  '' | *[!0-9]*)
    echo "usage: $0 [SECONDS_PER_TARGET]" >&2
    exit 2
    ;;
esac

fuzz_dir="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$fuzz_dir")"
cd "$repo"

targets=(${FUZZ_TARGETS:-decode wds_shard cifar_batch imagefolder scheduler_inputs transform_spec ring_schema saved_position})

if ! cargo fuzz --version > /dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

if ! rustc --version | grep -q -E 'nightly|-dev'; then
  export RUSTC_BOOTSTRAP=1
fi

# Scratch space for the targets' files (they honour $TMPDIR), removed on exit.
scratch="$(mktemp -d "${TMPDIR:-/tmp}/ladle-fuzz.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT

# --- seeds ----------------------------------------------------------------------------------

need_seeds=0
for t in "${targets[@]}"; do
  if [ -z "$(ls -A "$fuzz_dir/corpus/$t" 2> /dev/null)" ]; then
    need_seeds=1
  fi
done

if [ "$need_seeds" = 1 ]; then
  echo "== generating seed datasets with ladle's CLI"
  gen="$scratch/seeds"
  ladle() { cargo run --quiet --release -p ladle -- "$@"; }
  ladle dataset generate --format wds --count 4 --width 48 --height 32 --shard-size 4 \
    --out "$gen/wds" > /dev/null
  ladle dataset generate --format cifar10 --count 4 --out "$gen/cifar10" > /dev/null
  # Many small images: the generator mixes baseline/progressive JPEG, 4:4:4/4:2:2/4:2:0,
  # grayscale, CMYK (~10% together) and PNG (~4%) by sample; the seeds should cover them all.
  ladle dataset generate --format imagefolder --count 200 --width 48 --height 32 \
    --out "$gen/imagefolder" > /dev/null

  seed_dir() { # TARGET FILE...: copies FILEs in, if TARGET's corpus is empty
    local t="$1" dir="$fuzz_dir/corpus/$1"
    shift
    mkdir -p "$dir"
    if [ -z "$(ls -A "$dir")" ]; then
      local f i=0
      for f in "$@"; do
        cp "$f" "$dir/seed-$i-$(basename "$f")"
        i=$((i + 1))
      done
      echo "   corpus/$t: $i seeds"
    fi
  }
  mapfile -t jpegs < <(find "$gen/imagefolder" -type f -name '*.jpg' | sort)
  mapfile -t pngs < <(find "$gen/imagefolder" -type f -name '*.png' | sort)
  seed_dir decode "${jpegs[@]::40}" "${pngs[@]::4}"
  seed_dir imagefolder "${jpegs[@]::6}" "${pngs[@]::2}"
  seed_dir wds_shard "$gen"/wds/*.tar
  # The whole 4-record batch, and a single record.
  head -c 3073 "$gen"/cifar10/data_batch_1.bin > "$scratch/one_record.bin"
  seed_dir cifar_batch "$gen"/cifar10/data_batch_*.bin "$scratch/one_record.bin"
  # The scheduler's inputs: the first byte picks the parser (0 frame, 1 trace, 2 journal).
  printf '\000{"v":1,"op":"submit","command":["sh","-c","true"],"cwd":"/","gpu_mem_mib":6144,"gpus":1,"feed":"f","thread_percentage":null}\n' > "$scratch/frame"
  ladle sim generate --jobs 5 --seed 1 --out "$scratch/trace.csv" 2> /dev/null
  { printf '\001'; cat "$scratch/trace.csv"; } > "$scratch/trace"
  printf '\002{"event":"cancelled","id":1}\n{"event":"cancel' > "$scratch/journal"
  seed_dir scheduler_inputs "$scratch/frame" "$scratch/trace" "$scratch/journal"
  # Real saved positions: a whole-epoch consumer's and a group rank's, from a tiny feed.
  bin="$repo/target/release/ladle"
  sock="$scratch/position.sock"
  "$bin" serve --dataset "$gen/cifar10" --socket "$sock" --threads 1 2> /dev/null &
  serve=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  "$bin" consume --socket "$sock" --batch-size 1 --epochs 1 \
    --save-position "$scratch/position-whole" > /dev/null 2>&1
  "$bin" consume --socket "$sock" --batch-size 1 --epochs 1 --group fuzz --rank 0 \
    --world-size 1 --save-position "$scratch/position-rank" > /dev/null 2>&1
  kill "$serve" 2> /dev/null || true
  wait "$serve" 2> /dev/null || true
  seed_dir saved_position "$scratch"/position-*
fi

# --- fuzzing --------------------------------------------------------------------------------

logs="$fuzz_dir/target/fuzz-logs"
mkdir -p "$logs"
failed=()
summary=()
for t in "${targets[@]}"; do
  echo "== fuzzing $t for ${secs}s"
  art="$fuzz_dir/artifacts/$t"
  mkdir -p "$art"
  before="$(ls -A "$art")"
  status=0
  TMPDIR="$scratch" cargo fuzz run -O -a "$t" -- \
    -max_total_time="$secs" -rss_limit_mb=2048 -timeout=60 -print_final_stats=1 \
    > "$logs/$t.log" 2>&1 || status=$?
  tail -n 25 "$logs/$t.log" | grep -E 'stat::|Done|ERROR|panicked|SUMMARY' || true
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$t.log" | tail -1)"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$logs/$t.log" | tail -1)"
  new="$(comm -13 <(echo "$before" | sort) <(ls -A "$art" | sort) | sed "s|^|fuzz/artifacts/$t/|")"
  if [ "$status" != 0 ] || [ -n "$new" ]; then
    failed+=("$t: exit $status; artifact(s): ${new:-none} (log: ${logs#"$repo"/}/$t.log)")
    summary+=("$(printf '%-12s %10s runs %8s exec/s  FAILED' "$t" "${runs:-?}" "${rate:-?}")")
  else
    summary+=("$(printf '%-12s %10s runs %8s exec/s  ok' "$t" "${runs:-?}" "${rate:-?}")")
  fi
done

echo
echo "== summary (${secs}s per target)"
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo
  echo "fuzzing found problems:" >&2
  printf '  %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "no crashes found"
