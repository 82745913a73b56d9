#!/usr/bin/env python3
"""Four consumers of different paces on one feed: does each keep its solo speed, and what CPU
does a sample consumed cost against private pipelines? (issue 28; standard library only.)

All in one invocation, side by side on the same machine:

1. **capacity**: one ``ladle serve`` and one ``ladle consume`` that takes batches as fast as
   they come: the feed's decode rate R.
2. **solo**: four consumers whose per-batch step (``consume --step-ms``) makes their rates
   about R/2, R/2, R/4 and R/8, each alone on its own feed: their solo rates.
3. **shared, skim** and **shared, lockstep**: the four together on one feed, with
   ``serve --pacing skim`` (the default) and ``--pacing lockstep`` (before protocol 9): each
   one's rate over its solo rate.
4. **private**: ``ladle bench private`` (one process decoding for itself, as a training job
   without ladle does): CPU-seconds per sample of a private pipeline.

CPU is ``getrusage(RUSAGE_CHILDREN)`` around each mode (producer and consumers, all reaped).
"CPU per sample consumed" of a shared mode is its CPU over the samples the four consumed;
four private pipelines would each pay the private figure per sample.

Usage (after ``cargo build --release -p ladle``)::

    python3 benches/python/pacing.py --dataset /tmp/photofolder --seconds 30 \
        --json benches/results/pacing.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket as socketlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARES = (0.5, 0.5, 0.25, 0.125)


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Feed:
    """A ``ladle serve`` on a fresh socket, stopped with SIGTERM and reaped on exit."""

    def __init__(self, args: argparse.Namespace, extra: list[str]) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="ladle-pacing-")
        self.socket = Path(self.dir.name) / "feed.sock"
        self.log = Path(self.dir.name) / "serve.log"
        cmd = [args.ladle, "serve", "--dataset", args.dataset, "--socket", self.socket,
               "--image-size", str(args.image_size), "--ring-mib", str(args.ring_mib), *extra]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                sys.exit(f"ladle serve exited:\n{self.log.read_text()}")
            try:
                with socketlib.socket(socketlib.AF_UNIX) as probe:
                    probe.connect(os.fspath(self.socket))
                return
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit(f"ladle serve never listened:\n{self.log.read_text()}")
                time.sleep(0.05)

    def consume(self, args: argparse.Namespace, name: str, step_ms: float) -> subprocess.Popen:
        return subprocess.Popen(
            [args.ladle, "consume", "--socket", self.socket, "--batch-size", str(args.batch),
             "--step-ms", f"{step_ms:.0f}", "--seconds", str(args.seconds), "--json",
             "--name", name],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stop(self) -> str:
        self.proc.terminate()
        self.proc.wait(timeout=60)
        text = self.log.read_text()
        self.dir.cleanup()
        return text


def summary(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        sys.exit(f"ladle consume failed:\n{err}")
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    for epoch in lines[:-1]:  # the last epoch may be cut short by --seconds
        if epoch.get("complete") and not epoch.get("exact_coverage"):
            sys.exit(f"an epoch was not exact: {epoch}")
    return lines[-1]


def run_feed(args: argparse.Namespace, serve_extra: list[str],
             consumers: list[tuple[str, float]]) -> tuple[list[dict], float, str]:
    """One feed and its consumers for ``--seconds``: their summaries, the CPU-seconds of all
    of them, and the producer's log."""
    cpu0 = cpu_children()
    feed = Feed(args, serve_extra)
    try:
        procs = [feed.consume(args, name, step) for name, step in consumers]
        results = [summary(p) for p in procs]
    finally:
        log = feed.stop()
    return results, cpu_children() - cpu0, log


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True)
    p.add_argument("--ladle", default=str(REPO / "target/release/ladle"))
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--ring-mib", type=int, default=16)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()

    print(f"capacity: one consumer taking batches as fast as they come ({args.seconds:.0f} s)")
    [cap], cap_cpu, _ = run_feed(args, [], [("capacity", 0)])
    rate = cap["samples_per_s"]
    print(f"  the feed decodes {rate:.0f} samples/s")

    consumers = []
    for k, share in enumerate(SHARES):
        step = 1000.0 * args.batch / (share * rate)
        consumers.append((f"c{k}-{share:g}", step))

    solo = []
    for name, step in consumers:
        [r], cpu, _ = run_feed(args, [], [(name, step)])
        solo.append(r["samples_per_s"])
        print(f"solo {name}: step {step:.0f} ms, {r['samples_per_s']:.0f} samples/s")

    shared = {}
    for pacing in ("skim", "lockstep"):
        results, cpu, log = run_feed(args, ["--pacing", pacing], consumers)
        consumed = sum(r["samples"] for r in results)
        shared[pacing] = {
            "rates": [r["samples_per_s"] for r in results],
            "ratios": [r["samples_per_s"] / s for r, s in zip(results, solo)],
            "skims": [r.get("skims", 0) for r in results],
            "consumed": consumed,
            "cpu_s": cpu,
            "cpu_per_sample": cpu / max(consumed, 1),
            "asked_to_skim": log.count("asking the consumer to skim"),
            "attached_again": log.count("stops skimming"),
        }
        ratios = ", ".join(f"{x:.2f}" for x in shared[pacing]["ratios"])
        print(f"shared, {pacing}: rate / solo = {ratios}; {consumed} consumed, "
              f"{cpu:.1f} CPU-s, {1e3 * cpu / max(consumed, 1):.3f} CPU-ms per sample")

    cpu0 = cpu_children()
    out = subprocess.run(
        [args.ladle, "bench", "private", "--dataset", args.dataset, "--image-size",
         str(args.image_size), "--batch-size", str(args.batch), "--seconds",
         str(args.seconds), "--json"],
        check=True, capture_output=True, text=True)
    private_cpu = cpu_children() - cpu0
    private = json.loads(out.stdout)
    private_per_sample = private_cpu / max(private["samples"], 1)
    print(f"private pipeline: {private['samples_per_s']:.0f} samples/s, "
          f"{1e3 * private_per_sample:.3f} CPU-ms per sample")
    for pacing, s in shared.items():
        s["cpu_vs_private"] = s["cpu_per_sample"] / private_per_sample
        print(f"  shared, {pacing}: CPU per sample consumed = "
              f"{s['cpu_vs_private']:.2f} x four private pipelines'")

    result = {
        "dataset": args.dataset,
        "image_size": args.image_size,
        "ring_mib": args.ring_mib,
        "batch": args.batch,
        "seconds": args.seconds,
        "capacity_samples_per_s": rate,
        "capacity_cpu_s": cap_cpu,
        "steps_ms": [step for _, step in consumers],
        "solo_samples_per_s": solo,
        "shared": shared,
        "private": {"samples_per_s": private["samples_per_s"], "cpu_s": private_cpu,
                    "cpu_per_sample": private_per_sample},
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
