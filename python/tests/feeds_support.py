"""Helpers of the feed tests: the registry's entries, waiting for a feed to be gone, exact
epochs."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

DEADLINE = 120.0


def registry_entries(registry: Path) -> list[dict]:
    """The entries of the live feeds in ``registry``."""
    entries = []
    for path in sorted(registry.glob("*.json")):
        entry = json.loads(path.read_text())
        if is_locked(registry / f"{entry['key']}.live"):
            entries.append(entry)
    return entries


def is_locked(path: Path) -> bool:
    """Whether a process holds ``path``'s flock (a feed's life lock)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def wait_gone(registry: Path, key: str) -> float:
    """Waits until feed ``key`` has exited (its life lock free); returns the seconds it took.
    The deadline only catches a feed that never stops."""
    started = time.monotonic()
    live = registry / f"{key}.live"
    while is_locked(live):
        assert time.monotonic() - started < DEADLINE, f"feed {key} still runs"
        time.sleep(0.02)
    return time.monotonic() - started


def processes_mentioning(needle: str) -> list[tuple[int, str]]:
    """Processes whose command line mentions ``needle``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmd:
            found.append((int(entry), cmd))
    return found


def exact_epoch(indices: list[int], n: int) -> None:
    """Asserts that ``indices`` is every index of ``range(n)`` exactly once."""
    assert len(indices) == n, f"{len(indices)} samples, expected {n}"
    assert sorted(indices) == list(range(n)), "an index twice or missing"


def wait_stats(feed, ok, what: str) -> dict:
    """Asks the feed for its stats until ``ok(stats)`` holds (the producer sees a leave a
    moment after the consumer sends it); fails naming ``what`` and the last stats."""
    import ladle

    started = time.monotonic()
    while True:
        stats = ladle.feed_stats(feed)
        if ok(stats):
            return stats
        assert time.monotonic() - started < DEADLINE, f"{what}: {stats}"
        time.sleep(0.02)
