"""Fixtures: a real ``ladle`` binary, a real CIFAR-10 dataset on disk, a real ``ladle serve``.

The binary is ``$LADLE_BIN``, else ``target/{release,debug}/ladle`` of this repository,
whichever is newer (``scripts/check`` builds it first). Every wait has a deadline, so a
hang fails the test instead of stalling the run.
"""

from __future__ import annotations

import os
import signal
import socket as socketlib
import subprocess
import time
from pathlib import Path

import pytest

# Started in the background of a script (`scripts/check &`, some CI runners), a test run
# inherits SIGINT ignored: Python then never raises KeyboardInterrupt, nor do the processes the
# tests start (an ignored signal stays ignored across exec). The Ctrl-C tests need Ctrl-C to
# be Ctrl-C: a handler here is reset to the default in every child.
signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parents[2]
DATASET_LEN = 600
IMAGE = 32


def _ladle_bin() -> Path:
    env = os.environ.get("LADLE_BIN")
    if env:
        # Absolute: the tests run processes in other directories (Optuna workers, Hydra jobs),
        # and those start feeds with it.
        return Path(env).resolve()
    candidates = [REPO / "target" / p / "ladle" for p in ("release", "debug")]
    found = [c for c in candidates if c.exists()]
    if not found:
        pytest.exit(
            "no ladle binary: run `cargo build -p ladle` (or set LADLE_BIN) before pytest",
            returncode=2,
        )
    return max(found, key=lambda p: p.stat().st_mtime)


@pytest.fixture(scope="session")
def ladle_bin() -> Path:
    return _ladle_bin()


def generate_cifar(ladle_bin: Path, out: Path, count: int) -> Path:
    """Generates a CIFAR-10 dataset of ``count`` records at ``out`` with ``ladle``."""
    subprocess.run(
        [ladle_bin, "dataset", "generate", "--format", "cifar10", "--count", str(count),
         "--out", out],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=120,
    )
    return out


@pytest.fixture(scope="session")
def dataset(ladle_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_cifar(ladle_bin, tmp_path_factory.mktemp("data") / "cifar", DATASET_LEN)


class Producer:
    """A running ``ladle serve``; stopped (SIGTERM, then SIGKILL) at teardown."""

    def __init__(self, ladle_bin: Path, dataset: Path, sock: Path, *extra: str) -> None:
        self.socket = sock
        self.log = sock.with_suffix(".log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [ladle_bin, "serve", "--dataset", dataset, "--socket", sock,
                 "--image-size", str(IMAGE), "--threads", "1", *extra],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ladle serve exited early:\n{self.log.read_text()}")
            try:
                with socketlib.socket(socketlib.AF_UNIX) as probe:
                    probe.connect(os.fspath(sock))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"ladle serve never listened:\n{self.log.read_text()}")
                time.sleep(0.05)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def start_producer(ladle_bin: Path, dataset: Path, tmp_path: Path):
    """Starts a producer with extra ``ladle serve`` arguments; each one has its own socket."""
    started: list[Producer] = []

    def start(*extra: str) -> Producer:
        producer = Producer(ladle_bin, dataset, tmp_path / f"p{len(started)}.sock", *extra)
        started.append(producer)
        return producer

    yield start
    for producer in started:
        producer.stop()


@pytest.fixture
def producer(start_producer) -> Producer:
    """A producer with a small ring (1 MiB: a few hundred 32x32 samples)."""
    return start_producer("--ring-mib", "1")


@pytest.fixture
def registry(monkeypatch, ladle_bin):
    """A registry of live feeds of this test's own (``LADLE_REGISTRY_DIR``; short, under /tmp,
    so that socket paths fit), the binary feeds start with (``LADLE_BIN``). At teardown every
    feed it holds must have exited by itself (deadline), and no process may mention it."""
    import shutil
    import tempfile

    from feeds_support import is_locked, processes_mentioning

    root = Path(tempfile.mkdtemp(prefix="lf-"))
    registry = root / "reg"
    monkeypatch.setenv("LADLE_REGISTRY_DIR", str(registry))
    monkeypatch.setenv("LADLE_BIN", str(ladle_bin))
    monkeypatch.delenv("LADLE_SOCKET", raising=False)
    yield registry
    deadline = time.monotonic() + 120
    try:
        for live in registry.glob("*.live") if registry.exists() else []:
            while is_locked(live):
                assert time.monotonic() < deadline, f"{live}: a feed still runs"
                time.sleep(0.02)
        left = processes_mentioning(str(registry))
        assert not left, f"left running: {left}"
    finally:
        for pid, _ in processes_mentioning(str(registry)):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def feed_data(ladle_bin, tmp_path_factory) -> tuple[Path, int]:
    """A small CIFAR-10 dataset for the feed tests, and its length."""
    count = 600
    return generate_cifar(ladle_bin, tmp_path_factory.mktemp("feeds") / "cifar", count), count
