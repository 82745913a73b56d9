"""Datasets for the Python producer's tests. They live in a module of their own so that the
producer's worker processes (started with ``spawn``) can import them."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

WAVE = 16000


class Waves:
    """``{"wave": float32[16000], "label": int64}``, the same for an index every time."""

    def __init__(self, n: int = 400) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        rng = np.random.default_rng(i)
        return {"wave": rng.standard_normal(WAVE, dtype=np.float32), "label": i % 10}


class Mixed:
    """One field of most dtypes, each a function of the index."""

    def __len__(self) -> int:
        return 300

    def __getitem__(self, i: int) -> dict:
        return {
            "image": np.full((8, 8, 3), i % 251, np.uint8),
            "label": np.int64(i),
            "half": np.arange(5, dtype=np.float16) + i,
            "mask": np.array([i % 2 == 0, True, False]),
            "length": np.int32(i * 3),
            "small": np.full((2, 3), -(i % 100), np.int8),
            "score": np.float64(i) / 7,
        }


class Raises(Waves):
    """Raises on index 7; its wave for index 5 has the wrong shape."""

    def __getitem__(self, i: int) -> dict:
        if i == 7:
            raise ValueError("corrupt record 7")
        sample = super().__getitem__(i)
        if i == 5:
            sample["wave"] = sample["wave"][:100]
        return sample


class FailsOnce(Waves):
    """The first worker to make ``index`` (of whichever epoch comes first) dies
    (``how="die"``: ``os._exit``) or hangs (``how="hang"``: a stuck read); the marker file
    makes the next one succeed."""

    def __init__(self, marker: str, index: int, how: str, n: int) -> None:
        super().__init__(n)
        self.marker, self.index, self.how = marker, index, how

    def __getitem__(self, i: int) -> dict:
        if i == self.index and not Path(self.marker).exists():
            Path(self.marker).touch()
            if self.how == "die":
                os._exit(3)
            import time

            time.sleep(3600)
        return super().__getitem__(i)


class Unloadable(Waves):
    """Pickles in the parent, cannot be loaded in a worker (as a class defined in an
    interactive session's ``__main__`` cannot)."""

    def __setstate__(self, state: dict) -> None:
        raise RuntimeError("this dataset cannot be loaded in another process")


class Unpicklable(Waves):
    """Cannot be pickled at all: it holds a lambda."""

    def __init__(self) -> None:
        super().__init__(50)
        self.transform = lambda x: x


WAVES_OBJECT = Waves(30)


def make_waves() -> Waves:
    """The factory ``python -m ladle serve pydatasets:make_waves`` calls."""
    return Waves(200)


class TorchSamples:
    """torch tensors as values: a bfloat16 field (no NumPy dtype), a float32 CHW tensor."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        import torch

        return {
            "x": torch.arange(4, dtype=torch.float32).to(torch.bfloat16) + i,
            "chw": torch.full((3, 2, 2), float(i)),
            "label": i,
        }


class StuckInWorkers(Waves):
    """In a worker process, ``__getitem__`` never returns (a read that hangs, and no
    ``timeout=``); it first creates ``$LADLE_TEST_STUCK_DIR/<pid>`` so that a test knows the
    worker is inside it. In the process that starts the feed (which infers the schema from
    ``dataset[0]``) it returns."""

    def __getitem__(self, i: int) -> dict:
        import multiprocessing
        import threading

        if multiprocessing.parent_process() is not None:
            Path(os.environ["LADLE_TEST_STUCK_DIR"], str(os.getpid())).touch()
            threading.Event().wait()
        return super().__getitem__(i)


def make_stuck() -> StuckInWorkers:
    """The factory ``python -m ladle serve pydatasets:make_stuck`` calls."""
    return StuckInWorkers(100)
