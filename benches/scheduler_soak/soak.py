#!/usr/bin/env python3
"""Scheduler soak (issue 26): many short jobs through one ``ladle scheduler``, killed with
SIGKILL and restarted every ``--every`` submissions.

The daemon runs on simulated GPUs (``--gpu sim --sim-gpus G --mps off --policy exclusive``)
with a short tick (``--tick-ms``) and no settle time (``--settle-s 0``). Each job is
``sh -c 'echo $LADLE_JOB_ID >> LEDGER'``: as short as ``true``, plus one line that proves it
ran, and how often. The script speaks the scheduler's protocol on its socket itself (one
JSON line per connection), keeping at most ``--window`` jobs submitted and not yet run.

At each checkpoint (every ``--every`` submissions) it records, just before the
``kill -9``: the daemon's RSS, the journal's size and lines, and the size of the ``queue``
answer; then it restarts the daemon on the same directory and records the start-up time
(spawn to the first answered ``queue``), the RSS and the journal's size after start-up.
At the end it waits for every job to have run and asserts that each id ran exactly once
(none lost, none run twice).

Outputs in ``--out``: ``checkpoints.csv``, ``summary.json``, ``scheduler-N.log`` (the
daemon's stderr, one per start) and ``plot.png`` when matplotlib is importable (otherwise
``--plot-only DIR`` later, with a Python that has it). Usage, from the repository root::

    cargo build --release -p ladle
    python3 benches/scheduler_soak/soak.py --jobs 100000 --every 10000 --out /tmp/sched-soak

Exit status 0 when no job was lost or run twice, 1 otherwise, 2 when it could not run.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

def request(sock_path: Path, body: dict, version: int, timeout: float = 60.0) -> bytes:
    """One request, one answer line (raw bytes)."""
    frame = dict(body)
    frame["v"] = version
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock_path))
        s.sendall(json.dumps(frame).encode() + b"\n")
        chunks = []
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            if chunk.endswith(b"\n"):
                break
    return b"".join(chunks)


def protocol_version(sock_path: Path) -> int:
    """The daemon's protocol version, read from its refusal of version 0."""
    answer = json.loads(request(sock_path, {"op": "queue"}, 0))
    message = answer.get("message", "")
    # "protocol version 0, expected N ..."
    parts = message.split("expected ")
    if len(parts) < 2:
        raise SystemExit(f"cannot read the protocol version from {answer!r}")
    return int(parts[1].split()[0].strip(",)"))


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def journal_stats(path: Path) -> tuple[int, int]:
    try:
        data = path.read_bytes()
    except OSError:
        return 0, 0
    return len(data), data.count(b"\n")


def ledger_count(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except OSError:
        return 0


class Daemon:
    def __init__(self, args, state: Path, out: Path):
        self.args = args
        self.state = state
        self.out = out
        self.sock = state / "scheduler.sock"
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.version = 0

    def start(self) -> float:
        """Starts the daemon; returns seconds from spawn to the first answered queue."""
        a = self.args
        cmd = [
            str(a.ladle_copy), "scheduler", "--dir", str(self.state),
            "--gpu", "sim", "--sim-gpus", str(a.gpus), "--mps", "off",
            "--policy", "exclusive", "--settle-s", "0", "--tick-ms", str(a.tick_ms),
            "--keep-finished", str(a.keep_finished), "--keep-logs", str(a.keep_logs),
        ]
        self.starts += 1
        log = open(self.out / f"scheduler-{self.starts}.log", "wb")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
        deadline = t0 + 600
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"the scheduler exited: see {log.name}")
            try:
                if not self.version:
                    self.version = protocol_version(self.sock)
                answer = json.loads(request(self.sock, {"op": "queue"}, self.version))
                if answer.get("status") == "queue":
                    return time.monotonic() - t0
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the scheduler did not come up in 600 s")
            time.sleep(0.005)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def plot(out: Path) -> Path | None:
    """Writes ``out/plot.png`` from ``checkpoints.csv`` (start-up time, RSS, journal size and
    the ``queue`` answer's size against jobs submitted); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    with open(out / "checkpoints.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["submitted"] != "0"]
    before = [r for r in rows if r["phase"] == "before kill -9"]
    after = [r for r in rows if r["phase"] == "after restart"]
    x_b = [int(r["submitted"]) / 1000 for r in before]
    x_a = [int(r["submitted"]) / 1000 for r in after]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    panels = [
        ("start-up after kill -9, s", [(x_a, [float(r["startup_s"]) for r in after], "after restart")]),
        ("daemon RSS, MiB", [(x_b, [int(r["rss_kib"]) / 1024 for r in before], "before kill -9"),
                             (x_a, [int(r["rss_kib"]) / 1024 for r in after], "after restart")]),
        ("journal, KiB", [(x_b, [int(r["journal_bytes"]) / 1024 for r in before], "before kill -9"),
                          (x_a, [int(r["journal_bytes"]) / 1024 for r in after], "after restart")]),
        ("queue answer, KiB", [(x_b, [int(r["queue_answer_bytes"]) / 1024 for r in before], "before kill -9"),
                               (x_a, [int(r["queue_answer_bytes"]) / 1024 for r in after], "after restart")]),
    ]
    for ax, (title, series) in zip(axes, panels):
        for xs, ys, label in series:
            ax.plot(xs, ys, marker="o", label=label)
        ax.set_title(title)
        ax.set_xlabel("jobs submitted (thousands)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    summary = json.loads((out / "summary.json").read_text())
    fig.suptitle(f"ladle scheduler soak: {summary['jobs']} jobs, kill -9 every {summary['every']}, "
                 f"{summary['lost_count']} lost, {summary['run_twice_count']} run twice")
    fig.tight_layout()
    fig.savefig(out / "plot.png", dpi=100)
    return out / "plot.png"


def main() -> int:
    if sys.argv[1:2] == ["--plot-only"] and len(sys.argv) == 3:
        made = plot(Path(sys.argv[2]))
        print(made or "matplotlib is not importable here", file=sys.stderr)
        return 0 if made else 2
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ladle", default="target/release/ladle")
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--every", type=int, default=10_000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--tick-ms", type=int, default=10)
    p.add_argument("--window", type=int, default=2000)
    p.add_argument("--keep-finished", type=int, default=1000)
    p.add_argument("--keep-logs", type=int, default=1000)
    p.add_argument("--out", default="/tmp/ladle-scheduler-soak")
    args = p.parse_args()

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    args.ladle_copy = out / "ladle-soak"
    shutil.copy2(args.ladle, args.ladle_copy)
    state = out / "state"
    ledger = out / "ledger"
    journal = state / "journal.jsonl"
    daemon = Daemon(args, state, out)
    rows = []
    t_start = time.monotonic()
    try:
        startup = daemon.start()
        rows.append({"submitted": 0, "phase": "start", "startup_s": round(startup, 4),
                     "rss_kib": rss_kib(daemon.proc.pid),
                     "journal_bytes": journal_stats(journal)[0],
                     "journal_lines": journal_stats(journal)[1],
                     "queue_answer_bytes": "", "ran": 0})
        spec = {
            "op": "submit",
            "command": ["sh", "-c", f"echo $LADLE_JOB_ID >> {ledger}"],
            "cwd": "/", "gpu_mem_mib": 1024, "gpus": 1, "feed": None,
            "thread_percentage": None,
        }
        submitted = 0
        ran = 0
        while submitted < args.jobs:
            if submitted - ran >= args.window:
                ran = ledger_count(ledger)
                if submitted - ran >= args.window:
                    time.sleep(0.02)
                    continue
            answer = json.loads(request(daemon.sock, spec, daemon.version))
            if answer.get("status") != "submitted":
                raise SystemExit(f"submit {submitted + 1} refused: {answer}")
            submitted += 1
            if answer["id"] != submitted:
                raise SystemExit(f"submit {submitted} got id {answer['id']}")
            if submitted % args.every == 0:
                ran = ledger_count(ledger)
                q = request(daemon.sock, {"op": "queue"}, daemon.version)
                jb, jl = journal_stats(journal)
                before = {"submitted": submitted, "phase": "before kill -9", "startup_s": "",
                          "rss_kib": rss_kib(daemon.proc.pid), "journal_bytes": jb,
                          "journal_lines": jl, "queue_answer_bytes": len(q), "ran": ran}
                daemon.kill9()
                startup = daemon.start()
                jb, jl = journal_stats(journal)
                after = {"submitted": submitted, "phase": "after restart",
                         "startup_s": round(startup, 4), "rss_kib": rss_kib(daemon.proc.pid),
                         "journal_bytes": jb, "journal_lines": jl,
                         "queue_answer_bytes": len(request(daemon.sock, {"op": "queue"},
                                                           daemon.version)),
                         "ran": ledger_count(ledger)}
                rows += [before, after]
                print(json.dumps(before), json.dumps(after), sep="\n", flush=True)
        # Every job must run; progress is what the ledger says.
        last, last_change = -1, time.monotonic()
        while True:
            ran = ledger_count(ledger)
            if ran >= submitted:
                break
            if ran != last:
                last, last_change = ran, time.monotonic()
            elif time.monotonic() - last_change > 120:
                break  # stuck: the check below says what is missing
            time.sleep(0.05)
    finally:
        daemon.stop()
    elapsed = time.monotonic() - t_start
    counts: dict[int, int] = {}
    for line in ledger.read_text().split():
        counts[int(line)] = counts.get(int(line), 0) + 1
    lost = [i for i in range(1, submitted + 1) if i not in counts]
    twice = sorted(i for i, n in counts.items() if n > 1)
    extra = sorted(i for i in counts if not 1 <= i <= submitted)
    with open(out / "checkpoints.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    summary = {
        "jobs": submitted, "every": args.every, "gpus": args.gpus, "tick_ms": args.tick_ms,
        "settle_s": 0, "keep_finished": args.keep_finished, "elapsed_s": round(elapsed, 1),
        "jobs_per_s": round(submitted / elapsed, 1), "restarts": daemon.starts - 1,
        "lost": lost[:20], "lost_count": len(lost), "run_twice": twice[:20],
        "run_twice_count": len(twice), "unknown_ids": extra[:20],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"{'submitted':>9} {'phase':<15} {'startup s':>9} {'RSS MiB':>8} "
          f"{'journal KiB':>11} {'lines':>6} {'queue KiB':>9}")
    for r in rows:
        print(f"{r['submitted']:>9} {r['phase']:<15} {str(r['startup_s']):>9} "
              f"{r['rss_kib'] / 1024:>8.1f} {r['journal_bytes'] / 1024:>11.1f} "
              f"{r['journal_lines']:>6} "
              f"{(r['queue_answer_bytes'] / 1024 if r['queue_answer_bytes'] != '' else 0):>9.1f}")
    made = plot(out)
    print(f"plot: {made}" if made else "plot: matplotlib is not importable; run --plot-only "
          f"{out} with a Python that has it")
    return 0 if not lost and not twice and not extra else 1


if __name__ == "__main__":
    sys.exit(main())
