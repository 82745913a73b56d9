#!/usr/bin/env bash
# Every GPU check of ladle in one command, on a machine with an NVIDIA GPU (issue 15).
#
# Usage (repository root):
#   benches/gpu/run_all.sh [--out FILE] [--only SECTION,...] [--quick]
#
# Writes one JSON (default $OUT/gpu.json when $OUT is set, else target/gpu/gpu.json) with the
# device, driver and CUDA versions and every section's figures, plus logs.tar.gz beside it.
# Sections (all by default, in this order):
#   info        nvidia-smi, driver, CUDA (driver API and torch), CPU cores
#   cuda_tests  the `cuda` feature's tests of ladle-consumer, the #[ignore]d GPU ones included
#   cuda_check  the fused conversion kernel against the CPU reference and a device copy, and
#               H2D from the registered ring against cuMemHostAlloc and pageable memory
#   h2d_python  the same H2D comparison through the Python package (torch, cudaHostRegister)
#   to_torch    Batch.to_torch("cuda") against the CPU path; its throughput; the conversion
#               against a fused kernel's floor and a ResNet-18 step
#   scheduler   NVML telemetry, MPS start/adopt/quit, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT as
#               ladle writes it, `ladle submit` of GPU jobs, OOM handling
#   submit_train the 4 ResNet-18 runs of one ladle feed submitted to the scheduler (default
#               policy, MPS, no --gpu-mem)
#   colocate    4 ResNet-18 runs (batch 32/64/128/256) under MPS fed by one ladle feed against
#               4 PyTorch DataLoaders, at all cores and at 4 cores, and 1 run alone
# --quick shortens the timed parts (a smoke run); never publish its numbers.
#
# Builds what it needs when cargo is there (cargo build --release; the Python package into a
# venv that sees the system's torch). Without cargo (the lent GPU machines have none) it uses
# prebuilt binaries and a wheel from $LADLE_PREBUILT (default .gpu/): bin/ladle,
# bin/cuda-tests, bin/cuda_check and wheels/ladle-*.whl, made by benches/gpu/prebuild.sh.
# Never changes the GPU's compute mode, clocks, persistence or MIG, and never resets it.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD

RESULT=""
ONLY="info,cuda_tests,cuda_check,h2d_python,to_torch,scheduler,submit_train,colocate"
QUICK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) RESULT=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "run_all.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$RESULT" ]; then
  if [ -n "${OUT:-}" ]; then RESULT=$OUT/gpu.json; else RESULT=target/gpu/gpu.json; fi
fi
mkdir -p "$(dirname "$RESULT")"
WORK=$(mktemp -d /tmp/ladle-gpu.XXXXXX)
LOGS=$WORK/logs
PARTS=$WORK/parts
mkdir -p "$LOGS" "$PARTS"
PY=${PYTHON:-python3}
log() { printf '[run_all %s] %s\n' "$(date +%T)" "$*"; }

# ---- binaries and the Python package --------------------------------------------------------
PREBUILT=${LADLE_PREBUILT:-$REPO/.gpu}
if command -v cargo >/dev/null; then
  log "building (cargo build --release)"
  cargo build --release -p ladle --locked >"$LOGS/build.log" 2>&1 || { log "build failed"; tail "$LOGS/build.log"; exit 1; }
  cargo build --release -p ladle-consumer --features cuda --example cuda_check --locked >>"$LOGS/build.log" 2>&1 || exit 1
  CUDA_TESTS=$(cargo test --release -p ladle-consumer --features cuda --test cuda --no-run --locked \
    --message-format=json 2>>"$LOGS/build.log" | "$PY" -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cuda":
        print(m["executable"])')
  LADLE_BIN=$REPO/target/release/ladle
  CUDA_CHECK=$REPO/target/release/examples/cuda_check
  "$PY" -m venv --system-site-packages "$WORK/venv" && "$WORK/venv/bin/pip" install -q ./python \
    >>"$LOGS/build.log" 2>&1 || { log "pip install of the Python package failed"; exit 1; }
  PY=$WORK/venv/bin/python
else
  log "no cargo: using the prebuilt binaries in $PREBUILT"
  LADLE_BIN=$PREBUILT/bin/ladle
  CUDA_TESTS=$PREBUILT/bin/cuda-tests
  CUDA_CHECK=$PREBUILT/bin/cuda_check
  for f in "$LADLE_BIN" "$CUDA_TESTS" "$CUDA_CHECK"; do
    [ -x "$f" ] || { echo "run_all.sh: $f missing: run benches/gpu/prebuild.sh where cargo is" >&2; exit 1; }
  done
  "$PY" -m pip install -q --no-index --no-deps --no-cache-dir --target "$WORK/site" "$PREBUILT"/wheels/ladle-*.whl \
    >"$LOGS/build.log" 2>&1 || { log "installing the prebuilt wheel failed"; cat "$LOGS/build.log"; exit 1; }
  export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
fi
export LADLE_BIN PYTHONUNBUFFERED=1

# NVRTC for the fused kernel: cudarc looks for libnvrtc.so (or .so.12); CUDA 13 installs
# libnvrtc.so.13, and the toolkit's lib64 is often not on the loader's path.
LIBDIR=$WORK/lib
mkdir -p "$LIBDIR"
NVRTC=$( { ls /usr/local/cuda/lib64/libnvrtc.so* /usr/local/cuda/targets/*/lib/libnvrtc.so* 2>/dev/null;
           "$PY" -c 'import nvidia, pathlib; [print(p) for d in nvidia.__path__ for p in pathlib.Path(d).glob("**/libnvrtc.so*")]' 2>/dev/null; } \
         | grep -v alt | sort -V | tail -1)
if [ -n "$NVRTC" ]; then
  ln -sf "$NVRTC" "$LIBDIR/libnvrtc.so"
  # NVRTC loads its builtins library from beside itself or from the loader's path.
  for b in "$(dirname "$NVRTC")"/libnvrtc-builtins.so*; do [ -e "$b" ] && ln -sf "$b" "$LIBDIR/"; done
  export LD_LIBRARY_PATH=$LIBDIR:$(dirname "$NVRTC")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
log "NVRTC: ${NVRTC:-not found}"

# ---- the dataset: the embedded default (1000 photo-like 500x375 JPEGs, 10 classes) ----------
DATA=$WORK/data
log "generating the dataset"
"$LADLE_BIN" dataset generate --format imagefolder --count 1000 --out "$DATA" >"$LOGS/dataset.log" 2>&1 \
  || { log "dataset generation failed"; cat "$LOGS/dataset.log"; exit 1; }

# ---- sections -------------------------------------------------------------------------------
wants() { case ",$ONLY," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
# section NAME TIMEOUT CMD...: runs CMD with a time limit, output in logs/NAME.log; the
# section's JSON (if any) is whatever CMD wrote to $PARTS/NAME.json; its exit status is kept.
section() {
  local name=$1 limit=$2; shift 2
  wants "$name" || return 0
  log "section $name (limit ${limit}s)"
  local t0=$SECONDS
  # bash -c: a section may be one of the functions below (exported with export -f).
  timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  echo "$rc $((SECONDS - t0))" >"$PARTS/$name.rc"
  log "section $name: exit $rc after $((SECONDS - t0))s"
  tail -n 5 "$LOGS/$name.log" | sed 's/^/    /'
  merge
}

# ---- one JSON, rewritten after every section (a call cut off early keeps what finished) ------
merge() {
"$PY" - "$PARTS" "$RESULT" "$QUICK" "$ONLY" "${1:-0}" <<'EOF'
import json, pathlib, sys, time
parts, result = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
out = {"generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "quick": sys.argv[3] == "1", "sections_run": sys.argv[4].split(","), "sections": {}}
for rc in sorted(parts.glob("*.rc")):
    name = rc.stem
    code, seconds = (int(x) for x in rc.read_text().split())
    part = parts / f"{name}.json"
    try:
        data = json.loads(part.read_text()) if part.exists() else None
    except ValueError as e:
        data = {"unparsable": str(e), "text": part.read_text()[-2000:]}
    out["sections"][name] = {"exit_code": code, "seconds": seconds, "result": data}
info = (out["sections"].get("info") or {}).get("result") or {}
for k in ("device", "driver", "cuda_driver_api", "torch", "torch_cuda", "cores"):
    out[k] = info.get(k)
result.write_text(json.dumps(out, indent=2) + "\n")
if sys.argv[5] == "1":
    print("\nsection       exit  seconds")
    for name, s in out["sections"].items():
        print(f"{name:<13} {s['exit_code']:>4}  {s['seconds']:>7}")
EOF
tar -czf "$(dirname "$RESULT")/logs.tar.gz" -C "$WORK" logs parts 2>/dev/null
}

info() {
  "$PY" - "$PARTS/info.json" <<'EOF'
import json, os, subprocess, sys
def sh(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as e:
        return f"error: {e!r}"
q = sh("nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_mode,mig.mode.current,persistence_mode,clocks.max.sm,power.limit", "--format=csv,noheader")
info = {"nvidia_smi_query": q, "nvidia_smi": sh("nvidia-smi"), "cores": os.cpu_count(),
        "kernel": sh("uname", "-r"), "python": sys.version.split()[0]}
fields = [f.strip() for f in q.split(",")]
if len(fields) >= 2:
    info["device"], info["driver"] = fields[0], fields[1]
try:
    import torch
    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version(),
                sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
    import ctypes
    v = ctypes.c_int()
    ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v))
    info["cuda_driver_api"] = f"{v.value // 1000}.{v.value % 1000 // 10}"
except Exception as e:
    info["torch_error"] = repr(e)
info["nvcc"] = sh("bash", "-c", "nvcc --version | tail -2 | head -1")
info["mps_control"] = sh("bash", "-c", "command -v nvidia-cuda-mps-control")
json.dump(info, open(sys.argv[1], "w"), indent=2)
print(json.dumps({k: v for k, v in info.items() if k != "nvidia_smi"}, indent=2))
EOF
}

cuda_tests() {
  "$CUDA_TESTS" --include-ignored --test-threads 1 2>&1 | tee "$WORK/cuda_tests.txt"
  local rc=${PIPESTATUS[0]}
  "$PY" - "$WORK/cuda_tests.txt" "$PARTS/cuda_tests.json" "$rc" <<'EOF'
import json, re, sys
text = open(sys.argv[1]).read()
tests = {m.group(1): m.group(2) for m in re.finditer(r"^test (\S+) \.\.\. (\w+)", text, re.M)}
json.dump({"exit_code": int(sys.argv[3]), "tests": tests,
           "passed": sum(v == "ok" for v in tests.values()),
           "failed": [k for k, v in tests.items() if v != "ok"]}, open(sys.argv[2], "w"), indent=2)
EOF
  return "$rc"
}

# Starts `ladle serve` on the dataset; sets SERVE_PID and SOCK.
start_serve() {
  SOCK=$WORK/$1.sock
  "$LADLE_BIN" serve --dataset "$DATA" --socket "$SOCK" --ring-mib 1024 >"$LOGS/$1-serve.log" 2>&1 &
  SERVE_PID=$!
  for _ in $(seq 300); do [ -S "$SOCK" ] && return 0; sleep 0.1; done
  echo "ladle serve did not start: $(cat "$LOGS/$1-serve.log")"; return 1
}

cuda_check() {
  start_serve cuda_check || return 1
  "$CUDA_CHECK" --socket "$SOCK" >"$PARTS/cuda_check.json"
  local rc=$?
  cat "$PARTS/cuda_check.json"
  kill "$SERVE_PID"; wait "$SERVE_PID"
  return $rc
}

# The four ResNet-18 runs (colocate.py's worker, batch 32/64/128/256, one ladle feed) submitted
# to `ladle scheduler --gpu nvml --mps on` with the default policy and no --gpu-mem, as a user
# of a sweep would; each run measures its own window (warm-up 20 s from its own start, 30 s).
submit_train() {
  local state=$WORK/sched-train
  mkdir -p "$state" "$LOGS/submit_train"
  start_serve submit_train || return 1
  "$LADLE_BIN" scheduler --dir "$state" ${SUBMIT_SCHEDULER_ARGS:---gpu nvml --mps on} >"$LOGS/submit_train/scheduler.log" 2>&1 &
  local sched=$!
  for _ in $(seq 100); do [ -S "$state/scheduler.sock" ] && break; sleep 0.1; done
  local t0=$SECONDS
  for b in 32 64 128 256; do
    "$LADLE_BIN" submit --dir "$state" --feed embedded --json -- bash -c \
      "exec $PY $REPO/benches/gpu/colocate.py worker --source ladle --socket $SOCK --batch-size $b \
       --t0 \$(date +%s.%N) --warmup 20 --seconds 30 --name submit-bs$b \
       --result $LOGS/submit_train/bs$b.json ${SUBMIT_WORKER_ARGS:-}"
  done
  local done_=0
  for _ in $(seq 400); do
    "$LADLE_BIN" queue --dir "$state" --json >"$LOGS/submit_train/queue.json" 2>/dev/null
    echo "$((SECONDS - t0)) $(tr -d '\n' <"$LOGS/submit_train/queue.json")" >>"$LOGS/submit_train/polls.txt"
    if "$PY" -c 'import json,sys; q=json.load(open(sys.argv[1])); st=lambda j: j["state"]["state"] if isinstance(j["state"], dict) else j["state"]; sys.exit(0 if q["jobs"] and all(st(j) not in ("queued","running") for j in q["jobs"]) else 1)' \
        "$LOGS/submit_train/queue.json"; then done_=1; break; fi
    sleep 1
  done
  local makespan=$((SECONDS - t0))
  kill "$sched"; wait "$sched"
  kill "$SERVE_PID"; wait "$SERVE_PID"
  "$PY" - "$LOGS/submit_train" "$PARTS/submit_train.json" "$makespan" "$done_" <<'PYEOF'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
q = json.loads((d / "queue.json").read_text())
runs = {}
for b in (32, 64, 128, 256):
    f = d / f"bs{b}.json"
    runs[b] = json.loads(f.read_text()) if f.exists() else None
polls = [l.split(" ", 1) for l in (d / "polls.txt").read_text().splitlines()]
concurrent = 0
for t, text in polls:
    try:
        concurrent = max(concurrent, sum(str(j["state"]).find("running") >= 0
                                         for j in json.loads(text)["jobs"]))
    except ValueError:
        pass
out = {"policy": q.get("policy"), "all_finished": sys.argv[4] == "1",
       "makespan_s": int(sys.argv[3]), "max_running_at_once": concurrent,
       "jobs": q["jobs"], "gpus": q.get("gpus"),
       "runs": {b: (None if r is None else {k: r.get(k) for k in (
           "images_per_s", "images", "max_memory_reserved_mib", "t_first_step_s",
           "data_wait_fraction_window", "error", "loss")}) for b, r in runs.items()},
       "aggregate_images_per_s": sum((r or {}).get("images_per_s") or 0 for r in runs.values())}
json.dump(out, open(sys.argv[2], "w"), indent=2)
print(json.dumps({k: v for k, v in out.items() if k not in ("jobs", "gpus")}, indent=2))
PYEOF
  [ "$done_" = 1 ]
}

export WORK LOGS PARTS PY DATA LADLE_BIN CUDA_TESTS CUDA_CHECK REPO
export -f info cuda_tests start_serve cuda_check submit_train

if [ "$QUICK" = 1 ]; then ROUNDS=8; COLOC=(--seconds 8 --warmup 12); else ROUNDS=30; COLOC=(); fi

section info 60 info
section cuda_tests 300 cuda_tests
section cuda_check 300 cuda_check
section h2d_python 300 "$PY" benches/gpu/h2d_bandwidth.py --dataset "$DATA" --batch-size 256 \
  --rounds "$ROUNDS" --json "$PARTS/h2d_python.json"
section to_torch 300 "$PY" benches/gpu/to_torch_check.py --dataset "$DATA" --batch-size 256 \
  --rounds "$ROUNDS" --json "$PARTS/to_torch.json"
section scheduler 540 "$PY" benches/gpu/scheduler_check.py --ladle-bin "$LADLE_BIN" \
  --logs "$LOGS/scheduler" --json "$PARTS/scheduler.json"
section submit_train 400 submit_train
section colocate 600 "$PY" benches/gpu/colocate.py --dataset "$DATA" --ladle-bin "$LADLE_BIN" \
  --logs "$LOGS/colocate" --json "$PARTS/colocate.json" "${COLOC[@]}"

merge 1
log "wrote $RESULT and $(dirname "$RESULT")/logs.tar.gz"
fail=0
for rc in "$PARTS"/*.rc; do [ "$(cut -d' ' -f1 "$rc")" = 0 ] || fail=1; done
exit $fail
