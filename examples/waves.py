#!/usr/bin/env python3
"""Serve a dataset of your own from Python, and check what two consumers read.

The dataset is any object with ``__len__`` and ``__getitem__`` returning a dict of arrays:
here 2000 one-second clips, ``{"wave": float32[16000], "label": int64}``, made from the index
(in a real one, your ``torch.utils.data.Dataset`` with its own transforms). ``ladle.serve``
(here ``ladle.Producer``, its background form) runs ``__getitem__`` in worker processes that
write each sample straight into the shared ring; the schema comes from the first sample.

Two consumer processes, batch sizes 32 and 100, then read two epochs each and compare every
sample with the source: the script exits 0 only if each epoch held every index exactly once
and every field matched.

    pip install ./python
    python examples/waves.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import ladle

CLIPS = 2000


class Waves:
    """One-second 16 kHz clips: a tone whose pitch depends on the label, plus noise."""

    def __len__(self) -> int:
        return CLIPS

    def __getitem__(self, i: int) -> dict:
        rng = np.random.default_rng(i)
        label = i % 10
        t = np.arange(16000, dtype=np.float32) / 16000
        wave = np.sin(2 * np.pi * (220 + 40 * label) * t) + 0.1 * rng.standard_normal(16000)
        return {"wave": wave.astype(np.float32), "label": label}


def consume(socket: str, batch_size: int) -> None:
    """A consumer process: two epochs, every sample checked against the source."""
    consumer = ladle.Consumer(socket, batch_size=batch_size)
    source = Waves()
    for epoch in range(2):
        seen = []
        for batch in consumer:
            waves, labels = np.asarray(batch["wave"]), np.asarray(batch["label"])
            for k, i in enumerate(np.asarray(batch.indices).tolist()):
                expected = source[i]
                if not (np.array_equal(waves[k], expected["wave"]) and labels[k] == expected["label"]):
                    sys.exit(f"batch {batch_size}: sample {i} differs from the source")
            seen.extend(np.asarray(batch.indices).tolist())
        exact = sorted(seen) == list(range(CLIPS))
        print(f"consumer batch {batch_size:>3}, epoch {epoch}: {len(seen)} samples, "
              f"every index once: {exact}, contents match the source: True")
        if not exact:
            sys.exit(1)


def main() -> int:
    if len(sys.argv) == 3:  # a consumer process
        consume(sys.argv[1], int(sys.argv[2]))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        socket = str(Path(tmp) / "waves.sock")
        with ladle.Producer(Waves(), socket, workers=2, ring_mib=128) as producer:
            print(f"schema: {producer.schema}")
            consumers = [
                subprocess.Popen([sys.executable, __file__, socket, str(b)]) for b in (32, 100)
            ]
            codes = [c.wait() for c in consumers]
            stats = producer.stats()
        print(f"producer: {stats['published']} samples written by worker processes, "
              f"{stats['bad_samples']} bad, {stats['consumed']} read by the consumers")
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
