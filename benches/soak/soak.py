#!/usr/bin/env python3
"""A bounded soak of one ``ladle serve``: consumers join, pause and die at random for M minutes.

One producer (``ladle serve``, 1 decode thread, a 4 MiB ring, ``--stall-timeout 2``) serves a
500-image ImageFolder dataset for ``--minutes``. Meanwhile this script keeps 3 to 6
``ladle consume --json`` processes running, each with a random batch size (1 to half the
ring, the edge C/2 included), a random epoch count, a random per-batch step and, for half
of them, ``--hold-previous``; at random moments it starts another one (a late joiner),
pauses one with SIGSTOP for 0.5 to 8 s (longer than the stall timeout, so the producer lets
it go and it rejoins, or shorter, so it only holds the feed back), or kills one with SIGKILL.

Every second it samples the producer: open fds, threads, RSS, CPU seconds, and the number
of live and paused consumers (``samples.csv``). At the end it lets the running consumers
finish (30 s at most), kills the rest, samples the idle producer again, then starts two
consumers and stops the producer with SIGTERM: the producer must exit within 20 s, remove
its socket, and both consumers must fail with the producer's "ended" error promptly.

Every consumer's JSON lines are checked: every completed epoch must hold every sample
exactly once (``exact_coverage``) with no bad samples; a consumer that was not killed must
exit 0 after its epochs; a consumer whose output stops growing for ``--stuck-after``
seconds while it is not paused is reported as stuck (and killed, so the soak goes on).

Outputs in ``--out``: ``summary.json`` (the numbers and the verdict), ``samples.csv``,
``events.csv``, ``serve.log`` (the producer's stderr) and ``serve.tail.txt`` (its last
200 lines), ``consumers/cNNNN.{out,err}`` and ``plot.png`` when matplotlib is importable
(otherwise run ``--plot-only DIR`` later with a Python that has it).

Usage (from the repository root; the run itself needs only the standard library)::

    cargo build --release -p ladle
    python3 benches/soak/soak.py --minutes 10 --out /tmp/soak10

Exit status: 0 when the verdict is clean, 1 when it is not, 2 when the soak could not run,
130 when interrupted (children are killed and a partial summary is written either way).
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

DATASET_COUNT = 500
DATASET_WIDTH = 64
DATASET_HEIGHT = 48
IMAGE_SIZE = 32
RING_MIB = 4
STALL_TIMEOUT_S = 2
WARMUP_S = 10.0
SERVE_READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
DRAIN_S = 30.0
# The verdict's tolerances: idle fds and threads at the end may exceed those at the start by
# this many; RSS at the end may exceed RSS after the warm-up by this fraction.
FDS_TOLERANCE = 2
THREADS_TOLERANCE = 2
RSS_TOLERANCE = 0.20

CSV_FIELDS = (
    "t_s",
    "phase",
    "fds",
    "threads",
    "rss_kib",
    "cpu_s",
    "live_consumers",
    "paused_consumers",
    "started_total",
    "killed_total",
    "paused_total",
)


class SoakError(Exception):
    """The soak could not run or the producer failed; the message says what to look at."""


class Interrupted(Exception):
    """SIGTERM or SIGHUP reached this script."""


def _on_signal(signum: int, _frame: object) -> None:
    raise Interrupted(signal.Signals(signum).name)


def _spawn(cmd: list, out: Path, err: Path, on_parent_death: int) -> subprocess.Popen:
    """Starts ``cmd`` in its own session with stdout/stderr to files; it gets
    ``on_parent_death`` if this script dies."""
    with open(out, "wb") as fo, open(err, "wb") as fe:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=fo,
            stderr=fe,
            start_new_session=True,
            preexec_fn=_die_with_parent(on_parent_death),
        )


def _die_with_parent(sig: int):
    """A ``preexec_fn``: the child gets ``sig`` when this script dies, however it dies."""
    parent = os.getpid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        prctl = None

    def preexec() -> None:
        if prctl is not None:
            prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


# ---------------------------------------------------------------------------------------------
# /proc sampling
# ---------------------------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def sample_process(pid: int) -> dict | None:
    """Open fds, threads, RSS (KiB) and CPU seconds of ``pid``; None once it is gone."""
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        threads = len(os.listdir(f"/proc/{pid}/task"))
        rss_kib = 0
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss_kib = int(line.split()[1])
                    break
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        # rest[0] is field 3 (state); utime and stime are fields 14 and 15.
        if rest[0] == "Z":
            return None
        cpu_s = (int(rest[11]) + int(rest[12])) / CLK_TCK
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None
    return {"fds": fds, "threads": threads, "rss_kib": rss_kib, "cpu_s": cpu_s}


def wchans(pid: int) -> dict[str, str]:
    """Where each thread of ``pid`` sleeps in the kernel (for a stuck process's report)."""
    out = {}
    try:
        for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            try:
                with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                    w = f.read().strip()
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                out[tid] = f"{state} {w}"
            except OSError:
                pass
    except OSError:
        pass
    return out


def tail(path: Path, lines: int) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()[-lines:]
    except OSError:
        return []


# ---------------------------------------------------------------------------------------------
# Consumers
# ---------------------------------------------------------------------------------------------


@dataclass
class Consumer:
    n: int
    proc: subprocess.Popen
    batch: int
    epochs: int
    step_ms: int
    hold_previous: bool
    started: float
    out: Path
    err: Path
    phase: str = "soak"  # "soak", or "stop" for the two started to watch the producer stop
    paused_until: float | None = None
    pauses: int = 0
    paused_s: float = 0.0
    paused_at: float = 0.0
    killed: str | None = None  # "random", "stuck", "end", "cleanup"
    ended: float | None = None
    rc: int | None = None
    last_size: int = 0
    last_progress: float = 0.0
    stuck_report: dict | None = None

    @property
    def live(self) -> bool:
        return self.rc is None

    @property
    def paused(self) -> bool:
        return self.paused_until is not None

    def signal(self, sig: int) -> bool:
        """Sends ``sig`` unless the process was already reaped (its pid cannot be reused
        before that)."""
        if self.proc.poll() is not None:
            return False
        try:
            self.proc.send_signal(sig)
        except ProcessLookupError:
            return False
        return True

    def describe(self) -> dict:
        return {
            "consumer": f"c{self.n:04d}",
            "pid": self.proc.pid,
            "batch_size": self.batch,
            "epochs": self.epochs,
            "step_ms": self.step_ms,
            "hold_previous": self.hold_previous,
            "phase": self.phase,
            "pauses": self.pauses,
            "killed": self.killed,
            "rc": self.rc,
            "stdout": str(self.out),
            "stderr": str(self.err),
        }


@dataclass
class Outcome:
    """What one consumer's output says."""

    epochs_completed: int = 0
    epochs_exact: int = 0
    bad_samples: int = 0
    summary: dict | None = None
    rejoins_logged: int = 0
    problems: list[str] = field(default_factory=list)


def read_outcome(c: Consumer, dataset_len: int) -> Outcome:
    o = Outcome()
    try:
        lines = c.out.read_text(errors="replace").splitlines()
    except OSError as e:
        o.problems.append(f"cannot read its stdout: {e}")
        lines = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            o.problems.append(f"stdout line {i} is not JSON: {line[:200]!r}")
            continue
        if "epoch" in obj:
            if not obj.get("complete", False):
                continue  # only --seconds makes these; an unfinished epoch is not counted
            o.epochs_completed += 1
            o.bad_samples += int(obj.get("bad_samples", 0))
            exact = bool(obj.get("exact_coverage")) and obj.get("samples") == dataset_len
            if exact:
                o.epochs_exact += 1
            else:
                o.problems.append(f"inexact epoch (stdout line {i}): {line}")
            if obj.get("bad_samples", 0):
                o.problems.append(f"bad samples (stdout line {i}): {line}")
        elif "rejoins" in obj:
            o.summary = obj
    for line in tail(c.err, 100_000):
        if "rejoined" in line:
            o.rejoins_logged += 1
    s = o.summary
    if s is not None and s.get("overwritten_batches", 0) and not s.get("rejoins", 0):
        o.problems.append(f"batches overwritten while held without a let-go: {json.dumps(s)}")
    if c.phase == "soak" and c.killed is None:
        if c.rc is not None and c.rc < 0:
            sig = signal.Signals(-c.rc).name
            why = (
                "a signal this script never sends: something outside the soak killed it"
                if -c.rc in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL)
                else "it crashed"
            )
            o.problems.append(
                f"died of {sig} without being killed by the soak ({why}); stderr tail: "
                + " | ".join(tail(c.err, 5))
            )
        elif c.rc != 0:
            o.problems.append(
                f"exited with status {c.rc} without being killed; stderr tail: "
                + " | ".join(tail(c.err, 5))
            )
        elif s is None:
            o.problems.append("exited 0 without its summary line")
        elif s.get("epochs") != c.epochs or o.epochs_completed != c.epochs:
            o.problems.append(
                f"asked for {c.epochs} epochs, printed {o.epochs_completed} epoch lines and "
                f"a summary of {s.get('epochs')}"
            )
    return o


# ---------------------------------------------------------------------------------------------
# The soak
# ---------------------------------------------------------------------------------------------


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out).resolve()
        self.rng = random.Random(args.seed)
        self.sock = self.out / "s.sock"
        self.ladle = Path(args.ladle)
        self.producer: subprocess.Popen | None = None
        self.capacity = 0
        self.consumers: list[Consumer] = []
        self.samples: list[dict] = []
        self.events: list[tuple[float, str, str, str]] = []
        self.t0 = time.monotonic()
        self.phase = "setup"
        self.counts = {"started": 0, "paused": 0, "killed": 0}
        self.anomalies: list[str] = []
        self.idle_start: dict | None = None
        self.idle_end: dict | None = None
        self.soak_end_t: float | None = None
        self.stop: dict = {}
        self.interrupted = False
        self.ladle_version = ""

    # -- helpers ------------------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.t0

    def log(self, msg: str) -> None:
        print(f"[soak {self.now():7.1f}s] {msg}", flush=True)

    def event(self, kind: str, who: str = "", detail: str = "") -> None:
        self.events.append((round(self.now(), 3), kind, who, detail))

    def anomaly(self, msg: str) -> None:
        self.anomalies.append(msg)
        self.log(f"ANOMALY: {msg}")

    def live(self, phase: str = "soak") -> list[Consumer]:
        return [c for c in self.consumers if c.live and c.phase == phase]

    # -- setup --------------------------------------------------------------------------------

    def prepare(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        if len(os.fsencode(self.sock)) >= 108:
            raise SoakError(f"{self.sock}: too long for a Unix socket path; use a shorter --out")
        if not (self.ladle.is_file() and os.access(self.ladle, os.X_OK)):
            raise SoakError(
                f"{self.ladle}: no ladle binary there; build it with "
                "`cargo build --release -p ladle` or pass --ladle PATH"
            )
        # Run a frozen copy: a rebuild during the soak must not mix two versions (and other
        # people's clean-up of `ladle consume` processes by name does not reach this one's).
        frozen = self.out / "ladle-soak"
        if frozen.resolve() != self.ladle.resolve():
            shutil.copy2(self.ladle, frozen)
        self.ladle = frozen
        self.ladle_version = subprocess.run(
            [self.ladle, "--version"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
        consumers_dir = self.out / "consumers"
        if consumers_dir.exists():
            shutil.rmtree(consumers_dir)
        consumers_dir.mkdir()
        for name in ("summary.json", "samples.csv", "events.csv", "plot.png", "serve.tail.txt"):
            (self.out / name).unlink(missing_ok=True)
        self.dataset()

    def dataset(self) -> None:
        data = self.out / "data"
        if data.exists() and any(data.iterdir()):
            n = sum(1 for p in data.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
            if n != DATASET_COUNT:
                raise SoakError(
                    f"{data} holds {n} images, not the soak's {DATASET_COUNT}; remove it or "
                    "choose another --out"
                )
            self.log(f"reusing the dataset in {data}")
            return
        self.log(f"generating {DATASET_COUNT} {DATASET_WIDTH}x{DATASET_HEIGHT} JPEGs in {data}")
        cmd = [
            self.ladle, "dataset", "generate", "--format", "imagefolder",
            "--count", str(DATASET_COUNT), "--width", str(DATASET_WIDTH),
            "--height", str(DATASET_HEIGHT), "--out", data, "--force",
        ]  # fmt: skip
        try:
            r = subprocess.run(
                cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            raise SoakError("`ladle dataset generate` did not finish in 600 s") from None
        if r.returncode != 0:
            raise SoakError(f"`ladle dataset generate` failed ({r.returncode}): {r.stderr.strip()}")

    def start_producer(self) -> None:
        cmd = [
            self.ladle, "serve", "--dataset", self.out / "data", "--socket", self.sock,
            "--image-size", str(IMAGE_SIZE), "--ring-mib", str(RING_MIB), "--threads", "1",
            "--stall-timeout", str(STALL_TIMEOUT_S),
        ]  # fmt: skip
        self.serve_log = self.out / "serve.log"
        self.serve_out = self.out / "serve.out"
        self.producer = _spawn(cmd, self.serve_out, self.serve_log, signal.SIGTERM)
        self.log(f"producer pid {self.producer.pid}: {' '.join(map(str, cmd[1:]))}")
        deadline = time.monotonic() + SERVE_READY_TIMEOUT_S
        pattern = re.compile(r"ring: (\d+) samples")
        while True:
            if self.producer.poll() is not None:
                raise SoakError(
                    f"`ladle serve` exited with status {self.producer.returncode} before it was "
                    f"ready; its stderr: {' | '.join(tail(self.serve_log, 10))}"
                )
            m = pattern.search(self.serve_log.read_text(errors="replace"))
            if m and self.sock.exists():
                self.capacity = int(m.group(1))
                break
            if time.monotonic() > deadline:
                raise SoakError(
                    f"`ladle serve` was not ready after {SERVE_READY_TIMEOUT_S:.0f} s (no "
                    f"'ring: N samples' line or no {self.sock}); see {self.serve_log}"
                )
            time.sleep(0.05)
        if self.capacity < 2:
            raise SoakError(f"the ring holds {self.capacity} samples; a batch needs C/2 >= 1")
        self.t0 = time.monotonic()
        self.log(f"producer ready: ring of {self.capacity} samples, batch sizes up to "
                 f"{self.capacity // 2}")

    # -- consumers ----------------------------------------------------------------------------

    def random_config(self) -> tuple[int, int, int, bool]:
        rng, half = self.rng, self.capacity // 2
        r = rng.random()
        if r < 0.15:
            batch = half  # the largest legal batch: with --hold-previous it holds the whole ring
        elif r < 0.5:
            batch = rng.randint(1, half)
        else:
            batch = max(1, min(half, round(math.exp(rng.uniform(0, math.log(half))))))
        hold = rng.random() < 0.5
        if rng.random() < 0.15:
            step = 0
        else:
            step = rng.choice((1, 2, 3, 5, 8, 10, 15, 20, 30, 50))
        batches = math.ceil(DATASET_COUNT / batch)
        step = min(step, 12_000 // batches)  # an epoch of steps stays under ~12 s
        epoch_s = batches * (step + 0.2) / 1000 + 0.05
        most = max(1, min(20, int(rng.uniform(5, 45) / epoch_s)))
        return batch, rng.randint(1, most), step, hold

    def start_consumer(self, phase: str = "soak", config=None) -> Consumer:
        batch, epochs, step, hold = config or self.random_config()
        n = len(self.consumers)
        out = self.out / "consumers" / f"c{n:04d}.out"
        err = self.out / "consumers" / f"c{n:04d}.err"
        cmd = [
            self.ladle, "consume", "--socket", self.sock, "--batch-size", str(batch),
            "--epochs", str(epochs), "--json", "--step-ms", str(step), "--name", f"soak-c{n:04d}",
        ]  # fmt: skip
        if hold:
            cmd.append("--hold-previous")
        proc = _spawn(cmd, out, err, signal.SIGKILL)
        t = time.monotonic()
        c = Consumer(n, proc, batch, epochs, step, hold, t, out, err, phase=phase, last_progress=t)
        self.consumers.append(c)
        if phase == "soak":
            self.counts["started"] += 1
        self.event("start", f"c{n:04d}", f"B={batch} E={epochs} step={step}ms hold={hold}")
        return c

    def reap(self) -> None:
        now = time.monotonic()
        for c in self.consumers:
            if c.rc is None:
                rc = c.proc.poll()
                if rc is not None:
                    c.rc, c.ended = rc, now
                    if c.paused:
                        c.paused_s += now - c.paused_at
                        c.paused_until = None
                    self.event("exit", f"c{c.n:04d}", f"rc={rc}")
                    continue
            if c.rc is None and c.paused and now >= c.paused_until:
                c.signal(signal.SIGCONT)
                c.paused_s += now - c.paused_at
                c.paused_until = None
                c.last_progress = now
                self.event("resume", f"c{c.n:04d}")

    def check_stuck(self) -> None:
        now = time.monotonic()
        for c in self.consumers:
            if not c.live or c.paused:
                continue
            try:
                size = c.out.stat().st_size
            except OSError:
                size = c.last_size
            if size != c.last_size:
                c.last_size, c.last_progress = size, now
                continue
            if now - c.last_progress < self.args.stuck_after:
                continue
            name = f"c{c.n:04d}"
            report = {
                **c.describe(),
                "silent_s": round(now - c.last_progress, 1),
                "threads": wchans(c.proc.pid),
                "stdout_tail": tail(c.out, 5),
                "stderr_tail": tail(c.err, 20),
                "serve_log_tail": tail(self.serve_log, 60),
            }
            c.stuck_report = report
            path = self.out / f"stuck-{name}.json"
            path.write_text(json.dumps(report, indent=2) + "\n")
            self.anomaly(
                f"{name} (B={c.batch}, step {c.step_ms} ms, hold={c.hold_previous}) printed "
                f"nothing for {now - c.last_progress:.0f} s while running; killed it; see {path}"
            )
            c.killed = "stuck"
            c.signal(signal.SIGKILL)
            self.event("kill", name, "stuck")

    def random_event(self) -> None:
        args = self.args
        live = self.live()
        running = [c for c in live if not c.paused]
        paused = [c for c in live if c.paused]
        choices = []
        if len(live) < args.max_consumers:
            choices.append(("start", 4.0))
        if running and len(paused) < 2:
            choices.append(("pause", 3.5))
        if live:
            choices.append(("kill", 2.5))
        if not choices:
            return
        kind = self.rng.choices([k for k, _ in choices], [w for _, w in choices])[0]
        if kind == "start":
            c = self.start_consumer()
            self.log(f"late joiner c{c.n:04d}: B={c.batch} E={c.epochs} step={c.step_ms}ms "
                     f"hold={c.hold_previous}")
        elif kind == "pause":
            c = self.rng.choice(running)
            span = self.rng.uniform(0.5, 8.0)
            if c.signal(signal.SIGSTOP):
                now = time.monotonic()
                c.paused_until, c.paused_at = now + span, now
                c.pauses += 1
                self.counts["paused"] += 1
                self.event("pause", f"c{c.n:04d}", f"{span:.2f}s")
                self.log(f"paused c{c.n:04d} for {span:.1f} s")
        else:
            c = self.rng.choice(live)
            if c.signal(signal.SIGKILL):
                c.killed = "random"
                self.counts["killed"] += 1
                self.event("kill", f"c{c.n:04d}", "paused" if c.paused else "running")
                self.log(f"killed c{c.n:04d}" + (" (while paused)" if c.paused else ""))

    def sample(self) -> None:
        assert self.producer is not None
        s = sample_process(self.producer.pid)
        if s is None:
            return
        live = self.live()
        s.update(
            t_s=round(self.now(), 2),
            phase=self.phase,
            live_consumers=len(live),
            paused_consumers=sum(c.paused for c in live),
            started_total=self.counts["started"],
            killed_total=self.counts["killed"],
            paused_total=self.counts["paused"],
        )
        self.samples.append(s)

    def producer_alive(self) -> None:
        assert self.producer is not None
        if self.producer.poll() is not None:
            raise SoakError(
                f"the producer exited with status {self.producer.returncode} during the soak "
                f"(phase {self.phase}); stderr tail: {' | '.join(tail(self.serve_log, 10))}"
            )

    def tick_until(self, until: float, events: bool, top_up: bool, stop_when=None) -> None:
        """Runs the loop (reap, resume, stuck check, sample each second, random events)
        until ``until`` seconds (self.now()) or ``stop_when()``."""
        next_sample = math.floor(self.now()) + 1.0
        next_event = self.now() + self.rng.uniform(0.3, 3.0)
        while self.now() < until:
            self.reap()
            self.producer_alive()
            self.check_stuck()
            if top_up:
                while len(self.live()) < self.args.min_consumers:
                    self.start_consumer()
            if events and self.now() >= next_event:
                self.random_event()
                next_event = self.now() + self.rng.uniform(0.3, 3.0)
            if self.now() >= next_sample:
                self.sample()
                next_sample += 1.0
                if len(self.samples) % 60 == 0:
                    last = self.samples[-1]
                    self.log(
                        f"fds {last['fds']} threads {last['threads']} rss "
                        f"{last['rss_kib'] / 1024:.1f} MiB, {last['live_consumers']} live; "
                        f"started {self.counts['started']}, paused {self.counts['paused']}, "
                        f"killed {self.counts['killed']}"
                    )
            if stop_when is not None and stop_when():
                return
            time.sleep(0.05)

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> None:
        self.prepare()
        self.start_producer()
        self.phase = "idle-start"
        self.tick_until(1.5, events=False, top_up=False)
        self.idle_start = sample_process(self.producer.pid)
        self.event("idle-start", "", json.dumps(self.idle_start))
        self.log(f"idle producer before any consumer: {self.idle_start}")

        self.phase = "soak"
        soak_s = self.args.minutes * 60.0
        self.tick_until(self.now() + soak_s, events=True, top_up=True)
        self.soak_end_t = self.now()

        # Drain: no new events; paused consumers resume; running ones may finish.
        self.phase = "drain"
        self.log("soak over: resuming paused consumers, letting the running ones finish")
        for c in self.live():
            if c.paused:
                c.paused_until = time.monotonic()
        self.tick_until(self.now() + DRAIN_S, events=False, top_up=False,
                        stop_when=lambda: not self.live())
        for c in self.live():
            c.killed = "end"
            c.signal(signal.SIGKILL)
            self.event("kill", f"c{c.n:04d}", "end of soak")
        if any(c.killed == "end" for c in self.consumers):
            self.log(f"killed {sum(c.killed == 'end' for c in self.consumers)} consumers still "
                     "running after the drain")

        # The idle producer again: every consumer is gone, so fds and threads must be back.
        self.phase = "idle-end"
        self.tick_until(self.now() + 3.0, events=False, top_up=False)
        self.reap()
        self.idle_end = sample_process(self.producer.pid)
        self.event("idle-end", "", json.dumps(self.idle_end))
        self.log(f"idle producer after every consumer left: {self.idle_end}")

        self.stop_producer()

    def stop_producer(self) -> None:
        """SIGTERM with two consumers attached: the producer exits within 20 s, its socket
        file is gone, and the consumers are told (they exit with an error)."""
        self.phase = "stop"
        watchers = [
            self.start_consumer("stop", (10, 1000, 5, False)),
            self.start_consumer("stop", (self.capacity // 2, 1000, 5, True)),
        ]
        self.tick_until(self.now() + 2.0, events=False, top_up=False)
        assert self.producer is not None
        self.producer_alive()
        self.log("stopping the producer with SIGTERM")
        sent = time.monotonic()
        self.event("sigterm", "producer")
        self.producer.send_signal(signal.SIGTERM)
        try:
            rc = self.producer.wait(timeout=STOP_TIMEOUT_S)
            exit_s = time.monotonic() - sent
        except subprocess.TimeoutExpired:
            rc, exit_s = None, None
            self.anomaly(f"the producer did not exit within {STOP_TIMEOUT_S:.0f} s of SIGTERM; "
                         "killed it")
            self.producer.kill()
            self.producer.wait(timeout=10)
        socket_removed = not self.sock.exists()
        if not socket_removed:
            self.anomaly(f"{self.sock} still exists after the producer stopped")
        if rc not in (0, None):
            self.anomaly(f"the producer exited with status {rc} after SIGTERM")
        # Poll both, so each one's exit time is its own.
        deadline = time.monotonic() + 10.0
        while any(c.proc.poll() is None for c in watchers) and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.01)
        self.reap()
        told = []
        for c in watchers:
            if c.live:
                self.anomaly(f"c{c.n:04d} (attached at SIGTERM) had not exited 10 s later")
                c.killed = "cleanup"
                c.signal(signal.SIGKILL)
                c.proc.wait(timeout=10)
                self.reap()
            err = " ".join(tail(c.err, 5))
            ok = c.rc not in (0, None) and ("ended" in err or "shutting down" in err)
            if not ok and c.killed is None:
                self.anomaly(f"c{c.n:04d} (attached at SIGTERM) exited {c.rc} without the "
                             f"producer's 'ended' error; stderr: {err}")
            told.append({
                "consumer": f"c{c.n:04d}",
                "rc": c.rc,
                "exit_after_sigterm_s": round(c.ended - sent, 3) if c.ended else None,
                "told": ok,
            })
        published = None
        for line in tail(self.serve_out, 20):
            try:
                published = json.loads(line).get("published", published)
            except (json.JSONDecodeError, AttributeError):
                pass
        self.stop = {
            "rc": rc,
            "exit_after_sigterm_s": round(exit_s, 3) if exit_s is not None else None,
            "socket_removed": socket_removed,
            "attached_consumers": told,
            "published_samples": published,
        }
        self.log(f"producer stopped: {self.stop}")

    # -- cleanup and outputs ------------------------------------------------------------------

    def cleanup(self) -> None:
        """Kills every child still running; bounded."""
        for c in self.consumers:
            if c.proc.poll() is None:
                if c.killed is None:
                    c.killed = "cleanup"
                c.signal(signal.SIGKILL)
        for c in self.consumers:
            try:
                c.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                print(f"warning: consumer pid {c.proc.pid} survived SIGKILL", file=sys.stderr)
        self.reap()
        p = self.producer
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    print(f"warning: producer pid {p.pid} survived SIGKILL", file=sys.stderr)

    def summarize(self) -> dict:
        outcomes = {c.n: read_outcome(c, DATASET_COUNT) for c in self.consumers}
        for c in self.consumers:
            for p in outcomes[c.n].problems:
                self.anomalies.append(f"c{c.n:04d} {json.dumps(c.describe())}: {p}")
        serve_lines = tail(self.serve_log, 10_000_000) if hasattr(self, "serve_log") else []

        def count(text: str) -> int:
            return sum(text in line for line in serve_lines)

        errors = [ln for ln in serve_lines if " ERROR " in ln or "panicked" in ln]
        for ln in errors[:20]:
            self.anomalies.append(f"producer log: {ln}")

        soak = [s for s in self.samples if s["phase"] == "soak"]
        start = next((s for s in soak if s["t_s"] >= WARMUP_S), soak[0] if soak else None)
        end = soak[-1] if soak else None

        def pick(s: dict | None) -> dict | None:
            if s is None:
                return None
            keys = ("t_s", "fds", "threads", "rss_kib", "cpu_s", "live_consumers")
            return {k: s[k] for k in keys if k in s}

        mx = (
            {k: max(s[k] for s in self.samples) for k in ("fds", "threads", "rss_kib")}
            if self.samples
            else None
        )
        # RSS drift over the soak after the warm-up: least-squares slope, KiB per minute.
        pts = [(s["t_s"], s["rss_kib"]) for s in soak if s["t_s"] >= WARMUP_S]
        slope = None
        if len(pts) >= 2:
            mt = sum(t for t, _ in pts) / len(pts)
            mr = sum(r for _, r in pts) / len(pts)
            den = sum((t - mt) ** 2 for t, _ in pts)
            if den > 0:
                slope = round(60 * sum((t - mt) * (r - mr) for t, r in pts) / den, 1)

        soak_c = [c for c in self.consumers if c.phase == "soak"]
        completed = sum(outcomes[c.n].epochs_completed for c in self.consumers)
        exact = sum(outcomes[c.n].epochs_exact for c in self.consumers)
        bad = sum(outcomes[c.n].bad_samples for c in self.consumers)
        summaries = [outcomes[c.n].summary for c in self.consumers if outcomes[c.n].summary]
        ie, is_ = self.idle_end, self.idle_start
        rss_ref = start["rss_kib"] if start else None
        verdict = {
            "fds_flat": bool(ie and is_ and ie["fds"] <= is_["fds"] + FDS_TOLERANCE),
            "threads_flat": bool(
                ie and is_ and ie["threads"] <= is_["threads"] + THREADS_TOLERANCE
            ),
            "rss_flat": bool(ie and rss_ref and ie["rss_kib"] <= rss_ref * (1 + RSS_TOLERANCE)),
            "every_epoch_exact": completed == exact and completed > 0,
            "no_bad_samples": bad == 0,
            "no_stuck_consumer": not any(c.killed == "stuck" for c in self.consumers),
            "clean_stop": bool(
                self.stop
                and self.stop["rc"] == 0
                and self.stop["socket_removed"]
                and all(w["told"] for w in self.stop["attached_consumers"])
            ),
            "completed": not self.interrupted and self.soak_end_t is not None,
        }
        if not verdict["fds_flat"] and ie and is_:
            self.anomalies.append(f"idle fds grew: {is_['fds']} -> {ie['fds']}")
        if not verdict["threads_flat"] and ie and is_:
            self.anomalies.append(f"idle threads grew: {is_['threads']} -> {ie['threads']}")
        if not verdict["rss_flat"] and ie and rss_ref:
            self.anomalies.append(f"RSS grew: {rss_ref} KiB after warm-up -> {ie['rss_kib']} KiB")
        verdict["ok"] = all(verdict.values()) and not self.anomalies
        pauses = [float(d[:-1]) for _, k, _, d in self.events if k == "pause"]
        return {
            "minutes": self.args.minutes,
            "soak_seconds": round(self.soak_end_t, 1) if self.soak_end_t else None,
            "seed": self.args.seed,
            "ladle": self.ladle_version,
            "setup": {
                "dataset": f"{DATASET_COUNT} ImageFolder JPEGs {DATASET_WIDTH}x{DATASET_HEIGHT}",
                "image_size": IMAGE_SIZE,
                "ring_mib": RING_MIB,
                "ring_capacity": self.capacity,
                "threads": 1,
                "stall_timeout_s": STALL_TIMEOUT_S,
                "consumers_kept": [self.args.min_consumers, self.args.max_consumers],
            },
            "consumers": {
                "started": len(soak_c),
                "late_joiners": max(0, len(soak_c) - self.args.min_consumers),
                "finished": sum(c.killed is None and c.rc == 0 for c in soak_c),
                "paused": self.counts["paused"],
                "paused_longer_than_stall_timeout": sum(p > STALL_TIMEOUT_S for p in pauses),
                "killed": self.counts["killed"],
                "killed_while_paused": sum(
                    1 for _, k, _, d in self.events if k == "kill" and d == "paused"
                ),
                "killed_at_end": sum(c.killed == "end" for c in soak_c),
                "stuck": sum(c.killed == "stuck" for c in self.consumers),
                "batch_size_c_over_2": sum(c.batch == self.capacity // 2 for c in soak_c),
                "hold_previous": sum(c.hold_previous for c in soak_c),
            },
            "rejoins": {
                "total": sum(int(s.get("rejoins", 0)) for s in summaries),
                "consumer_logs": sum(outcomes[c.n].rejoins_logged for c in self.consumers),
                "producer_log": count("consumer rejoined"),
                "producer_let_go": count("consumer let go"),
                "producer_held_back_lines": count("the feed is held back"),
                "overwritten_batches": sum(int(s.get("overwritten_batches", 0)) for s in summaries),
            },
            "epochs": {"completed": completed, "exact": exact, "bad_samples": bad},
            "producer": {
                "idle_start": is_,
                "start": pick(start),
                "end": pick(end),
                "idle_end": ie,
                "max": mx,
                "rss_slope_kib_per_min": slope,
                "joined": count("consumer joined"),
                "left": count("consumer left"),
                "detached": count("consumer detached"),
                "refused": count("refused a connection"),
                "stop": self.stop,
            },
            "verdict": verdict,
            "anomalies": self.anomalies,
        }

    def write_outputs(self) -> dict:
        summary = self.summarize()
        with open(self.out / "samples.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
            w.writeheader()
            w.writerows(self.samples)
        with open(self.out / "events.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(("t_s", "event", "consumer", "detail"))
            w.writerows(self.events)
        with open(self.out / "consumers.csv", "w", newline="") as f:
            rows = [c.describe() for c in self.consumers]
            if rows:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
        if hasattr(self, "serve_log"):
            (self.out / "serve.tail.txt").write_text("\n".join(tail(self.serve_log, 200)) + "\n")
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary


# ---------------------------------------------------------------------------------------------
# The plot
# ---------------------------------------------------------------------------------------------


def plot(out: Path) -> Path | None:
    """Writes ``out/plot.png`` from samples.csv, events.csv and summary.json; None without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    with open(out / "samples.csv") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None
    events = []
    if (out / "events.csv").exists():
        with open(out / "events.csv") as f:
            events = list(csv.DictReader(f))
    summary = {}
    if (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
    t = [float(r["t_s"]) for r in rows]
    col = lambda k: [float(r[k]) for r in rows]  # noqa: E731
    cpu = col("cpu_s")
    cpu_pct = [0.0] + [
        100 * (cpu[i] - cpu[i - 1]) / max(1e-9, t[i] - t[i - 1]) for i in range(1, len(t))
    ]
    fig, axes = plt.subplots(5, 1, figsize=(11, 11), sharex=True)
    axes[0].plot(t, col("fds"), color="tab:blue")
    axes[0].set_ylabel("open fds")
    axes[1].plot(t, col("threads"), color="tab:orange")
    axes[1].set_ylabel("threads")
    axes[2].plot(t, [v / 1024 for v in col("rss_kib")], color="tab:green")
    axes[2].set_ylabel("RSS (MiB)")
    axes[3].plot(t, cpu_pct, color="tab:gray", linewidth=0.7)
    axes[3].set_ylabel("CPU (%)")
    axes[4].step(t, col("live_consumers"), where="post", label="live", color="tab:purple")
    axes[4].step(t, col("paused_consumers"), where="post", label="paused (SIGSTOP)",
                 color="tab:red")
    kills = [float(e["t_s"]) for e in events if e["event"] == "kill"]
    starts = [float(e["t_s"]) for e in events if e["event"] == "start"]
    axes[4].plot(kills, [-0.4] * len(kills), "x", color="black", markersize=4, label="SIGKILL")
    axes[4].plot(starts, [-0.8] * len(starts), "|", color="tab:blue", markersize=5,
                 label="join")
    axes[4].set_ylabel("consumers")
    axes[4].legend(loc="upper right", fontsize=8, ncol=4)
    axes[4].set_xlabel("seconds since the producer was ready")
    for ax in axes:
        ax.grid(alpha=0.3)
        end = summary.get("soak_seconds")
        if end:
            ax.axvline(end, color="black", linestyle="--", linewidth=0.8)
        ax.axvline(WARMUP_S, color="gray", linestyle=":", linewidth=0.8)
    if summary:
        c, e, r = summary["consumers"], summary["epochs"], summary["rejoins"]
        v = summary["verdict"]
        fig.suptitle(
            f"ladle serve soak, {summary['minutes']} min: {c['started']} consumers, "
            f"{c['paused']} pauses, {c['killed']} kills, {r['total']} rejoins; "
            f"{e['exact']}/{e['completed']} epochs exact; "
            f"verdict {'ok' if v.get('ok') else 'NOT ok'}",
            fontsize=10,
        )
    fig.tight_layout()
    path = out / "plot.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ladle", default=str(REPO / "target" / "release" / "ladle"),
                   help="the ladle binary (default: target/release/ladle); a copy is run")
    p.add_argument("--minutes", type=float, default=10.0, help="soak length (default 10)")
    p.add_argument("--out", default=None, help="output directory (dataset, logs, results)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: from time)")
    p.add_argument("--min-consumers", type=int, default=3)
    p.add_argument("--max-consumers", type=int, default=6)
    p.add_argument("--stuck-after", type=float, default=60.0,
                   help="seconds without output from a running consumer before it is "
                   "reported stuck (default 60)")
    p.add_argument("--plot-only", metavar="DIR",
                   help="only (re)draw DIR/plot.png from a finished soak's files")
    args = p.parse_args()
    if args.plot_only:
        path = plot(Path(args.plot_only))
        if path is None:
            print("error: matplotlib is not importable, or samples.csv is empty", file=sys.stderr)
            return 2
        print(path)
        return 0
    if args.out is None:
        p.error("--out DIR is required")
    if not 1 <= args.min_consumers <= args.max_consumers:
        p.error("need 1 <= --min-consumers <= --max-consumers")
    if args.minutes <= 0:
        p.error("--minutes must be positive")
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little")

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started ignoring it
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    soak = Soak(args)
    status = 0
    try:
        soak.run()
    except (KeyboardInterrupt, Interrupted) as e:
        soak.interrupted = True
        soak.log(f"interrupted ({type(e).__name__} {e}); stopping every child")
        status = 130
    except SoakError as e:
        soak.anomalies.append(f"soak error: {e}")
        print(f"error: {e}", file=sys.stderr)
        status = 2
    finally:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)  # cleanup is bounded; let it finish
        soak.cleanup()
    if soak.producer is None:
        return status or 2  # nothing ran; the error above says why
    summary = soak.write_outputs()
    png = plot(soak.out)
    print(json.dumps({k: summary[k] for k in ("consumers", "rejoins", "epochs", "verdict")},
                     indent=2))
    if summary["anomalies"]:
        print(f"{len(summary['anomalies'])} anomalies:")
        for a in summary["anomalies"][:30]:
            print(f"  - {a}")
    print(f"results in {soak.out}: summary.json, samples.csv, events.csv, consumers.csv, "
          f"serve.log, serve.tail.txt" + (", plot.png" if png else
                                          " (no plot: matplotlib is not importable here; "
                                          f"run --plot-only {soak.out} with one that has it)"))
    if status:
        return status
    return 0 if summary["verdict"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
