"""Feeds by name: :func:`feed`, a driver's handle that starts (or finds) the node's feed of a
dataset and owns it, and :func:`feed_stats`, a feed's figures as a dict.

A training process joins a feed by naming its data, ``ladle.Consumer(dataset=PATH, ...)``;
a driver that wants the feed up before its trials start, and its figures after they end,
opens it with ``with ladle.feed(PATH, ...) as feed:``. Inside, ``feed`` is a plain path to the
feed's socket (``os.fspath(feed)``; it pickles as one, so it travels through joblib, Ray and
multiprocessing): ``ladle.Consumer(feed, batch_size=64)`` joins it, ``feed.stats()`` reads it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from . import _native


class Feed(os.PathLike):
    """The node's feed of one dataset, transform and seed (see :func:`feed`)."""

    def __init__(
        self,
        dataset: str | os.PathLike[str],
        *,
        image_size: int = 224,
        transform: str | None = None,
        eval: bool = False,
        seed: int = 0,
        idle_timeout: float = 30.0,
        orphan_timeout: float = 60.0,
        ring_mib: int | None = None,
        threads: int | None = None,
    ) -> None:
        self._ask = dict(
            image_size=image_size,
            transform=transform,
            eval=eval,
            seed=seed,
            idle_timeout=idle_timeout,
            orphan_timeout=orphan_timeout,
            ring_mib=ring_mib,
            threads=threads,
        )
        self._dataset = os.fspath(dataset)
        self._handle: Any = None
        self.entry: dict[str, Any] | None = None

    @classmethod
    def _attach(cls, entry: dict[str, Any]) -> "Feed":
        """A handle to a feed someone else owns (an unpickled copy): it neither holds nor
        stops the feed."""
        feed = cls.__new__(cls)
        feed._ask = {}
        feed._dataset = entry["request"]["dataset"]
        feed._handle = None
        feed.entry = entry
        return feed

    def open(self) -> "Feed":
        """Finds the feed or starts it, and holds it until :meth:`close`."""
        if self._handle is None and self.entry is None:
            self._handle = _native.open_feed(self._dataset, **self._ask)
            self.entry = json.loads(self._handle.entry)
        return self

    def close(self) -> None:
        """Lets go of the feed; stops it if this handle started it (its consumers are told
        the stream ended). An attached copy does nothing."""
        handle, self._handle = self._handle, None
        if handle is not None:
            if handle.started:
                handle.stop()
            handle.release()

    def __enter__(self) -> "Feed":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def socket(self) -> Path:
        """The feed's control socket."""
        if self.entry is None:
            raise RuntimeError("the feed is not open: use `with ladle.feed(...) as feed:`")
        return Path(self.entry["socket"])

    @property
    def started(self) -> bool:
        """Whether this handle started the feed (and so stops it when closed)."""
        return self._handle is not None and self._handle.started

    def __fspath__(self) -> str:
        return str(self.socket)

    def __reduce__(self):
        # A copy in another process is a plain reference to the same feed: it does not hold
        # or stop it (the owner does).
        if self.entry is None:
            raise TypeError("only an open feed can be pickled")
        return (Feed._attach, (self.entry,))

    def stats(self) -> dict[str, Any]:
        """The feed's figures (:func:`feed_stats`)."""
        return feed_stats(self)

    def consumer(self, batch_size: int = 32, **kwargs: Any):
        """A :class:`ladle.Consumer` of this feed."""
        from . import Consumer

        return Consumer(self.socket, batch_size, **kwargs)

    def __repr__(self) -> str:
        where = self.entry["socket"] if self.entry else "not open"
        return f"ladle.Feed({self._dataset!r}, {where})"


def feed(
    dataset: str | os.PathLike[str],
    *,
    image_size: int = 224,
    transform: str | None = None,
    eval: bool = False,
    seed: int = 0,
    idle_timeout: float = 30.0,
    orphan_timeout: float = 60.0,
    ring_mib: int | None = None,
    threads: int | None = None,
) -> Feed:
    """The node's feed of ``dataset`` with this transform and seed, for a driver that owns it::

        with ladle.feed("data/cifar10", image_size=32, seed=0) as feed:
            study.optimize(objective, n_trials=20, n_jobs=4)   # trials: ladle.Consumer(feed, 64)
            print(feed.stats()["published"], feed.stats()["consumed"])

    Entering finds the live feed of that identity or starts it, and holds it (it does not
    stop while held, whatever its idle timeout); leaving lets go, and stops it if this call
    started it. The handle pickles as a reference to the feed, so trials in other processes
    get it as an argument; a trial may instead name the data itself with
    ``ladle.Consumer(dataset=..., same identity)``.
    """
    return Feed(
        dataset,
        image_size=image_size,
        transform=transform,
        eval=eval,
        seed=seed,
        idle_timeout=idle_timeout,
        orphan_timeout=orphan_timeout,
        ring_mib=ring_mib,
        threads=threads,
    )


def feed_stats(
    feed: Feed | str | os.PathLike[str] | None = None,
    *,
    dataset: str | os.PathLike[str] | None = None,
    image_size: int = 224,
    transform: str | None = None,
    eval: bool = False,
    seed: int = 0,
    timeout: float = 10.0,
) -> dict[str, Any]:
    """The figures of a feed, as a dict: its ``Stats`` answer (``published``, samples decoded;
    ``consumed``, samples every consumer read, the gone ones included; ``joins``, ``leaves``,
    ``let_gos``, ``skims``, ``decode_cpu_s``, and ``consumers``, one dict per live consumer).
    ``consumed / published`` is what sharing saved.

    The feed is ``feed`` (a :class:`Feed` or a socket path), or the live feed of ``dataset``
    with this identity (LookupError if none runs: this never starts one), or
    ``$LADLE_SOCKET``'s.
    """
    if feed is None and dataset is not None:
        entry = json.loads(
            _native.find_feed(
                os.fspath(dataset), image_size=image_size, transform=transform, eval=eval,
                seed=seed,
            )
        )
        feed = entry["socket"]
    if feed is None:
        feed = os.environ.get("LADLE_SOCKET") or None
    if feed is None:
        raise LookupError("which feed? give a feed, a socket, or dataset=...")
    return json.loads(_native.feed_stats(os.fspath(feed), timeout))
