"""Samples/s of the Python producer on a dataset whose ``__getitem__`` costs next to nothing, so
that the producer's own per-sample path (the request, the worker's copy, the answer, and since
issue 26 the producer's copy from the worker's staging buffer into the sealed ring) is what is
measured.

    PYTHONPATH=benches/python python benches/python/producer_staging.py --seconds 15

The dataset returns one of 16 prebuilt ``uint8[224, 224, 3]`` images (150 KiB) and a label;
``--workers`` worker processes, one consumer in this process reading batches of 64. Before
timing, the first batch is checked against the dataset (the copies are real). Prints one JSON
line: ``{"samples_per_s", "samples", "seconds", "shape", "workers"}``. Which build runs is
whichever ``ladle`` is first on ``PYTHONPATH``: run two builds alternately and compare the
ratio (benches/README.md, "The Python producer: the cost of the sealed ring").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np


class Frames:
    """``{"image": uint8[H, W, 3], "label": i64}``: image ``i % 16`` of 16 prebuilt ones."""

    def __init__(self, n: int, shape: tuple[int, ...]) -> None:
        self.n = n
        self.shape = shape
        self.images = [np.full(shape, k * 13 % 251, np.uint8) for k in range(16)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"image": self.images[i % 16], "label": i}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--size", type=int, default=224, help="images are SIZE x SIZE x 3")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    import ladle

    shape = (args.size, args.size, 3)
    dataset = Frames(8192, shape)
    sock = os.path.join(tempfile.mkdtemp(prefix="ladle-bench-"), "feed.sock")
    with ladle.Producer(dataset, sock, workers=args.workers, ring_mib=256):
        consumer = ladle.Consumer(sock, batch_size=args.batch_size)
        epoch = iter(consumer)

        def take() -> int:
            nonlocal epoch
            try:
                batch = next(epoch)
            except StopIteration:
                epoch = iter(consumer)
                batch = next(epoch)
            return len(batch)

        first = next(epoch)
        images, indices = np.asarray(first["image"]), np.asarray(first.indices)
        for k, i in enumerate(indices):
            np.testing.assert_array_equal(images[k], dataset[int(i)]["image"])
        del first, images, indices  # a view held keeps its batch, and the ring, held
        end = time.monotonic() + args.warmup
        while time.monotonic() < end:
            take()
        samples, start = 0, time.monotonic()
        end = start + args.seconds
        while time.monotonic() < end:
            samples += take()
        seconds = time.monotonic() - start
        del epoch, consumer
    print(
        json.dumps(
            {
                "samples_per_s": round(samples / seconds, 1),
                "samples": samples,
                "seconds": round(seconds, 2),
                "shape": list(shape),
                "workers": args.workers,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
