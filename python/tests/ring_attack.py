"""A hostile consumer of the feed at ``sys.argv[1]``: joins it as any consumer does, then tries
every way it has to write the ring it was handed. Prints one JSON object: each try and what
came of it (``"refused: <errno name>"`` or ``"done"``), and whether the samples it reads after
the tries are still the dataset's (``pydatasets.make_waves``).

Run by ``test_producer_security.py`` as an unprivileged user, the producer's own."""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import socket
import struct
import sys

import numpy as np

import ladle
import pydatasets
from ladle import _native

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02


def attempt(results: dict, name: str, action) -> object:
    try:
        value = action()
    except OSError as error:
        results[name] = f"refused: {errno.errorcode.get(error.errno, error.errno)}"
        return None
    results[name] = "done"
    return value


def punch_hole(fd: int, offset: int, length: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
    if libc.fallocate(fd, mode, offset, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def tries_on(fd: int) -> dict:
    """Every write this process can try on the ring file behind ``fd``."""
    results: dict = {}
    page = mmap.PAGESIZE
    # The fd as handed over.
    attempt(results, "mmap_writable", lambda: mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_WRITE, offset=page))
    attempt(results, "pwrite", lambda: os.pwrite(fd, b"\xff" * 64, page))
    attempt(results, "punch_hole", lambda: punch_hole(fd, page, page))
    view = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
    attempt(results, "madvise_remove", lambda: view.madvise(mmap.MADV_REMOVE))
    view.close()
    # Open it again, read-write, through /proc; then make the mode allow it and try again
    # (the consumer owns the file: a mode cannot stop it).
    for label in ("reopened", "reopened_after_chmod"):
        if label == "reopened_after_chmod":
            attempt(results, "chmod", lambda: os.fchmod(fd, 0o666))
        again = attempt(results, f"{label}_rdwr", lambda: os.open(f"/proc/self/fd/{fd}", os.O_RDWR))
        if again is None:
            continue
        attempt(results, f"{label}_mmap_writable",
                lambda: mmap.mmap(again, page, mmap.MAP_SHARED, mmap.PROT_WRITE, offset=page))
        attempt(results, f"{label}_pwrite", lambda: os.pwrite(again, b"\xff" * 64, page))
        attempt(results, f"{label}_punch_hole", lambda: punch_hole(again, page, page))
        attempt(results, f"{label}_ftruncate", lambda: os.ftruncate(again, 0))
        os.close(again)
    return results


def ring_fd(sock: str) -> int:
    """Joins the feed by hand, as any program may, and keeps the ring's fd (the SDK closes it
    once mapped)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(sock)
    hello = {"type": "Hello", "version": _native.PROTOCOL_VERSION, "batch_size": 20,
             "drop_last": False, "name": "attacker", "pid": os.getpid()}
    body = json.dumps(hello).encode()
    conn.sendall(struct.pack("<I", len(body)) + body)
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
    if len(fds) != 2:
        raise SystemExit(f"no ring fd came with the answer: {data[4:200]!r}")
    os.close(fds[1])
    ring_fd.conn = conn  # stays joined while the tries run
    return fds[0]


def main() -> int:
    sock = sys.argv[1]
    results = tries_on(ring_fd(sock))
    consumer = ladle.Consumer(sock, batch_size=20)
    epoch = iter(consumer)
    dataset = pydatasets.make_waves()
    intact = True
    for _ in range(5):
        batch = next(epoch)
        waves = np.asarray(batch["wave"])
        for k, i in enumerate(np.asarray(batch.indices)):
            intact &= bool(np.array_equal(waves[k], dataset[int(i)]["wave"]))
        del batch, waves
    print(json.dumps({"uid": os.getuid(), "tries": results, "intact": intact}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
