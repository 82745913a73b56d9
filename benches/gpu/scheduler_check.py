#!/usr/bin/env python3
"""One-shot GPU checks of ``ladle scheduler`` on a real NVIDIA GPU (NVML telemetry, MPS
memory limits, MPS start/adopt/quit, submit/queue/logs, out-of-memory retries).

Written to run **once** on a lent machine without network: every step has a timeout, every
failure is recorded with its stderr, and everything it starts is stopped in ``finally``
(its MPS control daemons are told to quit, then killed if they linger; schedulers get
SIGTERM, then SIGKILL; jobs left by a scheduler are killed by process group). It never
changes compute mode, clocks, persistence or MIG and never resets the GPU.

Sections (each one JSON object with ``ok`` true/false, its figures, and ``error`` /
``stderr`` on failure):

  nvml       the GPU as pynvml reads it (name, driver, memory, compute mode, GPM, MIG, a GPM
             sample); then ``ladle scheduler --gpu nvml --mps off`` and its ``ladle queue
             --json`` GPUs, before and while a helper process holds 2 GiB (does ladle's used
             memory rise by about 2 GiB?)
  mps_limit  a private ``nvidia-cuda-mps-control -d``; client A with
             ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M`` (the ordinal form; ladle now
             writes ``GPU-uuid=…M``, checked below, with ``CUDA_VISIBLE_DEVICES=GPU-uuid``) allocates 1 GiB (must work) then 4 GiB more
             (must fail), while client B without a limit allocates 4 GiB (must work); what
             NVML's compute and MPS process lists report for them; then the forms ``0=2G``,
             ``GPU-uuid=2048M`` and a bare ``2048M``; then ``quit`` and the daemon is gone
  mps_adopt  ``ladle scheduler --gpu nvml --mps on`` starts MPS, quits it on SIGTERM; a
             daemon started by hand on ladle's pipe directory is adopted
  submit     ``ladle scheduler --gpu nvml --mps on --settle-s 3`` (policy ladle) runs 4
             short torch jobs (2 with ``--gpu-mem 2GiB``): states, exit codes, GPUs, limits,
             times, the environment each job saw, the makespan (``--train-cmd`` submits given
             commands instead)
  oom        a job with ``--gpu-mem 1GiB`` that allocates 6 GiB: written for the former
             estimate-based limit (3072 MiB), under which its first attempt died of CUDA
             out of memory and was retried alone; ladle's limit is now the room the GPU had
             (a job alone gets the GPU less 512 MiB), so this section must put a neighbour
             beside it before it can hit one: to rework at the next GPU session

Usage (repository root; ``target/release/ladle`` built)::

    python3 benches/gpu/scheduler_check.py --json scheduler_check.json [--ladle-bin P]
        [--logs DIR] [--skip submit,oom] [--train-cmd 'python train.py' ...]

Without a GPU every section fails quickly with the reason (no driver, no
nvidia-cuda-mps-control) and the script exits 1. ``--gpu-kind sim`` (hidden) runs the
submit and oom sections on ``--gpu sim`` with jobs that need no torch, to test the plumbing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from _common import run_to_files

SECTIONS = ["nvml", "mps_limit", "mps_adopt", "submit", "oom"]
MIB = 1 << 20
TAIL = 4000
# Seconds of the time budget kept for cleanup.
CLEANUP_RESERVE = 45.0
# ladle's plain markers of a GPU out-of-memory exit (scheduler/core/src/job.rs OOM_MARKERS; the
# TensorFlow and JAX forms are matched there line by line, see out_of_memory_evidence).
OOM_MARKERS = [
    "CUDA out of memory",
    "CUDA error: out of memory",
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "cudaErrorMemoryAllocation",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUSOLVER_STATUS_ALLOC_FAILED",
    "CUSPARSE_STATUS_ALLOC_FAILED",
    "CUFFT_ALLOC_FAILED",
]
COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}
ENV_KEYS = [
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "LADLE_JOB_ID",
    "LADLE_JOB_ATTEMPT",
]
FINAL_STATES = {"succeeded", "failed", "cancelled", "interrupted"}

# ---------------------------------------------------------------------------------------
# Scripts run as child processes (written into the work directory).

# An MPS client / memory holder: allocates FIRST MiB, then SECOND MiB more, writes what
# happened to RESULT (JSON, atomically), then holds its memory until RELEASE exists or
# HOLD_S pass.
CLIENT_PY = r'''
import json, os, sys, time
result, release, first, second, hold_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
KEYS = %(keys)r
res = {"pid": os.getpid(), "env": {k: os.environ.get(k) for k in KEYS}}
def out():
    tmp = result + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f)
    os.replace(tmp, result)
def err(e):
    return ("%%s: %%s" %% (type(e).__name__, e))[:1500]
try:
    t = time.time()
    import torch
    res["torch"] = torch.__version__
    res["torch_cuda"] = torch.version.cuda
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    res["device_name"] = torch.cuda.get_device_name(0)
    res["mem_get_info_mib_before"] = {"free": free // 2**20, "total": total // 2**20}
    res["init_s"] = round(time.time() - t, 2)
except BaseException as e:
    res["init_error"] = err(e)
    out()
    sys.exit(3)
held = []
for key, mib in (("first", first), ("second", second)):
    if mib <= 0:
        continue
    try:
        x = torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        held.append(x)
        res[key] = {"mib": mib, "ok": True}
    except BaseException as e:
        msg = err(e)
        res[key] = {"mib": mib, "ok": False, "error": msg, "is_oom": "out of memory" in msg.lower()}
        break
try:
    res["memory_allocated_mib"] = torch.cuda.memory_allocated() // 2**20
    res["memory_reserved_mib"] = torch.cuda.memory_reserved() // 2**20
    free, total = torch.cuda.mem_get_info()
    res["mem_get_info_mib_after"] = {"free": free // 2**20, "total": total // 2**20}
except BaseException as e:
    res["after_error"] = err(e)
res["holding"] = True
out()
deadline = time.time() + hold_s
while time.time() < deadline and not os.path.exists(release):
    time.sleep(0.1)
''' % {"keys": ENV_KEYS}

# A scheduler job: prints "CHECKJSON {...}" lines (environment, start, end, peak memory).
# --mode gpu: allocates --alloc-mib with torch, runs matmuls until --seconds pass;
# --mode sim: no torch; prints ladle's sim marker, and "dies of CUDA out of memory" when
# --alloc-mib exceeds its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (what the GPU should do).
JOB_PY = r'''
import argparse, json, os, sys, time
p = argparse.ArgumentParser()
p.add_argument("--tag", default="job")
p.add_argument("--mode", choices=["gpu", "sim"], default="gpu")
p.add_argument("--seconds", type=float, default=15.0)
p.add_argument("--alloc-mib", type=int, default=256)
p.add_argument("--matmul-n", type=int, default=4096)
a = p.parse_args()
KEYS = %(keys)r
def say(**kw):
    print("CHECKJSON " + json.dumps(kw), flush=True)
start = time.time()
say(tag=a.tag, pid=os.getpid(), pgid=os.getpgid(0), start=start, env={k: os.environ.get(k) for k in KEYS})
if a.mode == "sim":
    limit = None
    for part in (os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") or "").split(","):
        # "0=2048M" or "GPU-<uuid>=2048M" (ladle writes the UUID form).
        key, _, value = part.rpartition("=")
        if key and value.endswith("M"):
            limit = int(value[:-1])
    if limit is not None and a.alloc_mib > limit:
        say(tag=a.tag, end=time.time(), error="simulated OOM: %%d MiB over the %%d MiB limit" %% (a.alloc_mib, limit))
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %%d MiB (simulated by scheduler_check.py)" %% a.alloc_mib, file=sys.stderr, flush=True)
        sys.exit(1)
    print("ladle-sim: mem_mib=%%d sm=0.5" %% a.alloc_mib, flush=True)
    time.sleep(a.seconds)
    say(tag=a.tag, end=time.time(), max_memory_allocated_mib=a.alloc_mib, simulated=True)
    sys.exit(0)
import torch
try:
    buf = torch.empty(a.alloc_mib * 2**20, dtype=torch.uint8, device="cuda")
    buf.fill_(1)
    torch.cuda.synchronize()
except BaseException as e:
    say(tag=a.tag, end=time.time(), error=("%%s: %%s" %% (type(e).__name__, e))[:1000])
    raise
n = a.matmul_n
x = torch.randn(n, n, device="cuda")
y = torch.randn(n, n, device="cuda")
iters = 0
t_compute = time.time()
while time.time() - start < a.seconds:
    z = x @ y
    iters += 1
    if iters %% 10 == 0:
        torch.cuda.synchronize()
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
say(tag=a.tag, end=time.time(), compute_s=round(time.time() - t_compute, 2), iters=iters,
    max_memory_allocated_mib=round(torch.cuda.max_memory_allocated() / 2**20, 1),
    max_memory_reserved_mib=round(torch.cuda.max_memory_reserved() / 2**20, 1),
    mem_get_info_mib={"free": free // 2**20, "total": total // 2**20},
    device=torch.cuda.get_device_name(0))
''' % {"keys": ENV_KEYS}


# ---------------------------------------------------------------------------------------
# Helpers


def tail(text, n=TAIL):
    text = text or ""
    return text if len(text) <= n else "..." + text[-n:]


def read_tail(path, n=TAIL):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def now():
    return time.time()


def note_error(res, errors, e):
    """Records a section's CheckError: its message among the errors, its stderr's tail."""
    errors.append(str(e))
    if e.stderr:
        res["stderr"] = tail(e.stderr)


def conclude(res, errors):
    """A section's verdict: ok without errors, else every error in one line."""
    res["ok"] = not errors
    if errors:
        res["error"] = "; ".join(errors)


def fmt_exc(e):
    return f"{type(e).__name__}: {e}"


class CheckError(Exception):
    """A step failed; ``stderr`` holds what the failing program printed."""

    def __init__(self, message, stderr=None):
        super().__init__(message)
        self.stderr = stderr


class Interrupted(BaseException):
    """SIGTERM/SIGINT/SIGHUP to this script: stop, clean up, write what we have."""


def _on_signal(signum, _frame):
    raise Interrupted(f"signal {signum}")


def proc_cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return None


def proc_name(pid):
    cmd = proc_cmdline(pid)
    if cmd is None:
        return None
    return " ".join(cmd)[:200]


def proc_env_var(pid, key):
    """(found, value) of an environment variable of a process; found None if unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for kv in f.read().split(b"\0"):
                if kv.startswith(key.encode() + b"="):
                    return True, kv.split(b"=", 1)[1].decode("utf-8", "replace")
        return False, None
    except OSError:
        return None, None


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def mps_processes(pipe_dir=None):
    """Every nvidia-cuda-mps-* process: pid, program, pipe dir (environ; default when unset).
    With ``pipe_dir``, only those whose CUDA_MPS_PIPE_DIRECTORY is it."""
    out = []
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return out
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        cmd = proc_cmdline(pid) or [comm]
        try:
            exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            exe = ""
        # The program: the executable, argv[0], a script's path (an interpreter's argv[1]),
        # else the (15-character) process name.
        names = [exe] + [os.path.basename(a) for a in cmd[:2]] + [comm]
        program = next((n for n in names if n.startswith("nvidia-cuda-mps")), None)
        if program is None:
            continue
        found, value = proc_env_var(pid, "CUDA_MPS_PIPE_DIRECTORY")
        pd = value if found else ("/tmp/nvidia-mps (default)" if found is False else "unreadable")
        if pipe_dir is not None and pd != str(pipe_dir):
            continue
        if not pid_alive(pid):
            continue
        out.append({"pid": pid, "program": program, "cmdline": " ".join(cmd)[:200],
                    "pipe_dir": pd})
    return out


def copy_regular_files(src, dst):
    """Copies the regular files of ``src`` into ``dst`` (never opens a FIFO or socket)."""
    for root, _dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        for name in files:
            p = os.path.join(root, name)
            try:
                if not stat.S_ISREG(os.lstat(p).st_mode):
                    continue
                target = os.path.join(dst, rel, name)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copy2(p, target)
            except OSError:
                pass


def parse_checkjson(text):
    out = []
    for line in (text or "").splitlines():
        if line.startswith("CHECKJSON "):
            try:
                out.append(json.loads(line[len("CHECKJSON "):]))
            except ValueError:
                pass
    return out


def merge_checkjson(records):
    merged = {}
    for r in records:
        merged.update(r)
    return merged


def median(xs):
    xs = sorted(xs)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


# ---------------------------------------------------------------------------------------
# The context: time budget, processes, logs, cleanup


class Ctx:
    def __init__(self, args):
        self.args = args
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.budget_s
        # Short path: ladle's socket and MPS's pipes live under it (sun_path is 108 bytes).
        self.work = Path(tempfile.mkdtemp(prefix="lsc-", dir="/tmp"))
        if args.logs:
            self.logs = Path(args.logs).resolve()
            self.logs.mkdir(parents=True, exist_ok=True)
        else:
            self.logs = Path(tempfile.mkdtemp(prefix="ladle-scheduler-check-logs-"))
        (self.logs / "cmd").mkdir(exist_ok=True)
        self.procs = []  # (name, Popen)
        self.schedulers = []  # Popen
        self.state_dirs = []
        self.mps_dirs = []  # (pipe, log): daemons this script (or its schedulers) may have started
        self.counter = 0
        self.in_cleanup = False
        self.python = args.python or sys.executable
        self.ladle = self._resolve_ladle()
        self.mps_control = shutil.which("nvidia-cuda-mps-control")
        self.base_env = {
            k: v for k, v in os.environ.items()
            if not (k.startswith("CUDA_MPS_") or k in ("CUDA_VISIBLE_DEVICES", "LADLE_SCHEDULER_DIR"))
        }
        self.base_env["PYTHONUNBUFFERED"] = "1"
        self._nvml = None
        self._nvml_error = None
        self.client_py = self.work / "client.py"
        self.client_py.write_text(CLIENT_PY)
        self.job_py = self.work / "job.py"
        self.job_py.write_text(JOB_PY)

    def _resolve_ladle(self):
        cands = []
        if self.args.ladle_bin:
            cands.append(self.args.ladle_bin)
        if os.environ.get("LADLE_BIN"):
            cands.append(os.environ["LADLE_BIN"])
        repo = Path(__file__).resolve().parents[2]
        cands.append(str(repo / "target" / "release" / "ladle"))
        which = shutil.which("ladle")
        if which:
            cands.append(which)
        for c in cands:
            if os.path.isfile(c) and os.access(c, os.X_OK):
                return str(Path(c).resolve())
        return None

    # -- time

    def elapsed(self):
        return time.monotonic() - self.t0

    def left(self):
        return self.deadline - time.monotonic()

    def budget(self, want):
        """A step's timeout: ``want``, cut to what the run's budget leaves (≥ 1 s)."""
        if self.in_cleanup:
            return float(want)
        return max(1.0, min(float(want), self.left() - CLEANUP_RESERVE))

    # -- pynvml

    def nvml(self):
        """The pynvml module, initialised; CheckError says why not."""
        if self._nvml is not None:
            return self._nvml
        if self._nvml_error is not None:
            raise CheckError(self._nvml_error)
        try:
            import pynvml  # noqa: PLC0415 (lazy: absent without the driver's Python bindings)
        except ImportError as e:
            self._nvml_error = f"pynvml not importable ({fmt_exc(e)}); install nvidia-ml-py"
            raise CheckError(self._nvml_error) from None
        try:
            pynvml.nvmlInit()
        except Exception as e:  # pynvml.NVMLError and its subclasses
            self._nvml_error = f"no NVIDIA driver: pynvml nvmlInit failed with {fmt_exc(e)}"
            raise CheckError(self._nvml_error) from None
        self._nvml = pynvml
        return pynvml

    def gpu0(self):
        """(pynvml, handle, uuid) of GPU 0."""
        nv = self.nvml()
        try:
            if nv.nvmlDeviceGetCount() < 1:
                raise CheckError("NVML sees no GPU")
            h = nv.nvmlDeviceGetHandleByIndex(0)
            uuid = nv.nvmlDeviceGetUUID(h)
        except CheckError:
            raise
        except Exception as e:
            raise CheckError(f"NVML cannot describe GPU 0: {fmt_exc(e)}") from None
        if isinstance(uuid, bytes):
            uuid = uuid.decode()
        return nv, h, uuid

    # -- processes

    def run(self, cmd, timeout=30, env=None, cwd=None, input_text=None, name=None):
        """Runs a command to completion (output to files: no pipe can hang us)."""
        self.counter += 1
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", name or os.path.basename(str(cmd[0])))[:40]
        base = self.logs / "cmd" / f"{self.counter:03d}-{name}"
        out_p, err_p = Path(f"{base}.out"), Path(f"{base}.err")
        timeout = self.budget(timeout)
        rec = {"cmd": " ".join(shlex.quote(str(c)) for c in cmd)}
        t = time.monotonic()
        rec.update(run_to_files(cmd, out_p, err_p, timeout=timeout, cwd=cwd, input_text=input_text,
                                env=env if env is not None else self.base_env))
        rec["seconds"] = round(time.monotonic() - t, 2)
        rec["stdout"] = read_tail(out_p, 200_000)
        rec["stderr"] = read_tail(err_p)
        return rec

    def spawn(self, name, cmd, env=None, cwd=None):
        """Starts a background process (own session), output to LOGS/name.log."""
        log = self.logs / f"{name}.log"
        f = open(log, "ab")
        try:
            p = subprocess.Popen([str(c) for c in cmd], stdin=subprocess.DEVNULL, stdout=f,
                                 stderr=subprocess.STDOUT,
                                 env=env if env is not None else self.base_env,
                                 cwd=cwd or str(self.work), start_new_session=True)
        except OSError as e:
            raise CheckError(f"cannot start {name}: {fmt_exc(e)}") from None
        finally:
            f.close()
        self.procs.append((name, p))
        return p, log

    @staticmethod
    def _killpg(pid, sig):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self, p, sig=signal.SIGTERM, timeout=10, group=True):
        """Signals a spawned process (its group, unless ``group`` is false) and waits;
        SIGKILL after ``timeout``. Returns {rc, how}. A scheduler is signalled alone: what it
        started (MPS, jobs) must see only what the scheduler itself does on SIGTERM."""
        if p.poll() is not None:
            return {"rc": p.returncode, "how": "had exited"}

        def send(s):
            if group:
                self._killpg(p.pid, s)
            else:
                try:
                    p.send_signal(s)
                except (ProcessLookupError, PermissionError):
                    pass

        send(sig)
        try:
            rc = p.wait(timeout=self.budget(timeout) if self.in_cleanup else max(1.0, min(timeout, self.left())))
            return {"rc": rc, "how": f"exited after {signal.Signals(sig).name}"}
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
            try:
                rc = p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                rc = None
            return {"rc": rc, "how": f"SIGKILL after {signal.Signals(sig).name} was ignored for {timeout} s"}

    # -- ladle

    def need_ladle(self):
        if not self.ladle:
            raise CheckError("no ladle binary: pass --ladle-bin or set LADLE_BIN "
                             "(target/release/ladle not found)")

    def ladle_cmd(self, args, timeout=40, cwd=None, name=None):
        self.need_ladle()
        return self.run([self.ladle, *args], timeout=timeout, cwd=cwd or str(self.work),
                        name=name or ("ladle-" + args[0]))

    def new_state(self, name):
        d = self.work / name
        d.mkdir(parents=True, exist_ok=True)
        self.state_dirs.append(d)
        self.mps_dirs.append((d / "mps" / "pipe", d / "mps" / "log"))
        return d

    def queue(self, state):
        rec = self.ladle_cmd(["queue", "--dir", str(state), "--json"], timeout=40, name="ladle-queue")
        if rec.get("rc") != 0:
            raise CheckError(f"ladle queue failed ({rec.get('error') or 'rc ' + str(rec.get('rc'))})",
                             rec.get("stderr"))
        try:
            return json.loads(rec["stdout"])
        except ValueError as e:
            raise CheckError(f"ladle queue --json printed no JSON: {e}", rec.get("stdout")) from None

    def start_scheduler(self, name, state, extra, wait_s=30):
        """Starts ``ladle scheduler --dir STATE EXTRA…`` and waits until ``ladle queue``
        answers. Returns (Popen, log path, seconds to ready)."""
        self.need_ladle()
        env = dict(self.base_env)
        env["LADLE_LOG"] = "warn,ladle_scheduler=info"
        cmd = [self.ladle, "scheduler", "--dir", str(state), *extra]
        p, log = self.spawn(name, cmd, env=env)
        self.schedulers.append(p)
        t = time.monotonic()
        deadline = t + self.budget(wait_s)
        sock = state / "scheduler.sock"
        last = None
        while time.monotonic() < deadline:
            if p.poll() is not None:
                text = read_tail(log)
                last_line = next((ln for ln in reversed(text.splitlines()) if ln.strip()), "")
                raise CheckError(f"`{' '.join(cmd)}` exited with {p.returncode} before it was ready: "
                                 f"{last_line[:300]}", text)
            if sock.exists():
                rec = self.ladle_cmd(["queue", "--dir", str(state), "--json"], timeout=10,
                                     name="ladle-queue-ready")
                if rec.get("rc") == 0:
                    return p, log, round(time.monotonic() - t, 2)
                last = rec.get("stderr")
            time.sleep(0.2)
        raise CheckError(f"`{' '.join(cmd)}` not ready after {wait_s} s (last queue error: {last})",
                         read_tail(log))

    def stop_scheduler(self, p, log):
        r = self.stop(p, signal.SIGTERM, timeout=15, group=False)
        r["log_tail"] = read_tail(log, 2500)
        return r

    # -- MPS

    def mps_env(self, pipe, log):
        env = dict(self.base_env)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(log)
        return env

    def require(self, ladle=False, nvml=False, mps=False):
        """One CheckError naming everything missing (the driver first). ``nvml``: pynvml
        must work; otherwise (with ``mps``) only a missing driver blocks, not a missing
        pynvml (ladle reads NVML itself)."""
        missing = []
        if nvml or mps:
            try:
                self.gpu0()
            except CheckError as e:
                if nvml or not str(e).startswith("pynvml not importable"):
                    missing.append(str(e))
                else:
                    try:
                        import ctypes  # noqa: PLC0415

                        ctypes.CDLL("libnvidia-ml.so.1")
                    except OSError as le:
                        missing.append(f"no NVIDIA driver: {le}")
        if mps and not self.mps_control:
            missing.append("nvidia-cuda-mps-control is not on PATH (no NVIDIA driver utilities)")
        if ladle and not self.ladle:
            missing.append("no ladle binary: pass --ladle-bin or set LADLE_BIN")
        if missing:
            raise CheckError("; ".join(missing))

    def need_mps(self):
        if not self.mps_control:
            raise CheckError("nvidia-cuda-mps-control is not on PATH (no NVIDIA driver utilities)")

    def mps_start(self, pipe, log):
        """``nvidia-cuda-mps-control -d`` on these directories (no CUDA_VISIBLE_DEVICES, as
        ladle does); waits for its control pipe and a ``get_server_list`` answer."""
        self.need_mps()
        pipe.mkdir(parents=True, exist_ok=True)
        log.mkdir(parents=True, exist_ok=True)
        if (pipe, log) not in self.mps_dirs:
            self.mps_dirs.append((pipe, log))
        rec = self.run([self.mps_control, "-d"], timeout=20, env=self.mps_env(pipe, log),
                       name="mps-control-d")
        if rec.get("rc") != 0:
            raise CheckError(f"`nvidia-cuda-mps-control -d` failed ({rec.get('error') or rec.get('rc')})",
                             rec.get("stderr") + read_tail(log / "control.log"))
        deadline = time.monotonic() + self.budget(10)
        while time.monotonic() < deadline and not (pipe / "control").exists():
            time.sleep(0.1)
        probe = self.mps_send(pipe, log, "get_server_list", timeout=15)
        return {"start": {k: rec.get(k) for k in ("rc", "seconds", "stderr")},
                "control_pipe_exists": (pipe / "control").exists(),
                "get_server_list": probe,
                "processes": mps_processes(pipe)}

    def mps_send(self, pipe, log, command, timeout=15):
        self.need_mps()
        rec = self.run([self.mps_control], timeout=timeout, env=self.mps_env(pipe, log),
                       input_text=command + "\n", name="mps-" + command.split()[0])
        return {"rc": rec.get("rc"), "stdout": tail(rec.get("stdout"), 2000),
                "stderr": tail(rec.get("stderr"), 2000), "error": rec.get("error")}

    def mps_wait_gone(self, pipe, seconds):
        deadline = time.monotonic() + (seconds if self.in_cleanup else max(0.5, min(seconds, self.left() - 5)))
        while time.monotonic() < deadline:
            if not [p for p in mps_processes(pipe) if p["program"] == "nvidia-cuda-mps-control"]:
                return True
            time.sleep(0.2)
        return not [p for p in mps_processes(pipe) if p["program"] == "nvidia-cuda-mps-control"]

    def mps_quit(self, pipe, log, wait_s=15):
        """``echo quit | nvidia-cuda-mps-control``; whether the control daemon went away."""
        before = mps_processes(pipe)
        sent = self.mps_send(pipe, log, "quit", timeout=15) if self.mps_control else None
        gone = self.mps_wait_gone(pipe, wait_s)
        # Its server follows once its clients are gone.
        deadline = time.monotonic() + (5 if gone else 0)
        while time.monotonic() < deadline and mps_processes(pipe):
            time.sleep(0.2)
        return {"before": before, "quit": sent, "control_daemon_gone": gone,
                "all_mps_processes_gone": not mps_processes(pipe),
                "left": mps_processes(pipe), "control_pipe_exists_after": (pipe / "control").exists(),
                "control_log_tail": read_tail(log / "control.log", 1500)}

    def mps_kill(self, pipe):
        """SIGTERM, then SIGKILL, the MPS processes whose pipe dir is ``pipe`` (ours)."""
        killed = []
        for sig in (signal.SIGTERM, signal.SIGKILL):
            procs = mps_processes(pipe)
            if not procs:
                break
            for p in procs:
                try:
                    os.kill(p["pid"], sig)
                    killed.append({"pid": p["pid"], "signal": signal.Signals(sig).name})
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and mps_processes(pipe):
                time.sleep(0.2)
        return killed

    # -- clients (MPS clients and the memory holder)

    def start_client(self, name, first_mib, second_mib, env, hold_s=90):
        result = self.work / f"{name}.result.json"
        release = self.work / f"{name}.release"
        for f in (result, release):
            if f.exists():
                f.unlink()
        p, log = self.spawn(name, [self.python, self.client_py, result, release, first_mib,
                                   second_mib, hold_s], env=env)
        return {"name": name, "proc": p, "log": log, "result": result, "release": release}

    def wait_clients(self, clients, timeout):
        """Waits until every client wrote its result (or exited). Returns {name: result}."""
        deadline = time.monotonic() + self.budget(timeout)
        out = {}
        while time.monotonic() < deadline:
            for c in clients:
                if c["name"] in out:
                    continue
                if c["result"].exists():
                    try:
                        out[c["name"]] = json.loads(c["result"].read_text())
                        continue
                    except ValueError:
                        pass  # written atomically; retry
                if c["proc"].poll() is not None and not c["result"].exists():
                    out[c["name"]] = {"exited": c["proc"].returncode,
                                      "error": "client exited without a result",
                                      "stderr": read_tail(c["log"])}
            if len(out) == len(clients):
                break
            time.sleep(0.2)
        for c in clients:
            if c["name"] not in out:
                out[c["name"]] = {"error": f"no result after {timeout} s", "stderr": read_tail(c["log"])}
        return out

    def release_clients(self, clients):
        for c in clients:
            try:
                c["release"].touch()
            except OSError:
                pass
        res = {}
        for c in clients:
            res[c["name"]] = self.stop_after(c["proc"], 15)
        return res

    def stop_after(self, p, seconds):
        try:
            rc = p.wait(timeout=seconds if self.in_cleanup else max(1.0, min(seconds, self.left())))
            return {"rc": rc, "how": "exited"}
        except subprocess.TimeoutExpired:
            return self.stop(p, signal.SIGTERM, 5)

    # -- cleanup

    @staticmethod
    def journal_pgids(state):
        """Process-group ids (the wrappers' pids) of every attempt a scheduler directory's
        journal says was started."""
        out = set()
        try:
            lines = (state / "journal.jsonl").read_text().splitlines()
        except OSError:
            return out
        for line in lines:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("event") == "started" and isinstance(r.get("pid"), int):
                out.add(r["pid"])
        return out

    @staticmethod
    def group_members(pgid):
        members = []
        try:
            pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
        except OSError:
            return members
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    members.append(pid)
            except (OSError, IndexError, ValueError):
                continue
        return members

    def job_groups_alive(self, pgids):
        alive = []
        for g in pgids:
            try:
                os.killpg(g, 0)
                alive.append(g)
            except (ProcessLookupError, PermissionError):
                pass
        return alive

    def cleanup(self):
        # Cleanup's own steps keep their full timeouts, whatever the budget says.
        self.in_cleanup = True
        report = {}
        for name, p in list(self.procs):
            if p.poll() is None:
                r = self.stop(p, signal.SIGTERM, 15, group=not any(p is q for q in self.schedulers))
                report.setdefault("stopped_processes", []).append({"name": name, **r})
        # Job process groups (their wrapper's pid is the group id), when a member still is
        # a ladle job (the wrapper's marker in its command line, or LADLE_JOB_ID in its
        # environment): never a group that merely reuses the number.
        ours = []
        for state in self.state_dirs:
            for g in sorted(self.journal_pgids(state)):
                members = self.group_members(g)
                if any("ladle-job-" in (proc_name(m) or "") or proc_env_var(m, "LADLE_JOB_ID")[0]
                       for m in members):
                    ours.append(g)
        if ours:
            report["killed_job_groups"] = ours
            for g in ours:
                self._killpg(g, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.job_groups_alive(ours):
                time.sleep(0.2)
            for g in self.job_groups_alive(ours):
                self._killpg(g, signal.SIGKILL)
        # MPS daemons on our directories.
        for pipe, log in self.mps_dirs:
            if mps_processes(pipe) or (pipe / "control").exists():
                entry = {"pipe": str(pipe)}
                if self.mps_control:
                    entry["quit"] = self.mps_send(pipe, log, "quit", timeout=10)
                    entry["gone_after_quit"] = self.mps_wait_gone(pipe, 10)
                if mps_processes(pipe):
                    entry["killed"] = self.mps_kill(pipe)
                entry["left"] = mps_processes(pipe)
                report.setdefault("mps", []).append(entry)
        left_procs = [name for name, p in self.procs if p.poll() is None]
        left_mps = [p for pipe, _ in self.mps_dirs for p in mps_processes(pipe)]
        left_jobs = self.job_groups_alive(ours)
        report["left_running"] = {"processes": left_procs, "mps": left_mps, "job_groups": left_jobs}
        report["nothing_left_running"] = not (left_procs or left_mps or left_jobs)
        # Keep the scheduler directories (journals, job logs, MPS logs) with the logs.
        for state in self.state_dirs:
            if state.exists():
                copy_regular_files(state, self.logs / "state" / state.name)
        if report["nothing_left_running"]:
            shutil.rmtree(self.work, ignore_errors=True)
        else:
            report["work_dir_kept"] = str(self.work)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
        return report


# ---------------------------------------------------------------------------------------
# NVML readings


def _s(x):
    return x.decode() if isinstance(x, bytes) else x


def field(d, key, fn):
    try:
        d[key] = fn()
    except Exception as e:
        d[key] = {"error": fmt_exc(e)}
    return d[key]


def nvml_device(nv, h):
    dev = {}
    field(dev, "name", lambda: _s(nv.nvmlDeviceGetName(h)))
    field(dev, "uuid", lambda: _s(nv.nvmlDeviceGetUUID(h)))

    def mem():
        m = nv.nvmlDeviceGetMemoryInfo(h)
        return {"total_mib": m.total // MIB, "used_mib": m.used // MIB, "free_mib": m.free // MIB,
                "total_minus_free_mib": (m.total - m.free) // MIB}

    field(dev, "memory", mem)

    def cm():
        c = int(nv.nvmlDeviceGetComputeMode(h))
        name = COMPUTE_MODES.get(c, f"unknown {c}")
        return {"value": c, "name": name, "is_default": c == 0, "is_exclusive_process": c == 3,
                "is_prohibited": c == 2, "is_exclusive_thread": c == 1}

    field(dev, "compute_mode", cm)
    field(dev, "gpm_supported", lambda: bool(nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice))

    def mig():
        cur, pending = nv.nvmlDeviceGetMigMode(h)
        return {"current": int(cur), "pending": int(pending), "enabled": int(cur) != 0}

    field(dev, "mig_mode", mig)
    field(dev, "persistence_mode", lambda: int(nv.nvmlDeviceGetPersistenceMode(h)))

    def util():
        u = nv.nvmlDeviceGetUtilizationRates(h)
        return {"gpu": u.gpu, "memory": u.memory}

    field(dev, "utilization", util)
    field(dev, "cuda_compute_capability", lambda: list(nv.nvmlDeviceGetCudaComputeCapability(h)))
    return dev


def nvml_processes(nv, h):
    """What each NVML process call returns: pid, MiB, the pid's command line here."""
    out = {}
    calls = [("running_compute_processes", ["nvmlDeviceGetComputeRunningProcesses",
                                            "nvmlDeviceGetComputeRunningProcesses_v2"]),
             ("mps_compute_running_processes", ["nvmlDeviceGetMPSComputeRunningProcesses",
                                                "nvmlDeviceGetMPSComputeRunningProcesses_v2"])]
    for key, names in calls:
        errors = []
        for fn_name in names:
            fn = getattr(nv, fn_name, None)
            if fn is None:
                errors.append(f"{fn_name}: not in this pynvml")
                continue
            try:
                procs = fn(h)
            except Exception as e:
                errors.append(f"{fn_name}: {fmt_exc(e)}")
                continue
            out[key] = {"call": fn_name, "processes": [
                {"pid": p.pid,
                 "used_mib": None if getattr(p, "usedGpuMemory", None) is None else round(p.usedGpuMemory / MIB, 1),
                 "cmdline": proc_name(p.pid)} for p in procs]}
            break
        else:
            out[key] = {"error": "; ".join(errors)}
    return out


def gpm_metrics(nv, h, period=1.0):
    """SM activity, SM occupancy and DRAM bandwidth (percent) over ``period`` seconds."""
    s1 = nv.nvmlGpmSampleAlloc()
    s2 = nv.nvmlGpmSampleAlloc()
    try:
        nv.nvmlGpmSampleGet(h, s1)
        time.sleep(period)
        nv.nvmlGpmSampleGet(h, s2)
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        ids = [("sm_util", nv.NVML_GPM_METRIC_SM_UTIL), ("sm_occupancy", nv.NVML_GPM_METRIC_SM_OCCUPANCY),
               ("dram_bw_util", nv.NVML_GPM_METRIC_DRAM_BW_UTIL)]
        mg.numMetrics = len(ids)
        mg.sample1 = s1
        mg.sample2 = s2
        for i, (_, mid) in enumerate(ids):
            mg.metrics[i].metricId = mid
        nv.nvmlGpmMetricsGet(mg)
        out = {}
        for i, (name, _) in enumerate(ids):
            ret = int(mg.metrics[i].nvmlReturn)
            out[name] = round(mg.metrics[i].value, 2) if ret == 0 else {"nvml_return": ret}
        return out
    finally:
        for s in (s1, s2):
            try:
                nv.nvmlGpmSampleFree(s)
            except Exception:
                pass


def nvml_memory_used_mib(nv, h):
    m = nv.nvmlDeviceGetMemoryInfo(h)
    return (m.total - m.free) // MIB


def nvidia_smi(ctx):
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {"error": "nvidia-smi not on PATH"}
    apps = ctx.run([exe, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
                   timeout=20, name="nvidia-smi-apps")
    full = ctx.run([exe], timeout=20, name="nvidia-smi")
    return {"compute_apps": {"rc": apps.get("rc"), "stdout": tail(apps.get("stdout"), 3000),
                             "stderr": tail(apps.get("stderr"), 1000)},
            "nvidia_smi_tail": tail(full.get("stdout"), 2500),
            "shows_mps_server": "nvidia-cuda-mps-server" in (apps.get("stdout") or "") + (full.get("stdout") or "")}


# ---------------------------------------------------------------------------------------
# Sections


def section_nvml(ctx, res):
    errors = []
    # 1. Direct pynvml readings.
    direct = {}
    res["direct"] = direct
    try:
        nv = ctx.nvml()
        field(direct, "driver_version", lambda: _s(nv.nvmlSystemGetDriverVersion()))
        field(direct, "cuda_driver_version", lambda: nv.nvmlSystemGetCudaDriverVersion_v2())
        field(direct, "nvml_version", lambda: _s(nv.nvmlSystemGetNVMLVersion()))
        count = field(direct, "device_count", lambda: nv.nvmlDeviceGetCount())
        direct["devices"] = []
        for i in range(count if isinstance(count, int) else 0):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            dev = {"index": i, **nvml_device(nv, h)}
            dev["processes"] = nvml_processes(nv, h)
            if dev.get("gpm_supported") is True:
                field(dev, "gpm_metrics_idle_1s", lambda h=h: gpm_metrics(nv, h, 1.0))
            direct["devices"].append(dev)
        if not direct["devices"]:
            errors.append("NVML lists no GPU")
        for k in ("driver_version",):
            if isinstance(direct.get(k), dict):
                errors.append(f"{k}: {direct[k]['error']}")
        direct["ok"] = not errors
    except CheckError as e:
        direct.update(ok=False, error=str(e))
        errors.append(str(e))
    # 2. ladle's view.
    view = {}
    res["ladle"] = view
    sched = log = None
    state = None
    helper = None
    try:
        state = ctx.new_state("nvml")
        sched, log, ready_s = ctx.start_scheduler("sched-nvml", state, ["--gpu", "nvml", "--mps", "off"])
        view["ready_s"] = ready_s
        polls = []
        for _ in range(4):
            q = ctx.queue(state)
            entry = {"t": round(ctx.elapsed(), 2), "gpus": q.get("gpus")}
            try:
                nv, h, _ = ctx.gpu0()
                entry["nvml_used_mib"] = nvml_memory_used_mib(nv, h)
            except CheckError:
                pass
            polls.append(entry)
            time.sleep(1.0)
        view["idle_polls"] = polls
        used_before = [p["gpus"][0]["memory_used_mib"] for p in polls if p.get("gpus")]
        view["used_mib_idle"] = used_before
        if not used_before:
            raise CheckError("ladle queue --json reports no GPU")
        gpu = polls[-1]["gpus"][0]
        view["unsuitable"] = gpu.get("unsuitable")
        view["gpu_fields"] = sorted(gpu.keys())
        # A helper (no MPS) holds 2 GiB.
        helper = ctx.start_client("holder-2g", 2048, 0, env=dict(ctx.base_env), hold_s=60)
        r = ctx.wait_clients([helper], timeout=90)["holder-2g"]
        view["helper"] = r
        if not (r.get("first") or {}).get("ok"):
            raise CheckError(f"the helper could not hold 2 GiB: {r.get('init_error') or r.get('first') or r.get('error')}",
                             r.get("stderr") or read_tail(helper["log"]))
        time.sleep(2.5)  # ladle samples at 1 Hz
        held = []
        for _ in range(3):
            q = ctx.queue(state)
            g = q["gpus"][0]
            entry = {"t": round(ctx.elapsed(), 2), "memory_used_mib": g.get("memory_used_mib"),
                     "sm_activity_risk": g.get("sm_activity_risk"), "jobs": g.get("jobs")}
            try:
                nv, h, _ = ctx.gpu0()
                entry["nvml_used_mib"] = nvml_memory_used_mib(nv, h)
            except CheckError:
                pass
            held.append(entry)
            time.sleep(1.0)
        view["holding_polls"] = held
        try:
            nv, h, _ = ctx.gpu0()
            view["nvml_processes_while_holding"] = nvml_processes(nv, h)
            view["helper_pid_in_running_compute_processes"] = helper["proc"].pid in [
                p["pid"] for p in view["nvml_processes_while_holding"].get("running_compute_processes", {}).get("processes", [])]
        except CheckError as e:
            view["nvml_processes_while_holding"] = {"error": str(e)}
        rise = median([e["memory_used_mib"] for e in held]) - median(used_before)
        view["ladle_used_rise_mib"] = rise
        nv_before = [p["nvml_used_mib"] for p in polls if "nvml_used_mib" in p]
        nv_after = [e["nvml_used_mib"] for e in held if "nvml_used_mib" in e]
        if nv_before and nv_after:
            view["nvml_used_rise_mib"] = median(nv_after) - median(nv_before)
        view["rise_about_2gib"] = 1800 <= rise <= 3800
        view["rise_note"] = "expected 2048 MiB plus the helper's CUDA context (a few hundred MiB)"
        if not view["rise_about_2gib"]:
            errors.append(f"ladle's memory_used_mib rose by {rise} MiB while a helper held 2 GiB")
        view["ok"] = view["rise_about_2gib"]
    except CheckError as e:
        view.update(ok=False, error=str(e), stderr=tail(e.stderr))
        errors.append(f"ladle view: {e}")
    finally:
        if helper is not None:
            view["helper_stop"] = ctx.release_clients([helper])
        if sched is not None:
            view["scheduler_stop"] = ctx.stop_scheduler(sched, log)
    conclude(res, errors)


def _client_env(ctx, pipe, log, uuid, limit):
    env = ctx.mps_env(pipe, log)
    env["CUDA_VISIBLE_DEVICES"] = uuid
    if limit is not None:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = limit
    return env


def _limit_worked(r):
    first, second = r.get("first") or {}, r.get("second") or {}
    return bool(first.get("ok")) and second.get("ok") is False and bool(second.get("is_oom"))


def section_mps_limit(ctx, res):
    ctx.require(nvml=True, mps=True)
    nv, h, uuid = ctx.gpu0()
    res["gpu_uuid"] = uuid
    res["preexisting_mps_processes"] = mps_processes()
    pipe, log = ctx.work / "mps-private" / "pipe", ctx.work / "mps-private" / "log"
    res["pipe_dir"] = str(pipe)
    errors = []
    clients = []
    try:
        res["daemon"] = ctx.mps_start(pipe, log)
        res["memory_used_mib_before"] = nvml_memory_used_mib(nv, h)
        # Phase 1: A (limit as ladle writes it) and B (no limit) at once.
        a = ctx.start_client("mps-A-0eq2048M", 1024, 4096, _client_env(ctx, pipe, log, uuid, "0=2048M"))
        b = ctx.start_client("mps-B-nolimit", 4096, 0, _client_env(ctx, pipe, log, uuid, None))
        clients = [a, b]
        results = ctx.wait_clients(clients, timeout=90)
        res["A"] = results[a["name"]]
        res["B"] = results[b["name"]]
        # While both hold their memory: what NVML, nvidia-smi and MPS report.
        seen = {"memory_used_mib": nvml_memory_used_mib(nv, h)}
        seen["nvml"] = nvml_processes(nv, h)
        seen["nvidia_smi"] = nvidia_smi(ctx)
        servers = ctx.mps_send(pipe, log, "get_server_list")
        seen["get_server_list"] = servers
        seen["get_client_list"] = {}
        for spid in re.findall(r"\d+", servers.get("stdout") or ""):
            seen["get_client_list"][spid] = ctx.mps_send(pipe, log, f"get_client_list {spid}")
        seen["mps_processes"] = mps_processes(pipe)
        res["while_holding"] = seen
        pids = {"A": a["proc"].pid, "B": b["proc"].pid}
        listed = lambda key: [p["pid"] for p in seen["nvml"].get(key, {}).get("processes", [])]  # noqa: E731
        client_list_pids = set()
        for v in seen["get_client_list"].values():
            client_list_pids.update(int(x) for x in re.findall(r"\d+", v.get("stdout") or ""))
        res["clients_seen"] = {
            name: {"pid": pid,
                   "in_running_compute_processes": pid in listed("running_compute_processes"),
                   "in_mps_compute_running_processes": pid in listed("mps_compute_running_processes"),
                   "in_mps_get_client_list": pid in client_list_pids}
            for name, pid in pids.items()}
        res["clients_were_mps_clients"] = all(
            v["in_mps_compute_running_processes"] or v["in_mps_get_client_list"] for v in res["clients_seen"].values()
        ) or seen["nvidia_smi"].get("shows_mps_server", False)
        res["clients_release"] = ctx.release_clients(clients)
        clients = []
        a_ok = _limit_worked(res["A"])
        b_ok = bool((res["B"].get("first") or {}).get("ok"))
        res["A_limited_as_expected"] = a_ok
        res["B_unlimited_as_expected"] = b_ok
        if not a_ok:
            errors.append("client A (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M) was not limited as expected: "
                          f"first={res['A'].get('first')}, second={res['A'].get('second')}, "
                          f"init_error={res['A'].get('init_error')}")
        if not b_ok:
            errors.append(f"client B (no limit) could not allocate 4 GiB: {res['B'].get('first') or res['B'].get('init_error') or res['B'].get('error')}")
        if not res["clients_were_mps_clients"]:
            errors.append("no evidence that the clients ran under MPS (not in NVML's MPS list, "
                          "get_client_list or nvidia-smi)")
        # Phase 2: the other forms of the limit.
        forms = {"0=2G": "0=2G", "uuid=2048M": f"{uuid}=2048M", "bare 2048M": "2048M"}
        fclients = []
        for i, (label, value) in enumerate(forms.items()):
            fclients.append((label, value, ctx.start_client(f"mps-form{i}", 1024, 4096,
                                                             _client_env(ctx, pipe, log, uuid, value))))
        clients = [c for _, _, c in fclients]
        fres = ctx.wait_clients(clients, timeout=90)
        res["forms"] = {"0=2048M": {"value": "0=2048M", "limit_worked": a_ok}}
        for label, value, c in fclients:
            r = fres[c["name"]]
            res["forms"][label] = {"value": value, "limit_worked": _limit_worked(r), "result": r}
        res["forms_release"] = ctx.release_clients(clients)
        clients = []
        res["forms_that_limit"] = [k for k, v in res["forms"].items() if v["limit_worked"]]
    except CheckError as e:
        note_error(res, errors, e)
    finally:
        if clients:
            res["clients_stop_on_error"] = ctx.release_clients(clients)
        if ctx.mps_control:
            q = ctx.mps_quit(pipe, log, wait_s=15)
            res["quit"] = q
            if not q["control_daemon_gone"]:
                errors.append("the MPS control daemon did not go away after `quit`")
                res["killed_after_quit"] = ctx.mps_kill(pipe)
    conclude(res, errors)


def section_mps_adopt(ctx, res):
    # (--gpu-kind sim: ladle on simulated GPUs still starts MPS with --mps on.)
    ctx.require(ladle=True, mps=True)
    state = ctx.new_state("adopt")
    pipe, log = state / "mps" / "pipe", state / "mps" / "log"
    res["pipe_dir"] = str(pipe)
    res["preexisting_mps_processes"] = mps_processes()
    errors = []
    sched = slog = None
    try:
        # 1. ladle starts MPS, then (no jobs) quits it on SIGTERM.
        gpu = ["--gpu", "sim"] if ctx.args.gpu_kind == "sim" else ["--gpu", "nvml"]
        res["gpu_kind"] = gpu[1]
        sched, slog, ready = ctx.start_scheduler("sched-adopt-1", state, gpu + ["--mps", "on"])
        text = read_tail(slog, 20000)
        first = {"ready_s": ready, "log_says_started": "started the MPS control daemon" in text,
                 "log_says_adopted": "adopted a running MPS control daemon" in text,
                 "mps_processes_while_running": mps_processes(pipe)}
        res["first_start"] = first
        first["stop"] = ctx.stop_scheduler(sched, slog)
        sched = None
        first["control_daemon_gone_after_sigterm"] = ctx.mps_wait_gone(pipe, 10)
        first["mps_processes_after_sigterm"] = mps_processes(pipe)
        first["control_pipe_exists_after"] = (pipe / "control").exists()
        if not first["log_says_started"]:
            errors.append("the scheduler's log does not say it started MPS")
        if not first["control_daemon_gone_after_sigterm"]:
            errors.append("the MPS daemon ladle started was still running 10 s after the scheduler's SIGTERM "
                          "(expected: quit, no jobs were running)")
            first["our_quit"] = ctx.mps_quit(pipe, log, 15)
            if not first["our_quit"]["control_daemon_gone"]:
                first["killed"] = ctx.mps_kill(pipe)
        # 2. A daemon started by hand on ladle's pipe dir is adopted.
        res["manual_daemon"] = ctx.mps_start(pipe, log)
        sched, slog, ready = ctx.start_scheduler("sched-adopt-2", state, gpu + ["--mps", "on"])
        text = read_tail(slog, 20000)
        second = {"ready_s": ready, "log_says_adopted": "adopted a running MPS control daemon" in text,
                  "log_says_started": "started the MPS control daemon" in text}
        res["second_start"] = second
        second["stop"] = ctx.stop_scheduler(sched, slog)
        sched = None
        time.sleep(1.0)
        second["control_daemon_alive_after_sigterm"] = bool(
            [p for p in mps_processes(pipe) if p["program"] == "nvidia-cuda-mps-control"])
        second["note"] = "an adopted daemon is expected to stay up (ladle quits only what it started)"
        if not second["log_says_adopted"]:
            errors.append("the scheduler did not log that it adopted the running MPS daemon")
    except CheckError as e:
        note_error(res, errors, e)
    finally:
        if sched is not None:
            res["scheduler_stop_on_error"] = ctx.stop_scheduler(sched, slog)
        if ctx.mps_control and (mps_processes(pipe) or (pipe / "control").exists()):
            q = ctx.mps_quit(pipe, log, wait_s=15)
            res["final_quit"] = q
            if not q["control_daemon_gone"]:
                res["killed_after_quit"] = ctx.mps_kill(pipe)
                errors.append("the MPS control daemon did not go away after `quit`")
    conclude(res, errors)


def read_journal(state):
    try:
        lines = (state / "journal.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def run_jobs(ctx, res, state, specs, timeout):
    """Submits ``specs`` [(label, command, gpu_mem or None, cwd)], polls ``ladle queue``
    until all are final (or ``timeout``), and gathers states, journal, logs and timing."""
    submitted = []
    t_submit = now()
    for label, cmd, mem, cwd in specs:
        args = ["submit", "--dir", str(state), "--json"]
        if mem:
            args += ["--gpu-mem", mem]
        rec = ctx.ladle_cmd(args + ["--", *cmd], timeout=40, cwd=cwd, name="ladle-submit")
        if rec.get("rc") != 0:
            raise CheckError(f"ladle submit failed for {label} ({rec.get('error') or 'rc ' + str(rec.get('rc'))})",
                             rec.get("stderr"))
        try:
            ans = json.loads(rec["stdout"])
        except ValueError:
            raise CheckError(f"ladle submit --json printed no JSON for {label}", rec.get("stdout")) from None
        submitted.append({"label": label, "id": ans["id"], "estimate_mib": ans.get("estimate_mib"),
                          "gpu_mem": mem, "command": cmd})
    res["submitted"] = submitted
    ids = {s["id"] for s in submitted}
    seen = {i: {"first_running": None, "final_seen": None, "gpus": None, "pid": None} for i in ids}
    polls = []
    max_running = 0
    wait_s = ctx.budget(timeout)
    res["wait_limit_s"] = round(wait_s, 1)
    deadline = time.monotonic() + wait_s
    nvh = None
    try:
        nvh = ctx.gpu0() if ctx.args.gpu_kind != "sim" else None
    except CheckError:
        nvh = None
    final = False
    last = None
    while time.monotonic() < deadline:
        q = ctx.queue(state)
        last = q
        t = now()
        jobs = {j["id"]: j for j in q.get("jobs", []) if j["id"] in ids}
        running = 0
        for i, j in jobs.items():
            st = j.get("state")
            if st == "running":
                running += 1
                if seen[i]["first_running"] is None:
                    seen[i]["first_running"] = t
                seen[i]["gpus"] = j.get("gpus")
                seen[i]["pid"] = j.get("pid")
            if st in FINAL_STATES and seen[i]["final_seen"] is None:
                seen[i]["final_seen"] = t
        max_running = max(max_running, running)
        entry = {"t": round(t - t_submit, 1),
                 "states": {str(i): (jobs.get(i) or {}).get("state") for i in sorted(ids)},
                 "gpus": [{"used_mib": g.get("memory_used_mib"), "sm_risk": round(g.get("sm_activity_risk", 0), 3),
                           "jobs": g.get("jobs")} for g in q.get("gpus", [])],
                 "peak_mib": {str(i): (jobs.get(i) or {}).get("peak_mib") for i in sorted(ids)}}
        if nvh is not None:
            nv, h, _ = nvh
            try:
                entry["nvml_used_mib"] = nvml_memory_used_mib(nv, h)
                procs = nvml_processes(nv, h)
                entry["nvml_process_counts"] = {
                    k: (len(v["processes"]) if "processes" in v else v.get("error")) for k, v in procs.items()}
            except Exception as e:
                entry["nvml_error"] = fmt_exc(e)
        polls.append(entry)
        if len(jobs) == len(ids) and all(j.get("state") in FINAL_STATES for j in jobs.values()):
            final = True
            break
        # A GPM sample doubles as the poll interval where the GPU has it.
        if nvh is not None and running:
            nv, h, _ = nvh
            try:
                entry["gpm"] = gpm_metrics(nv, h, 1.0)
                continue
            except Exception as e:
                entry["gpm"] = {"error": fmt_exc(e)}
        time.sleep(1.0)
    res["polls"] = polls
    res["all_final"] = final
    res["max_concurrent_jobs_observed"] = max_running
    if not final:
        res["timed_out_after_s"] = round(wait_s, 1)
        for s in submitted:
            j = next((x for x in (last or {}).get("jobs", []) if x["id"] == s["id"]), None)
            if j and j.get("state") not in FINAL_STATES:
                rec = ctx.ladle_cmd(["cancel", "--dir", str(state), str(s["id"])], timeout=20)
                s["cancel_on_timeout"] = {"rc": rec.get("rc"), "stderr": tail(rec.get("stderr"), 500)}
        # ladle SIGKILLs a cancelled job's group 10 s after its SIGTERM.
        until = time.monotonic() + 13
        while time.monotonic() < until:
            try:
                last = ctx.queue(state)
            except CheckError:
                break
            if all(x.get("state") in FINAL_STATES for x in last.get("jobs", []) if x["id"] in ids):
                break
            time.sleep(0.5)
    journal = read_journal(state)
    jobs_out = []
    for s in submitted:
        i = s["id"]
        j = next((x for x in (last or {}).get("jobs", []) if x["id"] == i), {})
        recs = [r for r in journal if r.get("id") == i]
        logs = ctx.ladle_cmd(["logs", "--dir", str(state), str(i)], timeout=30, name="ladle-logs")
        text = logs.get("stdout") or ""
        # Split `ladle logs` output into attempts ("== attempt N stdout (PATH)" headers; a
        # log without a final newline runs into the next header, so split anywhere).
        attempts = {}
        parts = re.split(r"== attempt (\d+) (stdout|stderr) \([^\n]*\)\n", text)
        for k in range(1, len(parts) - 2, 3):
            n, which, body = int(parts[k]), parts[k + 1], parts[k + 2]
            attempts.setdefault(n, {"stdout": "", "stderr": ""})[which] += body
        per_attempt = []
        for n in sorted(attempts):
            a = attempts[n]
            starting = next((r for r in recs if r.get("event") == "starting" and r.get("attempt") == n), {})
            finished = next((r for r in recs if r.get("event") == "finished" and r.get("attempt") == n), {})
            per_attempt.append({
                "attempt": n,
                "gpus": starting.get("gpus"),
                "limit_mib": starting.get("limit_mib"),
                "outcome": finished.get("outcome"),
                "exit_code": finished.get("code"),
                "peak_mib": finished.get("peak_mib"),
                "reason": finished.get("reason"),
                "job_reported": merge_checkjson(parse_checkjson(a["stdout"])),
                "oom_markers_in_stderr": [m for m in OOM_MARKERS if m in a["stderr"]],
                "stdout_tail": tail(a["stdout"], 1500),
                "stderr_tail": tail(a["stderr"], 2500),
            })
        last_att = per_attempt[-1] if per_attempt else {}
        rep = last_att.get("job_reported") or {}
        jobs_out.append({
            "label": s["label"], "id": i, "gpu_mem": s["gpu_mem"],
            "state": j.get("state"), "reason": j.get("reason"),
            "attempts": j.get("attempts"), "oom_retries": j.get("oom_retries"),
            "estimate_mib_at_submit": s["estimate_mib"], "estimate_mib_now": j.get("estimate_mib"),
            "exclusive": j.get("exclusive"),
            "peak_mib_observed_by_ladle": j.get("peak_mib"),
            "exit_code": last_att.get("exit_code"),
            "gpus": last_att.get("gpus") or seen[i]["gpus"],
            "submitted_at": j.get("submitted_at"),
            "first_seen_running_at": seen[i]["first_running"],
            "final_seen_at": seen[i]["final_seen"],
            "job_start": rep.get("start"), "job_end": rep.get("end"),
            "env_seen": rep.get("env"),
            "max_memory_allocated_mib": rep.get("max_memory_allocated_mib"),
            "attempt_details": per_attempt,
            "logs_rc": logs.get("rc"),
            "logs_stderr": tail(logs.get("stderr"), 500) if logs.get("rc") != 0 else None,
        })
    res["jobs"] = jobs_out
    res["journal_records"] = len(journal)
    ends = [j["final_seen_at"] for j in jobs_out if j["final_seen_at"]]
    subs = [j["submitted_at"] for j in jobs_out if j["submitted_at"]]
    if final and ends and subs:
        res["makespan_s_observed"] = round(max(ends) - min(subs), 1)
        res["makespan_note"] = "first submit to the poll that saw the last job final (1 s polls)"
    starts = [j["job_start"] for j in jobs_out if j["job_start"]]
    stops = [j["job_end"] for j in jobs_out if j["job_end"]]
    if starts and stops:
        res["makespan_s_job_clock"] = round(max(stops) - min(starts), 1)
        ivs = [(j["job_start"], j["job_end"]) for j in jobs_out if j["job_start"] and j["job_end"]]
        res["sum_job_runtime_s"] = round(sum(b - a for a, b in ivs), 1)
        events = sorted([(a, 1) for a, _ in ivs] + [(b, -1) for _, b in ivs])
        cur = best = 0
        for _, d in events:
            cur += d
            best = max(best, cur)
        res["max_overlapping_jobs_job_clock"] = best
    return jobs_out


def _scheduler_args(ctx, settle):
    if ctx.args.gpu_kind == "sim":
        args = ["--gpu", "sim", "--sim-gpus", "1", "--sim-gpu-mem", "80GiB", "--mps", "off"]
    else:
        args = ["--gpu", "nvml", "--mps", "on"]
    if settle is not None:
        args += ["--settle-s", str(settle)]
    return args


def _env_problems(ctx, job, state, uuids, under_mps):
    env = job.get("env_seen")
    if env is None:
        return ["the job printed no environment (no CHECKJSON line in `ladle logs`)"]
    problems = []
    last = (job.get("attempt_details") or [{}])[-1]
    cvd = env.get("CUDA_VISIBLE_DEVICES") or ""
    if not cvd.startswith("GPU-"):
        problems.append(f"CUDA_VISIBLE_DEVICES={cvd!r}, not a GPU UUID")
    gpus = last.get("gpus") or []
    want = ",".join(uuids[g] for g in gpus if g < len(uuids))
    if want and cvd != want:
        problems.append(f"CUDA_VISIBLE_DEVICES={cvd!r}, expected {want!r}")
    limit = last.get("limit_mib")
    # One entry per GPU of the job, keyed by the GPU's UUID (scheduler/daemon/src/mps.rs).
    want_limit = None if limit is None else ",".join(f"{uuids[g]}={limit}M" for g in gpus if g < len(uuids))
    if env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") != want_limit:
        problems.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={env.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')!r}, "
                        f"expected {want_limit!r} (journal limit_mib {limit})")
    if under_mps and env.get("CUDA_MPS_PIPE_DIRECTORY") != str(state / "mps" / "pipe"):
        problems.append(f"CUDA_MPS_PIPE_DIRECTORY={env.get('CUDA_MPS_PIPE_DIRECTORY')!r}, "
                        f"expected {str(state / 'mps' / 'pipe')!r}")
    return problems


def section_submit(ctx, res):
    sim = ctx.args.gpu_kind == "sim"
    ctx.require(ladle=True, mps=not sim)
    settle = ctx.args.settle_s
    res.update(gpu_kind="sim" if sim else "nvml", policy="ladle", settle_s=settle,
               settle_note=f"--settle-s {settle} (the policy's default is 20 s) to keep the run short")
    state = ctx.new_state("submit")
    errors = []
    sched = slog = None
    try:
        sched, slog, ready = ctx.start_scheduler("sched-submit", state, _scheduler_args(ctx, settle))
        res["scheduler_ready_s"] = ready
        q0 = ctx.queue(state)
        uuids = [g.get("uuid") for g in q0.get("gpus", [])]
        res["gpus"] = q0.get("gpus")
        if ctx.args.train_cmd:
            res["jobs_kind"] = "--train-cmd"
            specs = [(f"train{i + 1}", shlex.split(c), ctx.args.train_gpu_mem, os.getcwd())
                     for i, c in enumerate(ctx.args.train_cmd)]
        else:
            res["jobs_kind"] = "built-in torch matmul script" if not sim else "built-in sim script"
            mode = "sim" if sim else "gpu"
            mems = ["2GiB", "2GiB", None, None]
            specs = [(f"j{i + 1}", [ctx.python, str(ctx.job_py), "--tag", f"j{i + 1}", "--mode", mode,
                                    "--seconds", str(ctx.args.job_seconds), "--alloc-mib", "256"],
                      mem, str(ctx.work)) for i, mem in enumerate(mems)]
        jobs = run_jobs(ctx, res, state, specs, ctx.args.submit_timeout)
        res["scheduler_log_tail"] = read_tail(slog, 3000)
        if not res["all_final"]:
            errors.append(f"not all jobs finished within {res.get('timed_out_after_s')} s (then cancelled)")
        bad = [f"job {j['id']} ({j['label']}) {j['state']}" + (f": {j['reason']}" if j["reason"] else "")
               for j in jobs if j["state"] != "succeeded"]
        if bad:
            errors.append("; ".join(bad))
            res["stderr"] = "\n".join(
                f"--- job {j['id']} attempt {a['attempt']} stderr\n{a['stderr_tail']}"
                for j in jobs if j["state"] != "succeeded" for a in j["attempt_details"])[-TAIL:]
        if not ctx.args.train_cmd:
            for j in jobs:
                if not j.get("attempt_details"):
                    continue  # never started: reported above
                j["env_problems"] = _env_problems(ctx, j, state, uuids, under_mps=not sim)
                if j["env_problems"]:
                    errors.append(f"job {j['id']}: " + "; ".join(j["env_problems"]))
        res["peak_seen_by_ladle_for_every_job"] = all(j["peak_mib_observed_by_ladle"] for j in jobs)
    except CheckError as e:
        note_error(res, errors, e)
    finally:
        if sched is not None:
            res["scheduler_stop"] = ctx.stop_scheduler(sched, slog)
    conclude(res, errors)


def section_oom(ctx, res):
    sim = ctx.args.gpu_kind == "sim"
    ctx.require(ladle=True, mps=not sim)
    settle = ctx.args.settle_s
    res.update(gpu_kind="sim" if sim else "nvml", policy="ladle", settle_s=settle, gpu_mem="1GiB",
               allocates_mib=6144,
               expected="attempt 1 runs under CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3072M (max(1 GiB + 2 GiB margin, "
                        "1.5 x 1 GiB)), dies of CUDA out of memory; ladle retries it alone without a limit "
                        "(estimate raised), and it succeeds")
    state = ctx.new_state("oom")
    errors = []
    sched = slog = None
    try:
        sched, slog, ready = ctx.start_scheduler("sched-oom", state, _scheduler_args(ctx, settle))
        res["scheduler_ready_s"] = ready
        cmd = [ctx.python, str(ctx.job_py), "--tag", "oom", "--mode", "sim" if sim else "gpu",
               "--seconds", "3", "--alloc-mib", "6144", "--matmul-n", "1024"]
        jobs = run_jobs(ctx, res, state, [("oom", cmd, "1GiB", str(ctx.work))], ctx.args.oom_timeout)
        res["scheduler_log_tail"] = read_tail(slog, 3000)
        j = jobs[0]
        att = j["attempt_details"]
        first = att[0] if att else {}
        res["first_attempt_limit_mib"] = first.get("limit_mib")
        res["first_attempt_outcome"] = first.get("outcome")
        res["first_attempt_stderr_tail"] = first.get("stderr_tail")
        res["oom_detected"] = first.get("outcome") == "out_of_memory"
        res["mps_limit_enforced"] = res["oom_detected"]
        res["retried_without_limit"] = len(att) > 1 and att[1].get("limit_mib") is None
        res["final_state"] = j["state"]
        if not res["all_final"]:
            errors.append(f"the job did not finish within {res.get('timed_out_after_s')} s (then cancelled)")
        elif not res["oom_detected"]:
            if first.get("outcome") == "succeeded":
                errors.append(f"the 6 GiB allocation succeeded under a {first.get('limit_mib')} MiB MPS limit: "
                              "the limit was not enforced")
            else:
                errors.append(f"attempt 1 ended {first.get('outcome')} ({first.get('reason')}), not as CUDA out of "
                              f"memory; OOM markers found in its stderr: {first.get('oom_markers_in_stderr')}")
                res["stderr"] = first.get("stderr_tail")
        elif j["state"] != "succeeded":
            errors.append(f"after the OOM retry the job ended {j['state']}: {j['reason']}")
            res["stderr"] = (att[-1] if att else {}).get("stderr_tail")
    except CheckError as e:
        note_error(res, errors, e)
    finally:
        if sched is not None:
            res["scheduler_stop"] = ctx.stop_scheduler(sched, slog)
    conclude(res, errors)


SECTION_FNS = {"nvml": section_nvml, "mps_limit": section_mps_limit, "mps_adopt": section_mps_adopt,
               "submit": section_submit, "oom": section_oom}


def preflight(ctx):
    p = {"python": sys.version.split()[0], "python_executable": ctx.python, "ladle_bin": ctx.ladle,
         "nvidia_cuda_mps_control": ctx.mps_control, "nvidia_smi": shutil.which("nvidia-smi"),
         "work_dir": str(ctx.work), "logs_dir": str(ctx.logs), "uid": os.getuid(),
         "mps_processes_at_start": mps_processes(),
         "default_mps_pipe_exists": os.path.exists("/tmp/nvidia-mps/control")}
    if ctx.ladle:
        v = ctx.run([ctx.ladle, "--version"], timeout=10, name="ladle-version")
        p["ladle_version"] = (v.get("stdout") or "").strip() or v.get("error") or v.get("stderr")
    t = ctx.run([ctx.python, "-c", "import torch, json; print(json.dumps({'torch': torch.__version__, "
                 "'cuda': torch.version.cuda, 'cuda_available': torch.cuda.is_available(), "
                 "'device_count': torch.cuda.device_count()}))"], timeout=90, name="torch-probe")
    try:
        p["torch"] = json.loads((t.get("stdout") or "").strip().splitlines()[-1])
    except (ValueError, IndexError):
        p["torch"] = {"error": t.get("error") or "torch not importable", "stderr": tail(t.get("stderr"), 600)}
    try:
        nv = ctx.nvml()
        p["nvml"] = "ok"
        p["driver_version"] = _s(nv.nvmlSystemGetDriverVersion())
    except CheckError as e:
        p["nvml"] = str(e)
    return p


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="write the results here")
    ap.add_argument("--ladle-bin", help="the ladle binary (default $LADLE_BIN, else target/release/ladle)")
    ap.add_argument("--logs", help="keep every log, job output and scheduler directory here "
                                   "(default: a new /tmp directory, printed)")
    ap.add_argument("--skip", default="", help=f"comma-separated sections to skip: {','.join(SECTIONS)}")
    ap.add_argument("--python", help="python with torch for the helper processes and jobs (default: this one)")
    ap.add_argument("--train-cmd", action="append", default=[],
                    help="submit this command (shell words) instead of the built-in jobs; repeatable")
    ap.add_argument("--train-gpu-mem", help="--gpu-mem for each --train-cmd (default: none)")
    ap.add_argument("--settle-s", type=float, default=3.0, help="scheduler --settle-s for submit/oom (default 3)")
    ap.add_argument("--job-seconds", type=float, default=15.0, help="seconds each built-in job computes (15)")
    ap.add_argument("--submit-timeout", type=float, default=180.0, help="seconds to wait for the submit jobs")
    ap.add_argument("--oom-timeout", type=float, default=120.0, help="seconds to wait for the oom job")
    ap.add_argument("--budget-s", type=float, default=480.0,
                    help="the whole run's time limit; steps are cut to fit, cleanup kept (default 480)")
    ap.add_argument("--gpu-kind", choices=["nvml", "sim"], default="nvml", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = skip - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections in --skip: {', '.join(sorted(unknown))} (known: {', '.join(SECTIONS)})")

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)

    out = {"meta": {"script": "benches/gpu/scheduler_check.py", "started_at": now(),
                    "argv": sys.argv[1:] if argv is None else argv, "gpu_kind": args.gpu_kind,
                    "settle_s": args.settle_s, "hostname": os.uname().nodename},
           "sections": {}}
    json_path = Path(args.json)
    json_path.parent.mkdir(parents=True, exist_ok=True)

    def write():
        tmp = json_path.with_name(json_path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(out, f, indent=1, default=str)
        os.replace(tmp, json_path)

    ctx = None
    interrupted = None
    try:
        ctx = Ctx(args)
        out["meta"]["logs_dir"] = str(ctx.logs)
        out["preflight"] = preflight(ctx)
        write()
        for name in SECTIONS:
            if name in skip:
                out["sections"][name] = {"ok": None, "skipped": True}
                continue
            res = {}
            out["sections"][name] = res
            t = time.monotonic()
            if ctx.left() < CLEANUP_RESERVE + 10:
                res.update(ok=False, error=f"not run: the --budget-s of {args.budget_s:.0f} s is spent")
                continue
            try:
                SECTION_FNS[name](ctx, res)
            except CheckError as e:
                res["ok"] = False
                res["error"] = str(e)
                if e.stderr:
                    res["stderr"] = tail(e.stderr)
            except Interrupted as e:
                res["ok"] = False
                res["error"] = f"interrupted ({e})"
                interrupted = e
            except Exception as e:
                res["ok"] = False
                res["error"] = f"the check itself failed: {fmt_exc(e)}"
                res["traceback"] = traceback.format_exc()[-TAIL:]
            res["seconds"] = round(time.monotonic() - t, 1)
            write()
            if interrupted:
                break
    except Interrupted as e:
        interrupted = e
    finally:
        # Cleanup must finish even if another signal comes.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        if ctx is not None:
            try:
                out["cleanup"] = ctx.cleanup()
            except Exception as e:
                out["cleanup"] = {"error": fmt_exc(e), "traceback": traceback.format_exc()[-TAIL:]}
        out["meta"]["seconds"] = round(time.monotonic() - ctx.t0, 1) if ctx else None
        if interrupted:
            out["meta"]["interrupted"] = str(interrupted)
        write()

    print(f"{'section':<10} {'ok':<6} {'s':>6}  note")
    failed = False
    for name in SECTIONS:
        r = out["sections"].get(name)
        if r is None:
            status, note, secs = "-", "not run", ""
            failed = True
        elif r.get("skipped"):
            status, note, secs = "skip", "", ""
        else:
            status = "ok" if r.get("ok") else "FAIL"
            failed |= not r.get("ok")
            note = (r.get("error") or "")[:150]
            secs = r.get("seconds", "")
        print(f"{name:<10} {status:<6} {secs!s:>6}  {note}")
    c = out.get("cleanup", {})
    print(f"cleanup: nothing left running = {c.get('nothing_left_running')}; logs in {out['meta'].get('logs_dir')}; "
          f"JSON in {json_path}")
    if interrupted:
        return 130
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
