#!/usr/bin/env python3
"""What reading a batch costs a Python training loop, when the batch is already there.

Starts ``ladle serve`` on the embedded demo dataset (224×224 crops, a 1 GiB ring), lets the
producer fill the ring, then times batches of 256 that are already published: ``next()``
alone, ``next()`` plus ``numpy.asarray`` of images and labels, and ``next()`` plus
``torch.from_dlpack`` of both (skipped without torch). Rounds alternate with refills, so no
timed call waits for the producer; a call that found its batch unpublished would show as an
outlier and is excluded by taking the median. The payload is 256 × 224 × 224 × 3 = 38.5 MB
per batch: a copy of it alone would take milliseconds, so microseconds prove zero copy.

    cargo build --release -p ladle
    python benches/python/consumer_overhead.py [--batch-size 256] [--rounds 7]

``--feed fields`` measures a multi-field feed instead, served by the Python producer
(``ladle.Producer``) from an in-memory dataset of ``wave: f32[16000], length: i32,
label: i64, mask: bool[3]`` samples (64 KB each): every field is looked up by name
(``batch["wave"]``, ...) and viewed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import ladle

REPO = Path(__file__).resolve().parents[2]


class Clips:
    """Audio-like samples, cheap to make: the cost measured is the consumer's."""

    def __len__(self) -> int:
        return 20_000

    def __getitem__(self, i: int) -> dict:
        return {
            "wave": np.full(16000, i, np.float32),
            "length": np.int32(i % 16000),
            "label": i % 35,
            "mask": np.array([True, i % 2 == 0, False]),
        }


def serve_images(ladle_bin: Path, dataset: str, sock: Path):
    """``ladle serve`` of the demo images; returns a function that stops it."""
    serve = subprocess.Popen(
        [ladle_bin, "serve", "--dataset", dataset, "--socket", sock, "--ring-mib", "1024"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while not sock.exists():
        time.sleep(0.05)

    def stop() -> None:
        serve.terminate()
        serve.wait()

    return stop


def serve_fields(sock: Path):
    """The Python producer of :class:`Clips`; returns a function that stops it."""
    producer = ladle.Producer(Clips(), sock, workers=2, ring_mib=1024).start()
    return producer.stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dataset", default=str(Path.home() / ".cache/ladle/demo-imagefolder-v2-1000"))
    parser.add_argument("--feed", choices=["images", "fields"], default="images")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        torch = None
    ladle_bin = next(
        p for p in (REPO / "target/release/ladle", REPO / "target/debug/ladle") if p.exists()
    )
    with tempfile.TemporaryDirectory() as tmp:
        sock = Path(tmp) / "p.sock"
        if args.feed == "images":
            stop = serve_images(ladle_bin, args.dataset, sock)
        else:
            stop = serve_fields(sock)
        try:
            consumer = ladle.Consumer(sock, args.batch_size, max_batches_held=2)
            # 1536 samples: well inside the ring (about 6900 at 224², 16000 clips)
            capacity_batches = 6
            if args.feed == "images":
                modes = {
                    "next": lambda b: None,
                    "next+numpy": lambda b: (np.asarray(b.images), np.asarray(b.labels)),
                }
                if torch is not None:
                    modes["next+torch.from_dlpack"] = lambda b: (
                        torch.from_dlpack(b.images),
                        torch.from_dlpack(b.labels),
                    )
            else:
                names = ["wave", "length", "label", "mask"]
                modes = {
                    "next": lambda b: None,
                    "next+numpy (every field by name)": lambda b: [np.asarray(b[n]) for n in names],
                }
                if torch is not None:
                    modes["next+torch.from_dlpack (every field by name)"] = lambda b: [
                        torch.from_dlpack(b[n]) for n in names
                    ]
            times: dict[str, list[float]] = {m: [] for m in modes}
            epoch = iter(consumer)
            for _ in range(args.rounds):
                for mode, view in modes.items():
                    time.sleep(capacity_batches * args.batch_size / 600 + 1)  # refill
                    for _ in range(capacity_batches):
                        t0 = time.perf_counter_ns()
                        try:
                            batch = next(epoch)
                        except StopIteration:
                            epoch = iter(consumer)
                            batch = next(epoch)
                        views = view(batch)
                        t1 = time.perf_counter_ns()
                        times[mode].append((t1 - t0) / 1000)
                        del views, batch
            results = {
                mode: {
                    "median_us": statistics.median(ts),
                    "p10_us": float(np.percentile(ts, 10)),
                    "p90_us": float(np.percentile(ts, 90)),
                    "n": len(ts),
                }
                for mode, ts in times.items()
            }
            print(json.dumps({"batch_size": args.batch_size,
                              "schema": consumer.schema,
                              "results": results}, indent=2))
        finally:
            stop()


if __name__ == "__main__":
    main()
