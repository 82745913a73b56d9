"""The Python producer: serve any map-style dataset (the user's own ``torch.utils.data.Dataset``
and transforms, audio, tabular rows) as a ladle feed.

::

    import ladle

    class Waves:                                   # any object with __len__ and __getitem__
        def __len__(self): return 10_000
        def __getitem__(self, i): return {"wave": load(i), "label": i % 10}

    if __name__ == "__main__":                     # workers re-import this module (spawn)
        ladle.serve(Waves(), "/tmp/waves.sock", workers=2)

The feed is the same as ``ladle serve``'s (the Rust producer runs it): per-epoch
permutations, exact coverage for late joiners, consumers with their own batch sizes, pacing
and let-go of stalled consumers. ``workers`` processes run ``dataset[i]`` and write every
field straight into its slot of the shared ring (no pickling of samples, one copy: from the
returned array into shared memory). The schema comes from ``dataset[0]`` unless given.

A sample whose ``__getitem__`` raises, or whose fields do not fit the schema, is logged and
delivered as a bad sample (every field zero, counted in ``batch.bad_count``) with
``on_error="skip"`` (the default), or stops the feed with ``on_error="raise"``. A worker that
dies, or takes longer than ``timeout`` seconds on one sample (it is then killed), is logged
and replaced; the sample it was making is made again by another worker.
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import signal
import sys
import threading
import time
from typing import Any

from . import _schema, _worker
from ._native import LadleError, _Producer

__all__ = ["Producer", "serve"]

# A worker that exits this soon after starting, before making anything, counts towards
# giving up: a dataset that cannot even be unpickled in a worker would restart forever.
_STARTUP_FAILURES = 3

# Once the feed has stopped, how long an idle worker has to see its socket close and exit
# before it is killed.
_WORKER_GRACE = 1.0


class Producer:
    """A feed serving ``dataset`` on ``socket``, in the background: a context manager.

    Parameters: ``workers`` (processes running ``dataset[i]``; default: the cores),
    ``ring_mib`` (shared memory for the ring), ``seed`` (permutations and each sample's
    random seed), ``schema`` (``[(name, dtype, shape), ...]`` or ``{name: (dtype, shape)}``;
    default: inferred from ``dataset[0]``), ``on_error`` (``"skip"`` or ``"raise"``),
    ``stall_timeout`` (seconds a consumer may hold the feed back without taking a batch),
    ``keep_alive`` (stop once the last consumer has been gone this long), ``timeout``
    (seconds one ``dataset[i]`` may take: a worker that takes longer is killed and replaced,
    and the sample made again by another worker; default: no limit), ``name`` (the
    dataset's name in logs).
    """

    def __init__(
        self,
        dataset: Any,
        socket: str | os.PathLike[str],
        *,
        workers: int | None = None,
        ring_mib: int = 256,
        seed: int = 0,
        schema: Any = None,
        on_error: str = "skip",
        stall_timeout: float = 10.0,
        keep_alive: float | None = None,
        timeout: float | None = None,
        name: str | None = None,
    ) -> None:
        if on_error not in ("skip", "raise"):
            raise ValueError(f'on_error must be "skip" or "raise", not {on_error!r}')
        if workers is None:
            workers = len(os.sched_getaffinity(0))
        if not 1 <= int(workers) <= 1024:
            raise ValueError(f"workers must be 1..=1024, not {workers}")
        if not int(ring_mib) >= 1:
            raise ValueError(f"ring_mib must be at least 1, not {ring_mib}")
        self.dataset = dataset
        self.socket = os.fspath(socket)
        self.workers = int(workers)
        self.ring_mib = int(ring_mib)
        self.seed = int(seed)
        self.on_error = on_error
        self.stall_timeout = float(stall_timeout)
        self.keep_alive = keep_alive
        if timeout is not None and not float(timeout) > 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout}")
        self.timeout = timeout
        self.name = name or type(dataset).__name__
        self._given_schema = schema
        self.fields: list[_schema.Field] = []
        self._native: _Producer | None = None
        self._procs: list[multiprocessing.process.BaseProcess] = []
        self._monitor: threading.Thread | None = None
        self._done = threading.Event()
        self._failure: BaseException | None = None
        self.worker_restarts = 0

    # -- life ---------------------------------------------------------------------------
    def start(self) -> "Producer":
        """Infers the schema, starts the feed and the workers; returns at once."""
        length = len(self.dataset)
        if length == 0:
            raise ValueError(f"{self.name} is empty (len() is 0)")
        if self._given_schema is not None:
            self.fields = _schema.normalize(self._given_schema)
        else:
            self.fields = _schema.infer(self.dataset[0])
        text = _schema.to_text(self.fields)
        classes = getattr(self.dataset, "classes", None)
        class_names = [str(c) for c in classes] if isinstance(classes, (list, tuple)) else []
        self._native = _Producer(
            text,
            length,
            self.socket,
            class_names=class_names,
            source=self.name,
            workers=self.workers,
            ring_bytes=self.ring_mib << 20,
            seed=self.seed,
            stall_timeout=self.stall_timeout,
            skip_bad=self.on_error == "skip",
            keep_alive=self.keep_alive,
            token=secrets.token_hex(16),
            sample_timeout=None if self.timeout is None else float(self.timeout),
        )
        self._context = multiprocessing.get_context("spawn")
        try:
            # One spare, so that a dead worker's sample is made again at once.
            self._procs = [self._spawn() for _ in range(self.workers + 1)]
        except Exception as error:  # the dataset cannot be pickled for a worker, say
            self._abort()
            raise LadleError(
                f"cannot start worker processes for {self.name}: {type(error).__name__}: "
                f"{error} (the dataset is pickled once for each worker)"
            ) from error
        self._monitor = threading.Thread(target=self._watch, name="ladle-workers", daemon=True)
        self._monitor.start()
        print(
            f"ladle: serving {length} samples of {self.name} on {self.socket} "
            f"(`{text}`, {self.workers} workers, ring of {self._native.capacity} samples)",
            file=sys.stderr,
        )
        return self

    def _spawn(self) -> multiprocessing.process.BaseProcess:
        assert self._native is not None
        proc = self._context.Process(
            target=_worker.run,
            args=(self.dataset, str(self._native.worker_socket), self._native.token, self.fields, self.seed),
            name="ladle-worker",
            daemon=True,
        )
        proc.start()
        return proc

    def _watch(self) -> None:
        """Replaces dead workers until the feed stops; gives up when workers keep dying
        before any connects (a dataset that cannot be unpickled or imported in a worker)."""
        native = self._native
        assert native is not None
        early = 0
        while not native.stopped:
            time.sleep(0.2)
            for k, proc in enumerate(self._procs):
                if proc.is_alive() or native.stopped:
                    continue
                code = proc.exitcode
                proc.join()
                connected = native.stats()["workers_connected"]
                if connected == 0:
                    early += 1
                print(
                    f"ladle: worker process {proc.pid} exited (code {code}); starting another",
                    file=sys.stderr,
                )
                if early >= _STARTUP_FAILURES:
                    self._failure = LadleError(
                        f"{early} worker processes exited before any could serve {self.name}: "
                        "can the dataset be pickled, and its module imported, in a new process? "
                        "(run ladle.serve under `if __name__ == \"__main__\":`)"
                    )
                    native.stop()
                    break
                self.worker_restarts += 1
                self._procs[k] = self._spawn()
        self._done.set()

    def _abort(self) -> None:
        """Stops the feed and the workers started so far, without raising."""
        native, self._native = self._native, None
        if native is not None:
            native.stop()
            try:
                native.join()
            except LadleError:
                pass
        for proc in self._procs:
            proc.kill()
            proc.join()
        self._procs = []

    def _end_workers(self) -> None:
        """Once the feed has stopped: idle workers have seen their socket close and exit, one
        that was inside a sample was killed by the feed; any left after a moment is killed."""
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join()  # it starts no worker once the feed has stopped
        deadline = time.monotonic() + _WORKER_GRACE
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._procs = []

    def stop(self) -> None:
        """Stops the feed (consumers get ``End``) and the workers, at once whatever they are
        doing (a worker inside a ``__getitem__`` is killed); raises what ended it badly."""
        native = self._native
        if native is None:
            return
        native.stop()
        try:
            native.join()
        finally:
            # Dropping the native half closes every worker's socket.
            self._native = None
            del native
            self._end_workers()
        if self._failure is not None:
            raise self._failure

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the feed stops (its keep-alive, ``stop()`` from another thread, a
        worker start-up failure) or ``timeout`` passes; Ctrl-C stops it. True once stopped."""
        native = self._native
        if native is None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while not native.stopped:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def stats(self) -> dict[str, int]:
        """Samples published, bad, consumed; consumers now; workers connected, died, and
        samples the user's code failed on; connections to the workers' socket refused (too
        many saying hello at once); worker restarts."""
        out = dict(self._native.stats()) if self._native is not None else {}
        out["worker_restarts"] = self.worker_restarts
        return out

    @property
    def schema(self) -> str:
        """The feed's schema in ladle's text form."""
        return _schema.to_text(self.fields)

    def __enter__(self) -> "Producer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(dataset: Any, socket: str | os.PathLike[str], **options: Any) -> dict[str, int]:
    """Serves ``dataset`` on ``socket`` until Ctrl-C, SIGTERM or the keep-alive; blocking.
    Options as for :class:`Producer`. Returns the final :meth:`Producer.stats`."""
    producer = Producer(dataset, socket, **options)
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    producer.start()
    try:
        while not stop.is_set() and not producer.wait(timeout=0.2):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        stats = producer.stats()
        producer.stop()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(
        f"ladle: served {stats.get('published', 0)} samples "
        f"({stats.get('bad_samples', 0)} bad, {stats.get('workers_died', 0)} worker deaths)",
        file=sys.stderr,
    )
    return stats
