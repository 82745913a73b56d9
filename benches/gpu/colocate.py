#!/usr/bin/env python3
"""Collocated training on one GPU: 4 ResNet-18 runs fed by one ladle feed against 4 PyTorch
DataLoaders with the same CPU budget, under NVIDIA MPS, and 1 run alone.

Configurations, run one after the other (each process of a configuration, producer,
training runs and DataLoader workers, is pinned to the first N cores with ``taskset``):

  ladle-<N>c             one ``ladle serve --threads N --ring-mib 1024`` and one training run per
                         batch size (default 32/64/128/256), each a ``ladle.Consumer`` whose
                         batches go to the GPU with ``batch.to_torch(device,
                         normalize=ladle.IMAGENET, channels_last=True)``
  dataloader-<N>c        the same runs, each with its own ``torch.utils.data.DataLoader`` over
                         ``torchvision.datasets.ImageFolder`` (RandomResizedCrop(224) +
                         RandomHorizontalFlip + ToTensor + Normalize(ImageNet), shuffle,
                         pin_memory, persistent workers), max(1, N // runs) workers each
  alone-<all>c           one ladle-fed run (``--alone-batch``) with every core
  alone-dataloader-<all>c  one DataLoader-fed run with N - 1 workers

for every N in ``--budgets`` (default: all cores, then 4: the CPU-poor cloud case); the two
``alone`` configurations run once, with every core. A training run is torchvision's
ResNet-18 (random init, ``num_classes`` = the dataset's classes), channels-last, SGD (lr 0.1,
momentum 0.9), bf16 autocast on CUDA, cross-entropy; it trains over epochs until the end of
the measurement window, then exits.

Timing: the orchestrator starts a configuration's runs at a common wall-clock time t0; every
run counts the images of the steps that *completed* (a CUDA event recorded after
``optimizer.step()`` has completed; at most ``--max-inflight`` steps run ahead of the CPU)
inside the window [t0 + warmup, t0 + warmup + seconds]; the warm-up covers start-up (torch
import, CUDA/MPS context, cuDNN autotuning, DataLoader workers). images/s of a run = its
images in the window / seconds; a configuration's aggregate is the sum over its runs.

CPU: ``cpu_seconds`` of a configuration is the orchestrator's ``getrusage(RUSAGE_CHILDREN)``
delta across it: every process it spawned and waited (``ladle serve`` is stopped with SIGTERM
and waited; DataLoader workers are counted because their parents wait for them; the
orchestrator is a child subreaper, so orphans are reaped and counted too), less its own
helper commands (nvidia-smi, MPS queries). ``cpu_seconds_per_1000_images`` divides it by the
images of every step of every run over their whole lifetime (start-up included: that is
what the configuration cost). ``cpu_seconds_per_1000_images_window`` is the steady state:
the CPU time of the configuration's processes inside the window (sampled from /proc every
0.5 s, by process group) over the images in the window. The MPS server's CPU time is
reported apart (``mps_server_cpu_seconds``); it is not the configuration's child.

GPU (pynvml, every 0.25 s during the window): device memory used (max, mean), utilization.gpu
(mean), SM activity and SM occupancy from GPM (``nvmlGpmMetricsGet``: NVML_GPM_METRIC_SM_UTIL,
NVML_GPM_METRIC_SM_OCCUPANCY) where the device supports it, and per-process used memory
(compute and MPS process lists, by pid). Per run, torch's ``max_memory_reserved`` /
``max_memory_allocated``.

MPS: ``nvidia-cuda-mps-control -d`` once, with CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY
in private temporary directories (the same environment in every run), checked with
``get_server_list`` and a probe process, quit at the end (``echo quit |
nvidia-cuda-mps-control``). Never changes compute mode, clocks, persistence or MIG, never
resets the GPU. Without nvidia-cuda-mps-control, with ``--no-mps`` or on CPU, the runs share
the GPU without MPS and the JSON says so.

Robustness: every child runs in its own process group with a parent-death signal and a
watchdog; each configuration has a hard deadline after which its process groups are
killed; a failed configuration records the tail of its logs and the next one runs; the JSON
is rewritten after every configuration; SIGTERM/SIGINT stop everything, quit MPS and write
what was measured. Exit status 1 if any configuration failed.

Usage (repository root; the ``ladle`` package importable, ``ladle`` binary built)::

    ladle dataset generate --format imagefolder --count 1000 --out /tmp/data
    python3 benches/gpu/colocate.py --dataset /tmp/data --json colocate.json \\
        [--seconds 35] [--warmup 15] [--budgets all,4] [--batch-sizes 32,64,128,256] \\
        [--alone-batch 128] [--device cuda] [--model resnet18] [--ladle-bin PATH] \\
        [--logs DIR] [--no-mps] [--budget-s 540]

Smoke test without a GPU::

    python3 benches/gpu/colocate.py --dataset /tmp/data --device cpu --model tiny \\
        --seconds 5 --warmup 3 --budgets 2 --batch-sizes 8,16 --alone-batch 8 --no-mps \\
        --json /tmp/coloc.json
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import json
import math
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from pathlib import Path

from _common import run_to_files

MIB = 1 << 20
TAIL = 3000
CLK_TCK = os.sysconf("SC_CLK_TCK")
THIS = os.path.abspath(__file__)
REPO = Path(THIS).resolve().parents[2]
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def now() -> float:
    return time.time()


def write_json_atomic(path, obj) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def parse_cpus(text: str) -> list[int]:
    cpus = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            cpus.extend(range(int(a), int(b) + 1))
        else:
            cpus.append(int(part))
    return cpus


def cpus_text(cpus: list[int]) -> str:
    """[0,1,2,3,8] -> '0-3,8'."""
    cpus = sorted(set(cpus))
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def tail(path, n=TAIL) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        return f"(no log: {e})"
    return data[-n:].decode("utf-8", "replace")


def fmt_exc(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def rnd(x, nd=2):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return round(x, nd)


# =============================================================================================
# Worker: one training process
# =============================================================================================


def build_model(name: str, num_classes: int):
    import torch
    import torchvision

    if name == "tiny":
        nn = torch.nn
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=4, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, num_classes),
        )
    if name == "resnet18":
        return torchvision.models.resnet18(weights=None, num_classes=num_classes)
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


class Counter:
    def __init__(self, ws: float, we: float):
        self.ws, self.we = ws, we
        self.images_window = self.steps_window = 0
        self.images_total = self.steps_total = 0
        self.first_step = None  # wall time of the first completed step
        self.first_window_step = None
        self.last_window_step = None
        self.loss_first = None
        self.loss_last = None

    def done(self, n: int, t: float, loss) -> None:
        self.images_total += n
        self.steps_total += 1
        if self.first_step is None:
            self.first_step = t
            self.loss_first = float(loss.float().item())
        if self.ws <= t <= self.we:
            self.images_window += n
            self.steps_window += 1
            if self.first_window_step is None:
                self.first_window_step = t
            self.last_window_step = t
        self._loss = loss

    def finish_loss(self) -> None:
        loss = getattr(self, "_loss", None)
        if loss is not None:
            self.loss_last = float(loss.float().item())


def run_worker(args, result: dict, ws: float, we: float, cleanup: list) -> None:
    import torch

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        if device.index is not None:
            torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    else:
        torch.set_num_threads(max(1, args.cpu_threads))
    result["torch_threads"] = torch.get_num_threads()
    result["affinity"] = cpus_text(sorted(os.sched_getaffinity(0)))

    if args.source == "ladle":
        import ladle

        consumer = ladle.Consumer(args.socket, batch_size=args.batch_size,
                                  name=f"colocate-{args.name}", timeout=30.0)
        num_classes = max(1, len(consumer.class_names))
        result["dataset_len"] = consumer.dataset_len

        def batches():
            while True:
                for batch in consumer:  # one epoch
                    images, labels = batch.to_torch(device, normalize=ladle.IMAGENET,
                                                    channels_last=True)
                    del batch  # the ring slot is released once the copy has completed
                    yield images, labels
    else:
        from torchvision import datasets, transforms

        transform = transforms.Compose([
            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(*IMAGENET),
        ])
        data = datasets.ImageFolder(args.dataset, transform=transform)
        num_classes = max(1, len(data.classes))
        result["dataset_len"] = len(data)
        workers = args.num_workers
        loader = torch.utils.data.DataLoader(
            data, batch_size=args.batch_size, shuffle=True, num_workers=workers,
            pin_memory=cuda, persistent_workers=workers > 0, drop_last=False,
        )

        def shutdown_loader():
            # Join (and so reap) the workers: their CPU time then counts in ours.
            it = getattr(loader, "_iterator", None)
            if it is not None and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()

        cleanup.append(shutdown_loader)

        def batches():
            while True:
                for images, labels in loader:  # one epoch
                    yield (images.to(device, non_blocking=True, memory_format=torch.channels_last),
                           labels.to(device, non_blocking=True))

    result["num_classes"] = num_classes
    model = build_model(args.model, num_classes).to(device, memory_format=torch.channels_last)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-1)  # ladle labels -1 an undecodable sample
    counter = Counter(ws, we)
    inflight: deque = deque()  # (event, images, loss) of steps not known complete
    data_wait_window = 0.0
    source = batches()
    result["t_ready_s"] = now() - args.t0
    while True:
        t_fetch = now()
        images, labels = next(source)
        t_got = now()
        # Time blocked on input inside the window (a rough input-stall indicator).
        lo, hi = max(t_fetch, ws), min(t_got, we)
        if hi > lo:
            data_wait_window += hi - lo
        n = int(labels.shape[0])
        if cuda:
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                out = model(images)
                loss = loss_fn(out, labels)
        else:
            out = model(images)
            loss = loss_fn(out, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if cuda:
            event = torch.cuda.Event()
            event.record()
            inflight.append((event, n, loss.detach()))
            while inflight and inflight[0][0].query():
                _, m, lv = inflight.popleft()
                counter.done(m, now(), lv)
            while len(inflight) > args.max_inflight:
                ev, m, lv = inflight.popleft()
                ev.synchronize()
                counter.done(m, now(), lv)
        else:
            counter.done(n, now(), loss.detach())
        del images, labels, out, loss
        if now() >= we:
            break
    if cuda:
        torch.cuda.synchronize()
        while inflight:
            _, m, lv = inflight.popleft()
            counter.done(m, now(), lv)
    counter.finish_loss()
    seconds = we - ws
    result.update(
        images=counter.images_window,
        images_per_s=counter.images_window / seconds if seconds > 0 else None,
        steps=counter.steps_window,
        images_total=counter.images_total,
        steps_total=counter.steps_total,
        t_first_step_s=None if counter.first_step is None else counter.first_step - args.t0,
        t_first_window_step_s=(None if counter.first_window_step is None
                               else counter.first_window_step - args.t0),
        data_wait_s_window=data_wait_window,
        data_wait_fraction_window=data_wait_window / seconds if seconds > 0 else None,
        loss_first=counter.loss_first,
        loss=counter.loss_last,
        loss_finite=counter.loss_last is not None and math.isfinite(counter.loss_last),
    )
    if cuda:
        result["max_memory_reserved_mib"] = torch.cuda.max_memory_reserved(device) / MIB
        result["max_memory_allocated_mib"] = torch.cuda.max_memory_allocated(device) / MIB


def worker_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="colocate.py worker",
                                description="one training process (started by the orchestrator)")
    p.add_argument("--source", choices=("ladle", "dataloader"), required=True)
    p.add_argument("--dataset")
    p.add_argument("--socket")
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--t0", type=float, required=True)
    p.add_argument("--warmup", type=float, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--result", required=True)
    p.add_argument("--cpus", default="")
    p.add_argument("--cpu-threads", type=int, default=1, help="torch threads on a CPU device")
    p.add_argument("--max-inflight", type=int, default=2)
    p.add_argument("--hard-timeout", type=float, default=30.0,
                   help="seconds after the window's end after which the process dumps its "
                        "stacks and exits")
    p.add_argument("--name", default="run")
    args = p.parse_args(argv)
    start = now()
    if args.cpus:
        os.sched_setaffinity(0, parse_cpus(args.cpus))
    ws = args.t0 + args.warmup
    we = ws + args.seconds
    faulthandler.enable()
    faulthandler.dump_traceback_later(max(10.0, we + args.hard_timeout - start), exit=True)
    result = {"source": args.source, "batch_size": args.batch_size, "pid": os.getpid(),
              "model": args.model, "device": args.device, "t_start_s": start - args.t0,
              "num_workers": args.num_workers if args.source == "dataloader" else None,
              "error": None}
    cleanup: list = []
    rc = 0
    try:
        run_worker(args, result, ws, we, cleanup)
    except BaseException as e:  # noqa: BLE001 - everything is recorded
        result["error"] = "".join(traceback.format_exception(e))[-TAIL:]
        traceback.print_exc()
        rc = 1
    for fn in cleanup:
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            print(f"cleanup failed: {fmt_exc(e)}", file=sys.stderr)
    end = now()
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    result["cpu_seconds_self"] = me.ru_utime + me.ru_stime
    result["cpu_seconds_children"] = kids.ru_utime + kids.ru_stime
    result["cpu_seconds"] = result["cpu_seconds_self"] + result["cpu_seconds_children"]
    result["lifetime_s"] = end - start
    result["t_end_s"] = end - args.t0
    try:
        write_json_atomic(args.result, result)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        rc = 1
    print("WORKER " + json.dumps({k: result.get(k) for k in
                                  ("batch_size", "images", "images_per_s", "images_total",
                                   "loss", "cpu_seconds", "error")}), flush=True)
    sys.stderr.flush()
    faulthandler.cancel_dump_traceback_later()
    os._exit(rc)  # no interpreter teardown (CUDA, loader threads): the result is out


def probe_main(argv: list[str]) -> None:
    """CUDA works in this environment (under MPS when its variables are set)."""
    p = argparse.ArgumentParser(prog="colocate.py probe")
    p.add_argument("--device", default="cuda")
    p.add_argument("--result", required=True)
    args = p.parse_args(argv)
    faulthandler.dump_traceback_later(150, exit=True)
    out = {"pid": os.getpid(), "error": None}
    rc = 0
    try:
        import torch

        device = torch.device(args.device)
        out.update(torch=torch.__version__, cuda=torch.version.cuda,
                   cuda_available=torch.cuda.is_available())
        x = torch.randn(1024, 1024, device=device)
        y = (x @ x).sum()
        if device.type == "cuda":
            torch.cuda.synchronize()
            props = torch.cuda.get_device_properties(device)
            out.update(name=props.name, capability=f"{props.major}.{props.minor}",
                       sm_count=props.multi_processor_count,
                       memory_mib=props.total_memory // MIB,
                       cudnn=torch.backends.cudnn.version())
        out["check"] = float(y.item())
    except BaseException as e:  # noqa: BLE001
        out["error"] = "".join(traceback.format_exception(e))[-TAIL:]
        rc = 1
    write_json_atomic(args.result, out)
    os._exit(rc)


# =============================================================================================
# Orchestrator
# =============================================================================================


class Interrupted(BaseException):
    pass


def proc_scan() -> dict[int, tuple[str, int, int, float]]:
    """pid -> (state, ppid, pgrp, utime+stime seconds) of every process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                data = f.read().decode("utf-8", "replace")
            rest = data.rsplit(")", 1)[1].split()
            out[int(d)] = (rest[0], int(rest[1]), int(rest[2]),
                           (int(rest[11]) + int(rest[12])) / CLK_TCK)
        except (OSError, IndexError, ValueError):
            continue
    return out


def proc_exe_name(pid: int) -> str:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return os.path.basename(f.read().split(b"\0")[0].decode("utf-8", "replace"))
        except OSError:
            return ""


def proc_env_var(pid: int, key: str):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(key.encode() + b"="):
                    return item.split(b"=", 1)[1].decode("utf-8", "replace")
    except OSError:
        return None
    return None


def mps_processes(pipe_dir: str | None = None) -> list[dict]:
    out = []
    for pid, (state, _ppid, _pg, cpu) in proc_scan().items():
        if state == "Z":
            continue
        name = proc_exe_name(pid)
        if not name.startswith("nvidia-cuda-mps"):
            continue
        if pipe_dir is not None and proc_env_var(pid, "CUDA_MPS_PIPE_DIRECTORY") != pipe_dir:
            continue
        out.append({"pid": pid, "program": name, "cpu_seconds": cpu})
    return out


def set_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except Exception:  # noqa: BLE001
        return False


class Child:
    """A process in its own process group, reaped with wait4 (its exact rusage)."""

    def __init__(self, name: str, cmd: list[str], log: Path, env: dict, prefix: list[str],
                 preexec=None):
        self.name = name
        self.cmd = cmd
        self.log = log
        self.rc = None
        self.rusage = None
        self.reap_error = None
        with open(log, "wb") as f:
            self.popen = subprocess.Popen(
                prefix + cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                env=env, start_new_session=True, cwd=str(REPO), preexec_fn=preexec,
            )
        self.pid = self.popen.pid
        self.pgid = self.pid

    def poll(self):
        if self.rc is not None or self.reap_error is not None:
            return self.rc
        try:
            pid, status, ru = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError as e:
            self.reap_error = fmt_exc(e)
            self.rc = -999
            self.popen.returncode = self.rc
            return self.rc
        if pid == 0:
            return None
        self.rc = os.waitstatus_to_exitcode(status)
        self.rusage = ru
        self.popen.returncode = self.rc
        return self.rc

    def wait(self, timeout: float):
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        return self.rc

    def signal_group(self, sig) -> None:
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def cpu_seconds(self):
        if self.rusage is None:
            return None
        return self.rusage.ru_utime + self.rusage.ru_stime


class Nvml:
    """pynvml on one device; every call guarded."""

    def __init__(self, device: str):
        self.nv = None
        self.h = None
        self.error = None
        self.proc_fns: dict[str, str | None] = {}
        try:
            import pynvml as nv

            nv.nvmlInit()
            self.nv = nv
            index = 0
            if ":" in device:
                index = int(device.split(":", 1)[1])
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            entry = None
            if visible:
                items = [v.strip() for v in visible.split(",") if v.strip()]
                if index < len(items):
                    entry = items[index]
            if entry and entry.startswith(("GPU-", "MIG-")):
                self.h = nv.nvmlDeviceGetHandleByUUID(entry)
            else:
                self.h = nv.nvmlDeviceGetHandleByIndex(int(entry) if entry and entry.isdigit() else index)
        except Exception as e:  # noqa: BLE001
            self.error = fmt_exc(e)
            self.nv = None

    @property
    def ok(self) -> bool:
        return self.nv is not None and self.h is not None

    def info(self) -> dict:
        out = {}
        if not self.ok:
            return {"error": self.error}
        nv, h = self.nv, self.h

        def get(key, fn):
            try:
                v = fn()
                out[key] = v.decode() if isinstance(v, bytes) else v
            except Exception as e:  # noqa: BLE001
                out[key] = {"error": fmt_exc(e)}

        get("name", lambda: nv.nvmlDeviceGetName(h))
        get("driver", lambda: nv.nvmlSystemGetDriverVersion())
        get("uuid", lambda: nv.nvmlDeviceGetUUID(h))
        get("memory_total_mib", lambda: nv.nvmlDeviceGetMemoryInfo(h).total // MIB)
        get("compute_mode", lambda: int(nv.nvmlDeviceGetComputeMode(h)))
        get("mig_mode", lambda: list(nv.nvmlDeviceGetMigMode(h)))
        get("gpm_supported", lambda: bool(nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice))
        return out

    def memory_used_mib(self):
        return self.nv.nvmlDeviceGetMemoryInfo(self.h).used / MIB

    def util_gpu(self):
        return float(self.nv.nvmlDeviceGetUtilizationRates(self.h).gpu)

    def processes(self) -> dict[str, list[tuple[int, float | None]]]:
        """{'compute': [(pid, MiB)], 'mps': [...]} from whichever calls this pynvml has."""
        out = {}
        names = {
            "compute": ["nvmlDeviceGetComputeRunningProcesses",
                        "nvmlDeviceGetComputeRunningProcesses_v3",
                        "nvmlDeviceGetComputeRunningProcesses_v2"],
            "mps": ["nvmlDeviceGetMPSComputeRunningProcesses",
                    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
                    "nvmlDeviceGetMPSComputeRunningProcesses_v2"],
        }
        for key, candidates in names.items():
            if key in self.proc_fns:
                candidates = [self.proc_fns[key]] if self.proc_fns[key] else []
            for fn_name in candidates:
                fn = getattr(self.nv, fn_name, None)
                if fn is None:
                    continue
                try:
                    procs = fn(self.h)
                except Exception:  # noqa: BLE001
                    continue
                self.proc_fns[key] = fn_name
                out[key] = [(int(p.pid), None if getattr(p, "usedGpuMemory", None) is None
                             else p.usedGpuMemory / MIB) for p in procs]
                break
            else:
                self.proc_fns[key] = None
        return out


class Gpm:
    """SM activity and occupancy between consecutive GPM samples."""

    def __init__(self, nvml: Nvml):
        self.nvml = nvml
        self.error = None
        self.prev = self.cur = None
        nv, h = nvml.nv, nvml.h
        try:
            if not nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
                raise RuntimeError("GPM not supported on this device")
            self.prev = nv.nvmlGpmSampleAlloc()
            self.cur = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(h, self.prev)
        except Exception as e:  # noqa: BLE001
            self.error = fmt_exc(e)
            self.close()

    @property
    def ok(self) -> bool:
        return self.error is None

    def sample(self):
        """(sm_activity %, sm_occupancy %) since the previous sample, or None on failure."""
        if not self.ok:
            return None
        nv, h = self.nvml.nv, self.nvml.h
        try:
            nv.nvmlGpmSampleGet(h, self.cur)
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = 2
            mg.sample1 = self.prev
            mg.sample2 = self.cur
            mg.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
            mg.metrics[1].metricId = nv.NVML_GPM_METRIC_SM_OCCUPANCY
            nv.nvmlGpmMetricsGet(mg)
            vals = []
            for i in range(2):
                ret = int(mg.metrics[i].nvmlReturn)
                vals.append(float(mg.metrics[i].value) if ret == 0 else None)
            self.prev, self.cur = self.cur, self.prev
            return tuple(vals)
        except Exception as e:  # noqa: BLE001
            self.error = fmt_exc(e)
            return None

    def close(self) -> None:
        for s in (self.prev, self.cur):
            if s is not None:
                try:
                    self.nvml.nv.nvmlGpmSampleFree(s)
                except Exception:  # noqa: BLE001
                    pass
        self.prev = self.cur = None


class Sampler(threading.Thread):
    """NVML every 0.25 s, /proc CPU times of the configuration's process groups every 0.5 s."""

    def __init__(self, nvml: Nvml | None, t0: float, ws: float, we: float):
        super().__init__(daemon=True)
        self.nvml = nvml
        self.t0, self.ws, self.we = t0, ws, we
        self.pgids: tuple[int, ...] = ()
        self.halt = threading.Event()
        self.gpu: list[dict] = []  # samples in the window
        self.cpu: list[tuple[float, dict[int, float]]] = []
        self.proc_mem: dict[int, dict] = {}  # pid -> {"max_mib", "list"}
        self.gpm = None
        self.errors: list[str] = []

    def run(self) -> None:
        tick = 0
        try:
            if self.nvml is not None and self.nvml.ok:
                self.gpm = Gpm(self.nvml)
            while not self.halt.is_set():
                t = now()
                if tick % 2 == 0:
                    self.sample_cpu(t)
                if self.nvml is not None and self.nvml.ok and self.ws <= t <= self.we + 0.25:
                    self.sample_gpu(t)
                elif self.gpm is not None and self.gpm.ok and t < self.ws:
                    self.gpm.sample()  # keep the GPM baseline fresh
                tick += 1
                self.halt.wait(0.25)
        except Exception as e:  # noqa: BLE001
            self.errors.append("sampler: " + "".join(traceback.format_exception(e))[-1000:])
        finally:
            if self.gpm is not None:
                self.gpm.close()

    def sample_cpu(self, t: float) -> None:
        pgids = set(self.pgids)
        if not pgids:
            return
        snap = {pid: cpu for pid, (_s, _pp, pg, cpu) in proc_scan().items() if pg in pgids}
        self.cpu.append((t, snap))

    def sample_gpu(self, t: float) -> None:
        rec = {"t": round(t - self.t0, 3)}
        try:
            rec["mem_mib"] = self.nvml.memory_used_mib()
        except Exception as e:  # noqa: BLE001
            rec["mem_error"] = fmt_exc(e)
        try:
            rec["util"] = self.nvml.util_gpu()
        except Exception as e:  # noqa: BLE001
            rec["util_error"] = fmt_exc(e)
        if self.gpm is not None and self.gpm.ok:
            v = self.gpm.sample()
            if v is not None:
                rec["sm"], rec["occ"] = v
        try:
            for key, procs in self.nvml.processes().items():
                for pid, mib in procs:
                    e = self.proc_mem.setdefault(pid, {"max_mib": None, "lists": []})
                    if key not in e["lists"]:
                        e["lists"].append(key)
                    if mib is not None:
                        e["max_mib"] = mib if e["max_mib"] is None else max(e["max_mib"], mib)
        except Exception as e:  # noqa: BLE001
            rec["proc_error"] = fmt_exc(e)
        self.gpu.append(rec)

    def window_cpu(self):
        """CPU seconds of the groups' processes inside the window, from the samples."""
        inside = [(t, s) for t, s in self.cpu if self.ws <= t <= self.we]
        before = [(t, s) for t, s in self.cpu if t < self.ws]
        if not inside:
            return None
        first: dict[int, float] = {}
        last: dict[int, float] = {}
        # Baseline: the last sample before the window, else the first inside it.
        base = dict(before[-1][1]) if before else {}
        for _t, snap in inside:
            for pid, cpu in snap.items():
                first.setdefault(pid, base.get(pid, 0.0) if before else cpu)
                last[pid] = cpu
        return sum(max(0.0, last[p] - first[p]) for p in last)

    def gpu_summary(self) -> dict:
        def mean(xs):
            xs = [x for x in xs if x is not None]
            return sum(xs) / len(xs) if xs else None

        mem = [r.get("mem_mib") for r in self.gpu]
        mem_ok = [m for m in mem if m is not None]
        out = {
            "samples": len(self.gpu),
            "memory_used_mib_max": rnd(max(mem_ok), 0) if mem_ok else None,
            "memory_used_mib_mean": rnd(mean(mem), 0),
            "util_mean": rnd(mean([r.get("util") for r in self.gpu]), 1),
            "sm_activity_mean": rnd(mean([r.get("sm") for r in self.gpu]), 1),
            "sm_occupancy_mean": rnd(mean([r.get("occ") for r in self.gpu]), 1),
        }
        if self.gpm is not None and self.gpm.ok and out["sm_activity_mean"] is not None:
            out["sm_source"] = "nvml GPM (NVML_GPM_METRIC_SM_UTIL, NVML_GPM_METRIC_SM_OCCUPANCY)"
        else:
            why = self.gpm.error if self.gpm is not None else (
                self.nvml.error if self.nvml is not None else "no NVML")
            out["sm_source"] = f"none (GPM unavailable: {why}); utilization.gpu only"
        if self.nvml is not None:
            out["process_list_calls"] = dict(self.nvml.proc_fns)
        errs = {r[k] for r in self.gpu for k in ("mem_error", "util_error", "proc_error") if k in r}
        if errs or self.errors:
            out["errors"] = sorted(errs) + self.errors
        return out


class Orchestrator:
    def __init__(self, args):
        self.args = args
        self.children: list[Child] = []
        self.results: dict = {}
        self.failed = False
        self.t_start = time.monotonic()
        self.deadline = self.t_start + args.budget_s
        self.work = Path(tempfile.mkdtemp(prefix="lco-", dir="/tmp"))  # short socket paths
        if args.logs:
            self.logs = Path(args.logs).resolve()
            self.logs.mkdir(parents=True, exist_ok=True)
        else:
            self.logs = Path(tempfile.mkdtemp(prefix="ladle-colocate-logs-"))
        self.cuda = args.device.startswith("cuda")
        self.all_cpus = sorted(os.sched_getaffinity(0))
        self.base_env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
        self.base_env["PYTHONUNBUFFERED"] = "1"
        self.mps_ctl = None
        self.mps_env: dict = {}
        self.mps_pipe = None
        self.mps_log = None
        self.mps_started = False
        self.nvml: Nvml | None = None
        self.prefix_death: list[str] = []
        self.taskset = shutil.which("taskset")
        self.ladle = None
        self.aux_count = 0
        self.current = None

    # ---- helpers -----------------------------------------------------------------------------

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def aux(self, cmd, input_text=None, timeout=15.0, env=None) -> dict:
        """A helper command, output to files (a daemon keeping a pipe open cannot hang us);
        returns rc/stdout/stderr and its CPU seconds (to subtract from a configuration's)."""
        self.aux_count += 1
        base = self.logs / "cmd" / f"{self.aux_count:03d}-{os.path.basename(str(cmd[0]))[:30]}"
        base.parent.mkdir(exist_ok=True)
        out_p, err_p = Path(f"{base}.out"), Path(f"{base}.err")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        rec = {"cmd": " ".join(map(str, cmd))}
        rec.update(run_to_files(cmd, out_p, err_p, timeout=timeout, env=env or self.base_env,
                                input_text=input_text))
        rec["stdout"] = tail(out_p)
        rec["stderr"] = tail(err_p)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        rec["cpu_seconds"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        return rec

    def spawn(self, name, cmd, log, cpus, env) -> Child:
        prefix = list(self.prefix_death)
        preexec = None
        if self.taskset:
            prefix += [self.taskset, "-c", cpus_text(cpus)]
        else:
            cpuset = set(cpus)

            def set_affinity():  # no taskset: the same pinning, in the child before exec
                os.sched_setaffinity(0, cpuset)

            preexec = set_affinity
        child = Child(name, [str(c) for c in cmd], log, env, prefix, preexec)
        self.children.append(child)
        return child

    def reap_orphans(self, kill_pgids=()) -> None:
        """Reaps zombies re-parented to us (we are a subreaper) and kills live ones of ours."""
        me = os.getpid()
        live = {c.pid for c in self.children if c.rc is None}
        for pid, (state, ppid, pgrp, _cpu) in proc_scan().items():
            if ppid != me or pid in live:
                continue
            if state != "Z" and pgrp in kill_pgids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                time.sleep(0.05)
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass

    def kill_all(self) -> None:
        for c in self.children:
            if c.poll() is None:
                c.signal_group(signal.SIGKILL)
        for c in self.children:
            c.wait(5)
            c.signal_group(signal.SIGKILL)  # stragglers of the group (DataLoader workers)
        self.reap_orphans({c.pgid for c in self.children})

    # ---- setup -----------------------------------------------------------------------------

    def resolve_ladle(self):
        cands = [self.args.ladle_bin, os.environ.get("LADLE_BIN"),
                 str(REPO / "target" / "release" / "ladle"), shutil.which("ladle")]
        for c in cands:
            if c and os.path.isfile(c) and os.access(c, os.X_OK):
                return str(Path(c).resolve())
        return None

    def info(self) -> dict:
        info = {"cores": len(self.all_cpus), "cpus": cpus_text(self.all_cpus),
                "python": sys.version.split()[0], "host_cpu": None}
        try:
            for line in open("/proc/cpuinfo"):
                if line.startswith("model name"):
                    info["host_cpu"] = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        try:
            import torch
            import torchvision

            info.update(torch=torch.__version__, cuda=torch.version.cuda,
                        torchvision=torchvision.__version__)
        except Exception as e:  # noqa: BLE001
            info["torch_error"] = fmt_exc(e)
        try:
            import ladle

            info["ladle_python"] = getattr(ladle, "__version__", "?")
        except Exception as e:  # noqa: BLE001
            info["ladle_python_error"] = fmt_exc(e)
        return info

    def start_mps(self) -> None:
        r = self.results
        if not self.cuda:
            r["mps"], r["mps_note"] = False, "not a CUDA device"
            return
        if self.args.no_mps:
            r["mps"], r["mps_note"] = False, "--no-mps: the runs share the GPU without MPS"
            return
        self.mps_ctl = shutil.which("nvidia-cuda-mps-control")
        if not self.mps_ctl:
            r["mps"] = False
            r["mps_note"] = ("nvidia-cuda-mps-control is not on PATH: the runs share the GPU "
                             "without MPS (time-sliced contexts)")
            return
        self.mps_pipe = tempfile.mkdtemp(prefix="lcp-", dir="/tmp")
        self.mps_log = tempfile.mkdtemp(prefix="lcl-", dir="/tmp")
        self.mps_env = {"CUDA_MPS_PIPE_DIRECTORY": self.mps_pipe,
                        "CUDA_MPS_LOG_DIRECTORY": self.mps_log}
        env = {**self.base_env, **self.mps_env}
        rec = {"control": self.mps_ctl, **self.mps_env}
        start = self.aux([self.mps_ctl, "-d"], timeout=30, env=env)
        rec["start"] = start
        self.mps_started = True  # whatever happened, quit/clean at the end
        if start.get("rc") != 0:
            r["mps"] = f"failed: `nvidia-cuda-mps-control -d` {start.get('error') or 'rc ' + str(start.get('rc'))}: {start.get('stderr', '')[-500:]}"
            r["mps_setup"] = rec
            self.mps_env = {}
            return
        deadline = time.monotonic() + 10
        while not os.path.exists(os.path.join(self.mps_pipe, "control")) and time.monotonic() < deadline:
            time.sleep(0.1)
        probe = self.aux([self.mps_ctl], input_text="get_server_list\n", timeout=15, env=env)
        rec["get_server_list"] = probe
        rec["processes"] = mps_processes(self.mps_pipe)
        r["mps_setup"] = rec
        if probe.get("rc") != 0:
            r["mps"] = f"failed: get_server_list {probe.get('error') or 'rc ' + str(probe.get('rc'))}"
            self.quit_mps()
            self.mps_env = {}
            return
        r["mps"] = True

    def quit_mps(self) -> None:
        if not self.mps_started:
            return
        self.mps_started = False
        env = {**self.base_env, "CUDA_MPS_PIPE_DIRECTORY": self.mps_pipe,
               "CUDA_MPS_LOG_DIRECTORY": self.mps_log}
        rec = {"quit": self.aux([self.mps_ctl], input_text="quit\n", timeout=15, env=env)}
        deadline = time.monotonic() + 15
        while mps_processes(self.mps_pipe) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = mps_processes(self.mps_pipe)
        if left:
            rec["left_after_quit"] = left
            for sig in (signal.SIGTERM, signal.SIGKILL):
                for p in mps_processes(self.mps_pipe):
                    try:
                        os.kill(p["pid"], sig)
                    except (ProcessLookupError, PermissionError):
                        pass
                time.sleep(2)
        rec["all_gone"] = not mps_processes(self.mps_pipe)
        # Keep MPS's own logs with ours (regular files only: the pipe dir holds FIFOs).
        try:
            for name in os.listdir(self.mps_log):
                p = os.path.join(self.mps_log, name)
                if stat.S_ISREG(os.lstat(p).st_mode):
                    shutil.copy2(p, self.logs / f"mps-{name}")
        except OSError:
            pass
        self.results["mps_quit"] = rec

    def probe(self, with_mps: bool) -> dict:
        path = self.work / f"probe-{int(with_mps)}.json"
        env = {**self.base_env, **(self.mps_env if with_mps else {})}
        c = self.spawn(f"probe-mps{int(with_mps)}",
                       [sys.executable, THIS, "probe", "--device", self.args.device,
                        "--result", path], self.logs / f"probe-mps{int(with_mps)}.log",
                       self.all_cpus, env)
        rc = c.wait(90)
        if rc is None:
            c.signal_group(signal.SIGKILL)
            c.wait(5)
            return {"error": "probe timed out after 90 s", "log": tail(c.log)}
        try:
            out = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            out = {"error": f"no probe result ({fmt_exc(e)}), rc {rc}"}
        if rc != 0 and not out.get("error"):
            out["error"] = f"rc {rc}"
        if out.get("error"):
            out["log"] = tail(c.log, 1500)
        return out

    # ---- configurations -----------------------------------------------------------------------

    def plan(self) -> list[dict]:
        n_all = len(self.all_cpus)
        budgets, warnings = [], []
        for tok in self.args.budgets.split(","):
            tok = tok.strip().lower()
            if not tok:
                continue
            n = n_all if tok == "all" else int(tok)
            if n > n_all:
                warnings.append(f"budget {n} cores > {n_all} available: using {n_all}")
                n = n_all
            if n < 1:
                raise SystemExit(f"bad budget {tok!r}")
            if n not in budgets:
                budgets.append(n)
        self.results["budgets"] = budgets
        if warnings:
            self.results.setdefault("warnings", []).extend(warnings)
        bs = self.args.batch_sizes
        configs = []
        alone_added = False
        for n in budgets:
            per = max(1, n // len(bs))
            configs.append(dict(name=f"ladle-{n}c", kind="colocated", source="ladle", budget=n,
                                batch_sizes=bs, num_workers=None))
            configs.append(dict(name=f"dataloader-{n}c", kind="colocated", source="dataloader",
                                budget=n, batch_sizes=bs, num_workers=per))
            if n == n_all and not self.args.skip_alone:
                configs += self.alone_configs(n_all)
                alone_added = True
        if not alone_added and not self.args.skip_alone:
            configs += self.alone_configs(n_all)
        return configs

    def alone_configs(self, n: int) -> list[dict]:
        b = [self.args.alone_batch]
        return [dict(name=f"alone-{n}c", kind="alone", source="ladle", budget=n, batch_sizes=b,
                     num_workers=None),
                dict(name=f"alone-dataloader-{n}c", kind="alone", source="dataloader", budget=n,
                     batch_sizes=b, num_workers=max(1, n - 1))]

    def run_config(self, cfg: dict) -> dict:
        args = self.args
        name, n = cfg["name"], cfg["budget"]
        cpus = self.all_cpus[:n]
        out = {"name": name, "kind": cfg["kind"], "source": cfg["source"], "budget_cores": n,
               "cpus": cpus_text(cpus), "batch_sizes": cfg["batch_sizes"],
               "dataloader_workers_per_run": cfg["num_workers"],
               "serve_threads": n if cfg["source"] == "ladle" else None,
               "mps_env": bool(self.mps_env), "runs": [], "warnings": [], "error": None}
        errors: list[str] = []
        env = {**self.base_env, **self.mps_env}
        wall0 = time.monotonic()
        # The orchestrator keeps off the budget's cores when there are others.
        rest = [c for c in self.all_cpus if c not in cpus]
        if rest:
            try:
                os.sched_setaffinity(0, rest)
            except OSError:
                pass
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        aux_cpu = 0.0
        mps_server0 = {p["pid"]: p["cpu_seconds"] for p in mps_processes()
                       if p["program"] == "nvidia-cuda-mps-server"}
        sampler = None
        serve = None
        workers: list[tuple[int, Child, Path]] = []
        my_children: list[Child] = []
        try:
            idle_mem = None
            if self.nvml is not None and self.nvml.ok:
                try:
                    idle_mem = self.nvml.memory_used_mib()
                except Exception:  # noqa: BLE001
                    pass
            sock = self.work / f"{name}.sock"
            if cfg["source"] == "ladle":
                serve = self.spawn(f"{name}-serve",
                                   [self.ladle, "serve", "--dataset", args.dataset,
                                    "--socket", sock, "--ring-mib", str(args.ring_mib),
                                    "--threads", str(n)],
                                   self.logs / f"{name}-serve.log", cpus, self.base_env)
                my_children.append(serve)
                deadline = time.monotonic() + 30
                while not sock.exists():
                    if serve.poll() is not None:
                        raise RuntimeError(f"ladle serve exited with {serve.rc} before its socket "
                                           f"appeared:\n{tail(serve.log)}")
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"ladle serve: no socket after 30 s:\n{tail(serve.log)}")
                    time.sleep(0.05)
            t0 = now() + 0.2
            ws, we = t0 + args.warmup, t0 + args.warmup + args.seconds
            out["t0"] = t0
            out["window_s"] = [args.warmup, args.warmup + args.seconds]
            sampler = Sampler(self.nvml if self.cuda else None, t0, ws, we)
            if serve is not None:
                sampler.pgids = (serve.pgid,)
            sampler.start()
            for b in cfg["batch_sizes"]:
                result = self.logs / f"{name}-bs{b}.json"
                try:
                    result.unlink()
                except FileNotFoundError:
                    pass
                cmd = [sys.executable, THIS, "worker", "--source", cfg["source"],
                       "--dataset", args.dataset, "--socket", sock, "--batch-size", b,
                       "--device", args.device, "--model", args.model, "--t0", repr(t0),
                       "--warmup", args.warmup, "--seconds", args.seconds,
                       "--result", result, "--cpus", cpus_text(cpus),
                       "--max-inflight", args.max_inflight, "--name", f"{name}-bs{b}",
                       "--hard-timeout", args.grace * 0.75]
                if cfg["num_workers"] is not None:
                    cmd += ["--num-workers", cfg["num_workers"]]
                w = self.spawn(f"{name}-bs{b}", cmd, self.logs / f"{name}-bs{b}.log", cpus, env)
                my_children.append(w)
                workers.append((b, w, result))
                sampler.pgids = tuple(c.pgid for c in my_children)
            out["idle_memory_used_mib"] = rnd(idle_mem, 0)
            # Wait for the runs, looking once mid-window at who is on the GPU.
            hard = we + args.grace
            looked = not self.cuda
            serve_noted = False
            tick = 0
            while any(w.poll() is None for _, w, _ in workers):
                t = now()
                tick += 1
                if not looked and t >= ws + min(5.0, args.seconds / 2):
                    looked = True
                    out["mps_clients"], cpu = self.look_at_gpu(workers)
                    aux_cpu += cpu
                if serve is not None and not serve_noted and serve.poll() is not None:
                    serve_noted = True
                    errors.append(f"ladle serve exited with {serve.rc} during the run:\n"
                                  f"{tail(serve.log, 1500)}")
                if t > hard:
                    errors.append(f"hard timeout: runs still alive {args.grace:.0f} s after the "
                                  f"window's end; killed their process groups")
                    for _, w, _ in workers:
                        if w.poll() is None:
                            w.signal_group(signal.SIGKILL)
                    for _, w, _ in workers:
                        w.wait(10)
                    break
                if tick % 20 == 0:
                    self.reap_orphans()
                time.sleep(0.1)
        except Interrupted:
            raise
        except Exception as e:  # noqa: BLE001
            errors.append("".join(traceback.format_exception(e))[-TAIL:])
        finally:
            if sampler is not None:
                sampler.halt.set()
            # Stop the producer: SIGTERM, waited (its CPU time is then ours).
            if serve is not None:
                if serve.poll() is None:
                    try:
                        out["producer_cpu_seconds_proc"] = rnd(proc_scan()[serve.pid][3], 3)
                    except KeyError:
                        pass
                    serve.signal_group(signal.SIGTERM)
                    if serve.wait(15) is None:
                        errors.append("ladle serve ignored SIGTERM for 15 s: killed")
                        serve.signal_group(signal.SIGKILL)
                        serve.wait(5)
                out["producer_cpu_seconds"] = rnd(serve.cpu_seconds(), 3)
                out["producer_exit"] = serve.rc
            for c in my_children:
                if c.poll() is None:
                    c.signal_group(signal.SIGKILL)
                    c.wait(5)
            for c in my_children:
                c.signal_group(signal.SIGKILL)  # anything left in the groups
            self.reap_orphans({c.pgid for c in my_children})
            if sampler is not None:
                sampler.join(5)
            try:
                os.sched_setaffinity(0, self.all_cpus)
            except OSError:
                pass
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_total = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime) - aux_cpu
        mps_server1 = {p["pid"]: p["cpu_seconds"] for p in mps_processes()
                       if p["program"] == "nvidia-cuda-mps-server"}
        if mps_server1 or mps_server0:
            out["mps_server_cpu_seconds"] = rnd(sum(
                v - mps_server0.get(pid, 0.0) for pid, v in mps_server1.items()), 3)

        # Runs.
        proc_mem = sampler.proc_mem if sampler is not None else {}
        images_window = images_total = 0
        for b, w, result in workers:
            run = {"batch_size": b, "pid": w.pid, "exit": w.rc,
                   "cpu_seconds_wait4": rnd(w.cpu_seconds(), 3)}
            try:
                r = json.loads(result.read_text())
            except (OSError, ValueError) as e:
                r = {"error": f"no result file ({fmt_exc(e)})"}
            run.update({k: v for k, v in r.items() if k not in ("batch_size", "pid")})
            mem = proc_mem.get(w.pid)
            run["nvml_memory_mib"] = rnd(mem["max_mib"], 0) if mem and mem["max_mib"] is not None else None
            for k in ("images_per_s", "max_memory_reserved_mib", "max_memory_allocated_mib",
                      "cpu_seconds", "cpu_seconds_self", "cpu_seconds_children", "lifetime_s",
                      "t_start_s", "t_ready_s", "t_first_step_s", "t_first_window_step_s",
                      "t_end_s", "data_wait_s_window", "data_wait_fraction_window"):
                if isinstance(run.get(k), float):
                    run[k] = rnd(run[k], 3)
            if isinstance(run.get("loss"), float):
                run["loss"] = rnd(run["loss"], 4)
            if isinstance(run.get("loss_first"), float):
                run["loss_first"] = rnd(run["loss_first"], 4)
            if w.rc != 0 or run.get("error"):
                err = (run.get("error") or "").strip()
                errors.append(f"run bs={b} (exit {w.rc}): "
                              f"{err.splitlines()[-1] if err else 'no error reported'}\n"
                              f"{err[-800:]}\n--- log tail ---\n{tail(w.log, 1500)}")
                run["log_tail"] = tail(w.log, 1500)
            elif not run.get("images"):
                errors.append(f"run bs={b} trained no image inside the window "
                              f"(first step at t0+{run.get('t_first_step_s')} s)")
            else:
                if (run.get("t_first_step_s") or 0) > args.warmup:
                    out["warnings"].append(f"bs={b}: first step completed at t0+"
                                           f"{run['t_first_step_s']:.1f} s, after the warm-up")
                if run.get("loss_finite") is False:
                    out["warnings"].append(f"bs={b}: final loss is not finite")
            images_window += run.get("images") or 0
            images_total += run.get("images_total") or 0
            out["runs"].append(run)

        seconds = args.seconds
        out["aggregate_images_per_s"] = rnd(images_window / seconds, 1) if seconds > 0 else None
        out["images_window"] = images_window
        out["images_total"] = images_total
        out["cpu_seconds"] = rnd(cpu_total, 3)
        out["cpu_seconds_processes"] = rnd(sum(c.cpu_seconds() or 0.0 for c in my_children), 3)
        out["cpu_seconds_helpers_subtracted"] = rnd(aux_cpu, 3)
        out["cpu_seconds_per_1000_images"] = (rnd(cpu_total / images_total * 1000, 3)
                                              if images_total else None)
        wcpu = sampler.window_cpu() if sampler is not None else None
        out["cpu_seconds_window"] = rnd(wcpu, 3)
        out["cpu_seconds_per_1000_images_window"] = (rnd(wcpu / images_window * 1000, 3)
                                                     if wcpu is not None and images_window else None)
        if sampler is not None and self.cuda:
            out["gpu"] = sampler.gpu_summary()
            ours = {w.pid for _, w, _ in workers}
            out["gpu"]["nvml_processes"] = {
                str(pid): {"max_mib": rnd(e["max_mib"], 0), "lists": e["lists"],
                           "ours": pid in ours} for pid, e in sampler.proc_mem.items()}
            if sampler.gpu and not any(pid in ours for pid in sampler.proc_mem):
                out["warnings"].append("no NVML process entry matches a run's pid (MPS hides "
                                       "clients from the compute list, or another PID namespace)")
            try:
                write_json_atomic(self.logs / f"{name}-gpu-samples.json", sampler.gpu)
            except OSError:
                pass
        else:
            out["gpu"] = None
        if sampler is not None and sampler.errors:
            out["warnings"].extend(sampler.errors)
        out["wall_s"] = rnd(time.monotonic() - wall0, 1)
        if errors:
            out["error"] = "\n\n".join(errors)[-6000:]
        return out

    def look_at_gpu(self, workers) -> tuple[dict, float]:
        """Who is on the GPU mid-window: MPS server list, nvidia-smi, NVML's MPS list."""
        rec: dict = {}
        cpu = 0.0
        ours = {w.pid for _, w, _ in workers}
        if self.mps_env and self.mps_ctl:
            r = self.aux([self.mps_ctl], input_text="get_server_list\n", timeout=10,
                         env={**self.base_env, **self.mps_env})
            cpu += r["cpu_seconds"]
            rec["get_server_list"] = (r.get("stdout") or "").strip() or r.get("error") or r.get("stderr")
            rec["mps_server_processes"] = [p["pid"] for p in mps_processes(self.mps_pipe)
                                           if p["program"] == "nvidia-cuda-mps-server"]
        smi = shutil.which("nvidia-smi")
        if smi:
            r = self.aux([smi, "--query-compute-apps=pid,process_name,used_memory",
                          "--format=csv,noheader"], timeout=15)
            cpu += r["cpu_seconds"]
            rec["nvidia_smi_compute_apps"] = ((r.get("stdout") or "").strip().splitlines()
                                              if r.get("rc") == 0 else r.get("error") or r.get("stderr"))
        if self.nvml is not None and self.nvml.ok:
            try:
                procs = self.nvml.processes()
                rec["nvml"] = {k: [{"pid": p, "mib": rnd(m, 0), "ours": p in ours} for p, m in v]
                               for k, v in procs.items()}
            except Exception as e:  # noqa: BLE001
                rec["nvml"] = {"error": fmt_exc(e)}
        smi_lines = rec.get("nvidia_smi_compute_apps")
        smi_mps = isinstance(smi_lines, list) and any("mps-server" in ln for ln in smi_lines)
        nvml_mps = bool((rec.get("nvml") or {}).get("mps"))
        rec["clients_under_mps"] = bool(self.mps_env) and (
            smi_mps or nvml_mps or bool(rec.get("mps_server_processes")))
        rec["evidence"] = {"nvidia_smi_shows_mps_server": smi_mps,
                           "nvml_mps_process_list_nonempty": nvml_mps,
                           "mps_server_process": bool(rec.get("mps_server_processes"))}
        return rec, cpu

    # ---- the whole run ----------------------------------------------------------------------

    def summary(self) -> dict:
        configs = self.results.get("configs", [])

        def find(kind, source, n=None):
            for c in configs:
                if c["kind"] == kind and c["source"] == source and (n is None or c["budget_cores"] == n):
                    return c
            return None

        def ratio(a, b):
            return rnd(a / b, 3) if a is not None and b else None

        s: dict = {"budgets": {}}
        for n in self.results.get("budgets", []):
            lc, dc = find("colocated", "ladle", n), find("colocated", "dataloader", n)
            if lc is None and dc is None:
                continue
            g = lambda c, k: None if c is None else c.get(k)  # noqa: E731
            s["budgets"][str(n)] = {
                "ladle_images_per_s": g(lc, "aggregate_images_per_s"),
                "dataloader_images_per_s": g(dc, "aggregate_images_per_s"),
                "ladle_over_dataloader_images_per_s": ratio(g(lc, "aggregate_images_per_s"),
                                                            g(dc, "aggregate_images_per_s")),
                "ladle_cpu_s_per_1000_images": g(lc, "cpu_seconds_per_1000_images"),
                "dataloader_cpu_s_per_1000_images": g(dc, "cpu_seconds_per_1000_images"),
                "dataloader_over_ladle_cpu_per_image": ratio(g(dc, "cpu_seconds_per_1000_images"),
                                                             g(lc, "cpu_seconds_per_1000_images")),
                "ladle_cpu_s_per_1000_images_window": g(lc, "cpu_seconds_per_1000_images_window"),
                "dataloader_cpu_s_per_1000_images_window": g(dc, "cpu_seconds_per_1000_images_window"),
                "dataloader_over_ladle_cpu_per_image_window": ratio(
                    g(dc, "cpu_seconds_per_1000_images_window"),
                    g(lc, "cpu_seconds_per_1000_images_window")),
                "complete": bool(lc and dc and not lc["error"] and not dc["error"]),
            }
        n_all = len(self.all_cpus)
        la, da = find("alone", "ladle"), find("alone", "dataloader")
        lc, dc = find("colocated", "ladle", n_all), find("colocated", "dataloader", n_all)
        g = lambda c, k: None if c is None else c.get(k)  # noqa: E731
        s["collocation"] = {
            "budget_cores": n_all,
            "ladle_colocated_images_per_s": g(lc, "aggregate_images_per_s"),
            "ladle_alone_images_per_s": g(la, "aggregate_images_per_s"),
            "collocation_gain": ratio(g(lc, "aggregate_images_per_s"), g(la, "aggregate_images_per_s")),
            "dataloader_colocated_images_per_s": g(dc, "aggregate_images_per_s"),
            "dataloader_alone_images_per_s": g(da, "aggregate_images_per_s"),
            "collocation_gain_dataloader": ratio(g(dc, "aggregate_images_per_s"),
                                                 g(da, "aggregate_images_per_s")),
            "alone_batch": self.args.alone_batch,
        }
        s["notes"] = [
            "images_per_s: images of steps completed inside [t0+warmup, t0+warmup+seconds], "
            "over seconds; aggregate = sum over the configuration's runs",
            "cpu_seconds: getrusage(RUSAGE_CHILDREN) delta of the orchestrator across the "
            "configuration (producer, runs, DataLoader workers, reaped orphans), less its helper "
            "commands; cpu_seconds_per_1000_images divides it by every image every run trained "
            "over its lifetime (start-up CPU included)",
            "cpu_seconds_per_1000_images_window: CPU time of the configuration's process groups "
            "inside the window (from /proc every 0.5 s) over the images inside the window",
            "the MPS server's CPU time is not included (mps_server_cpu_seconds, per configuration)",
        ]
        return s

    def write(self) -> None:
        self.results["summary"] = self.summary()
        if self.mps_env or self.results.get("mps") is True:
            seen = {c["name"]: (c.get("mps_clients") or {}).get("clients_under_mps")
                    for c in self.results.get("configs", []) if "mps_clients" in c}
            self.results["mps_clients_seen"] = seen
        self.results["elapsed_s"] = rnd(time.monotonic() - self.t_start, 1)
        write_json_atomic(self.args.json, self.results)

    def run(self) -> int:
        args = self.args
        r = self.results
        r.update(self.info())
        r.update(device=args.device, model=args.model, dataset=args.dataset,
                 seconds=args.seconds, warmup=args.warmup, batch_sizes=args.batch_sizes,
                 alone_batch=args.alone_batch, ring_mib=args.ring_mib, logs=str(self.logs),
                 max_inflight=args.max_inflight, configs=[], error=None)
        self.ladle = self.resolve_ladle()
        r["ladle_bin"] = self.ladle
        if self.ladle is None:
            r["error"] = "no ladle binary (--ladle-bin, $LADLE_BIN, target/release/ladle, PATH)"
            return 1
        if not os.path.isdir(args.dataset):
            r["error"] = f"dataset {args.dataset} is not a directory"
            return 1
        if self.cuda:
            self.nvml = Nvml(args.device)
            r["nvml"] = self.nvml.info()
            if self.nvml.ok:
                name = r["nvml"].get("name")
                r["device"] = name if isinstance(name, str) else args.device
                drv = r["nvml"].get("driver")
                r["driver"] = drv if isinstance(drv, str) else None
        else:
            r["driver"] = None
        self.start_mps()
        r["subreaper"] = set_subreaper()  # after MPS: its daemon must not become our child
        setpriv = shutil.which("setpriv")
        if setpriv and self.aux([setpriv, "--pdeathsig", "KILL", "--", "true"], timeout=10).get("rc") == 0:
            self.prefix_death = [setpriv, "--pdeathsig", "KILL", "--"]
        r["parent_death_signal"] = bool(self.prefix_death)
        r["taskset"] = bool(self.taskset)
        if self.cuda:
            p = self.probe(with_mps=bool(self.mps_env))
            r["probe"] = p
            if p.get("error") and self.mps_env:
                p2 = self.probe(with_mps=False)
                r["probe_without_mps"] = p2
                self.quit_mps()
                self.mps_env = {}
                if p2.get("error"):
                    r["mps"] = "failed: CUDA fails with and without MPS"
                    r["error"] = "CUDA probe failed with and without MPS: " + p2["error"][-1500:]
                    return 1
                r["mps"] = "failed: CUDA probe under MPS failed, ran without MPS: " + p["error"][-800:]
            elif p.get("error"):
                r["error"] = "CUDA probe failed: " + p["error"][-1500:]
                return 1
            if isinstance(p.get("name"), str) and not isinstance(r.get("device"), str):
                r["device"] = p["name"]
            if r.get("device") == args.device and isinstance(p.get("name"), str):
                r["device"] = p["name"]
        self.write()
        rc = 0
        for cfg in self.plan():
            need = args.warmup + args.seconds + 15
            if self.time_left() < need:
                res = {"name": cfg["name"], "kind": cfg["kind"], "source": cfg["source"],
                       "budget_cores": cfg["budget"], "runs": [],
                       "error": f"skipped: {self.time_left():.0f} s of --budget-s left, "
                                f"needs about {need:.0f} s"}
            else:
                print(f"[colocate {time.strftime('%T')}] {cfg['name']}: "
                      f"{len(cfg['batch_sizes'])} run(s), {cfg['budget']} cores", flush=True)
                self.current = cfg["name"]
                res = self.run_config(cfg)
                self.current = None
                agg = res.get("aggregate_images_per_s")
                print(f"[colocate {time.strftime('%T')}] {cfg['name']}: {agg} images/s, "
                      f"{res.get('cpu_seconds_per_1000_images')} CPU-s/1000 images"
                      + (f"  ERROR: {res['error'][:300]}" if res.get("error") else ""), flush=True)
            if res.get("error"):
                rc = 1
            r["configs"].append(res)
            self.write()
        return rc

    def cleanup(self) -> None:
        try:
            self.kill_all()
        except Exception as e:  # noqa: BLE001
            self.results.setdefault("cleanup_errors", []).append(fmt_exc(e))
        try:
            self.quit_mps()
        except Exception as e:  # noqa: BLE001
            self.results.setdefault("cleanup_errors", []).append(fmt_exc(e))
        if self.nvml is not None and self.nvml.ok:
            try:
                self.nvml.nv.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
        shutil.rmtree(self.work, ignore_errors=True)


def print_table(results: dict) -> None:
    def f(x, nd=1):
        return "-" if x is None else f"{x:.{nd}f}"

    print()
    print(f"device {results.get('device')}  driver {results.get('driver')}  torch "
          f"{results.get('torch')} (CUDA {results.get('cuda')})  cores {results.get('cores')}  "
          f"mps {results.get('mps')}")
    hdr = (f"{'config':<24}{'cores':>5}  {'runs: batch=images/s':<44}{'agg img/s':>10}"
           f"{'CPU-s/1k':>9}{'(window)':>9}{'prod CPU-s':>11}{'GPU MiB':>9}{'util%':>6}"
           f"{'SM%':>6}{'occ%':>6}  ok")
    print(hdr)
    print("-" * len(hdr))
    for c in results.get("configs", []):
        runs = " ".join(f"{r['batch_size']}={f(r.get('images_per_s'), 0)}" for r in c.get("runs", []))
        g = c.get("gpu") or {}
        print(f"{c['name']:<24}{c.get('budget_cores', '-'):>5}  {runs:<44}"
              f"{f(c.get('aggregate_images_per_s')):>10}{f(c.get('cpu_seconds_per_1000_images'), 2):>9}"
              f"{f(c.get('cpu_seconds_per_1000_images_window'), 2):>9}"
              f"{f(c.get('producer_cpu_seconds')):>11}{f(g.get('memory_used_mib_max'), 0):>9}"
              f"{f(g.get('util_mean')):>6}{f(g.get('sm_activity_mean')):>6}"
              f"{f(g.get('sm_occupancy_mean')):>6}  {'yes' if not c.get('error') else 'NO'}")
    s = results.get("summary") or {}
    for n, b in (s.get("budgets") or {}).items():
        print(f"{n} cores: ladle/dataloader images/s {f(b['ladle_over_dataloader_images_per_s'], 2)}x; "
              f"CPU-s per 1000 images ladle {f(b['ladle_cpu_s_per_1000_images'], 2)} vs dataloader "
              f"{f(b['dataloader_cpu_s_per_1000_images'], 2)} "
              f"({f(b['dataloader_over_ladle_cpu_per_image'], 2)}x; window "
              f"{f(b['dataloader_over_ladle_cpu_per_image_window'], 2)}x)")
    col = s.get("collocation") or {}
    if col:
        print(f"collocation gain ({len(results.get('batch_sizes') or [])} runs / 1 run alone, "
              f"{col.get('budget_cores')} cores): ladle "
              f"{f(col.get('collocation_gain'), 2)}x, dataloader "
              f"{f(col.get('collocation_gain_dataloader'), 2)}x")
    for c in results.get("configs", []):
        if c.get("error"):
            first = c["error"].strip().splitlines()[:3]
            print(f"ERROR {c['name']}: " + " | ".join(first)[:400])
    if results.get("error"):
        print(f"ERROR: {results['error'][:600]}")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker_main(sys.argv[2:])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "probe":
        probe_main(sys.argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, help="ImageFolder directory")
    p.add_argument("--json", required=True, help="write the results here")
    p.add_argument("--seconds", type=float, default=30.0, help="measurement window (default 30)")
    p.add_argument("--warmup", type=float, default=30.0,
                   help="seconds from the common start to the window, start-up included (default 15)")
    p.add_argument("--budgets", default="all,4",
                   help="CPU budgets in cores, 'all' = every core this process may use "
                        "(default all,4)")
    p.add_argument("--batch-sizes", default="32,64,128,256")
    p.add_argument("--alone-batch", type=int, default=128)
    p.add_argument("--skip-alone", action="store_true", help="no alone configurations")
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="resnet18", help="torchvision model name, or 'tiny'")
    p.add_argument("--ladle-bin", default=None, help="default $LADLE_BIN, target/release/ladle")
    p.add_argument("--logs", default=None, help="logs directory (default: a new temp dir)")
    p.add_argument("--no-mps", action="store_true")
    p.add_argument("--ring-mib", type=int, default=1024)
    p.add_argument("--max-inflight", type=int, default=2,
                   help="training steps a run may queue on the GPU ahead of completion (default 2)")
    p.add_argument("--grace", type=float, default=40.0,
                   help="seconds after the window's end before a configuration is killed")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="total time budget; configurations that would not fit are skipped")
    args = p.parse_args()
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    args.dataset = str(Path(args.dataset).resolve())
    args.json = str(Path(args.json).resolve())

    orch = Orchestrator(args)

    def on_signal(signum, _frame):
        raise Interrupted(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    rc = 1
    try:
        rc = orch.run()
    except Interrupted as e:
        orch.results["interrupted"] = f"{e}" + (f" during {orch.current}" if orch.current else "")
        rc = 1
    except BaseException as e:  # noqa: BLE001
        orch.results["error"] = "".join(traceback.format_exception(e))[-TAIL:]
        rc = 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        orch.cleanup()
        if orch.results.get("error"):
            rc = 1
        try:
            orch.write()
        except Exception as e:  # noqa: BLE001
            print(f"could not write {args.json}: {fmt_exc(e)}", file=sys.stderr)
            rc = 1
    print_table(orch.results)
    print(f"\nJSON: {args.json}   logs: {orch.logs}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
