#!/usr/bin/env python3
"""What a rank of a consumer group and a resumed consumer cost a Python training loop per
batch, against a plain consumer of the same feed, side by side in one run (the Python side of
``cargo bench -p ladle-benches --bench group_cost``).

One ``ladle serve`` (224×224 RandomResizedCrop + flip of an ImageFolder, 2 threads); for each
batch size, in turn: a plain ``ladle.Consumer``; rank 0 of a group of 2 (rank 1 reads beside
it in another thread); a consumer that loaded a state with half of its epoch delivered. The
first two take ``--batches`` batches after a lap of the ring (a consumer's first lap pays a
page fault per 4 KiB it touches, its steady state does not); the resumed one the batches of
its resumed epoch, on its first lap. Reported is the calling thread's CPU time per batch
(``time.thread_time`` around ``next()`` and the release: the gather copy runs on this
thread, waits for the producer cost no CPU), median over the batches.

Usage (after ``pip install ./python`` and ``cargo build --release -p ladle``)::

    python benches/python/group_cost.py --dataset /tmp/gen1000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import ladle

REPO = Path(__file__).resolve().parents[2]


def warm(consumer: ladle.Consumer, it, sequences: int):
    """Reads until ``sequences`` sequences of the ring went by, touching every batch, so that
    this consumer's mapping of the ring has its pages (a first touch costs a page fault per
    4 KiB: the cost of a consumer's first lap, not of its steady state)."""
    gone = 0
    while gone < sequences:
        try:
            batch = next(it)
        except StopIteration:
            it = iter(consumer)
            continue
        with memoryview(batch.images) as images:
            images.tobytes()
        gone += len(batch) * (consumer.world_size or 1)
        del batch
    return it


def take(consumer: ladle.Consumer, batches: int) -> float:
    """Median µs of thread CPU per batch over ``batches`` batches, after a lap of the ring."""
    cpu = []
    _, region = consumer._images_region()
    h, w, c = consumer.image_shape
    it = warm(consumer, iter(consumer), region // (h * w * c))
    while len(cpu) < batches:
        start = time.thread_time()
        try:
            batch = next(it)
        except StopIteration:
            it = iter(consumer)
            continue
        del batch
        cpu.append(time.thread_time() - start)
    return statistics.median(cpu) * 1e6


def plain(sock: str, b: int, n: int) -> float:
    return take(ladle.Consumer(sock, b), n)


def rank(sock: str, b: int, n: int, name: str) -> float:
    done = threading.Event()

    def other() -> None:
        c = ladle.Consumer(sock, b, group=name, rank=1, world_size=2)
        it = iter(c)
        while not done.is_set():
            try:
                next(it)
            except StopIteration:
                it = iter(c)
            except ladle.LadleError:
                return

    t = threading.Thread(target=other)
    t.start()
    c = ladle.Consumer(sock, b, group=name, rank=0, world_size=2)
    cost = take(c, n)
    done.set()
    t.join()
    return cost


def resumed(sock: str, b: int, half: bytes) -> float:
    """Median µs per batch over the resumed epoch's batches (half an epoch), on a fresh
    mapping of the ring: its first lap, page faults included."""
    c = ladle.Consumer(sock, b, state=pickle.loads(half))
    cpu = []
    it = iter(c)
    while True:
        start = time.thread_time()
        try:
            batch = next(it)
        except StopIteration:
            break
        del batch
        cpu.append(time.thread_time() - start)
    return statistics.median(cpu) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, help="an ImageFolder directory")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--ladle", default=str(REPO / "target" / "release" / "ladle"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "feed.sock")
        serve = subprocess.Popen([args.ladle, "serve", "--dataset", args.dataset, "--socket", sock,
                                  "--threads", "2"], stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(sock):
                assert time.monotonic() < deadline, "ladle serve did not come up"
                time.sleep(0.05)
            # A state with every other batch of the first epoch delivered: half the epoch.
            c = ladle.Consumer(sock, 2)
            it = iter(c)
            for _ in range(len(c) // 2):
                next(it)
            half = pickle.dumps(c.state_dict())
            del it, c
            print(f"{'round':>5} {'batch':>5} {'plain':>10} {'rank 0 of 2':>12} {'resumed':>10}"
                  "   (thread CPU µs per batch, medians)")
            for r in range(args.rounds):
                for b in (32, 64, 128):
                    p = plain(sock, b, args.batches)
                    k = rank(sock, b, args.batches, f"bench-{r}-{b}")
                    s = resumed(sock, b, half)
                    print(f"{r:>5} {b:>5} {p:>10.1f} {k:>12.1f} {s:>10.1f}"
                          f"   rank/plain {k / p:.0f}x, resumed/plain {s / p:.0f}x")
        finally:
            serve.terminate()
            serve.wait()


if __name__ == "__main__":
    main()
