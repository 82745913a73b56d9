"""A worker process of the Python producer: makes samples with the user's dataset and
writes them into its own staging buffer, which the producer copies into the ring.

The producer (``ladle._native._Producer``, Rust) holds each slot's write loan and sends
``{"index", "epoch"}`` over the workers' socket; the worker calls ``dataset[index]``, checks
every field against the schema and copies it into its staging buffer (a shared-memory file of
one sample that came with the welcome), then answers ``{"ok": true}`` or
``{"error": "..."}``; the producer then copies the buffer into the slot. Workers never map the
ring: it is sealed against every writer but the producer's own mapping, so that no consumer
can write it either. Frames are ``u32`` little-endian length + JSON, as on the producer's
control socket. Randomness is seeded per sample from ``(seed, epoch, index)`` (``random``,
NumPy's global generator, and torch's when imported), so a user's random transforms are
reproducible, as the native pipeline's are. Ctrl-C is ignored here: the producer decides when
its workers stop (and kills one still inside ``__getitem__``).
"""

from __future__ import annotations

import json
import mmap
import os
import random
import signal
import socket
import struct
import sys
from typing import Any

import numpy as np

from ._schema import Field, as_array, sample_items

_MAX_FRAME = 64 * 1024


def _send(sock: socket.socket, message: dict) -> None:
    body = json.dumps(message).encode()
    if len(body) > _MAX_FRAME:
        body = json.dumps({"error": message.get("error", "")[: _MAX_FRAME // 2]}).encode()
    sock.sendall(struct.pack("<I", len(body)) + body)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket) -> dict | None:
    head = _recv_exact(sock, 4)
    if head is None:
        return None
    body = _recv_exact(sock, struct.unpack("<I", head)[0])
    return None if body is None else json.loads(body)


def _seed(seed: int, epoch: int, index: int) -> None:
    mixed = hash((seed, epoch, index)) & 0xFFFF_FFFF_FFFF_FFFF
    random.seed(mixed)
    np.random.seed(mixed & 0xFFFF_FFFF)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(mixed & 0x7FFF_FFFF_FFFF_FFFF)


class _Staging:
    """The worker's staging buffer, one NumPy array ``[...shape]`` per field."""

    def __init__(self, fd: int, welcome: dict, fields: list[Field]) -> None:
        try:
            self.map = mmap.mmap(fd, welcome["len"], mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.fields = []
        for (name, dtype, shape), (offset, _) in zip(fields, welcome["fields"]):
            stored = np.uint16 if dtype == "bfloat16" else np.dtype(dtype)
            array = np.ndarray(tuple(shape), dtype=stored, buffer=self.map, offset=offset)
            self.fields.append((name, dtype, tuple(shape), array))

    def write(self, sample: Any) -> None:
        items = dict(sample_items(sample))
        names = [name for name, *_ in self.fields]
        if set(items) != set(names):
            raise KeyError(
                f"the sample's fields {sorted(items)} are not the schema's {names}"
            )
        for name, dtype, shape, array in self.fields:
            value, got = as_array(items[name])
            if value.shape != shape:
                raise ValueError(f"field {name!r} has shape {value.shape}, the schema says {shape}")
            if dtype == "bfloat16":
                if got != "bfloat16":
                    raise TypeError(f"field {name!r} is bfloat16 in the schema, the sample's is {got}")
                array[...] = value
                continue
            if not np.can_cast(value.dtype, array.dtype, casting="same_kind"):
                raise TypeError(f"field {name!r} is {dtype} in the schema, the sample's is {got}")
            np.copyto(array, value, casting="same_kind")


def _recv_welcome(sock: socket.socket) -> tuple[dict, int]:
    """The producer's welcome frame and the ring fd that comes with its first bytes."""
    data, fds, _, _ = socket.recv_fds(sock, 4 + _MAX_FRAME, 1)
    if not data:
        raise ConnectionError("the producer refused this worker")
    while len(data) < 4:
        more = sock.recv(4 - len(data))
        if not more:
            raise ConnectionError("the producer hung up during the welcome")
        data += more
    length = struct.unpack("<I", data[:4])[0]
    rest = _recv_exact(sock, 4 + length - len(data)) if len(data) < 4 + length else b""
    if rest is None:
        raise ConnectionError("the producer hung up during the welcome")
    welcome = json.loads(data[4:] + rest)
    if "error" in welcome:  # refused: too many connections saying hello at once
        raise ConnectionError(f"the producer refused this worker: {welcome['error']}")
    if len(fds) != 1:
        raise ConnectionError(f"the welcome came with {len(fds)} file descriptors, not 1")
    return welcome, fds[0]


def run(dataset: Any, path: str, token: str, fields: list[Field], seed: int) -> None:
    """A worker's life: connect, map its staging buffer, make samples until the producer
    hangs up."""
    # Ctrl-C in a terminal reaches the whole process group: the producer, not each worker,
    # decides what it means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        return  # started as the feed stopped: its socket is gone
    _send(sock, {"token": token, "pid": os.getpid()})
    welcome, fd = _recv_welcome(sock)
    staging = _Staging(fd, welcome, fields)
    while True:
        request = _recv(sock)
        if request is None:
            return  # the producer stopped, or no longer needs this worker
        index, epoch = request["index"], request["epoch"]
        try:
            _seed(seed, epoch, index)
            staging.write(dataset[index])
        except Exception as error:  # the user's code: report it, keep serving
            _send(sock, {"error": f"{type(error).__name__}: {error}"})
        else:
            _send(sock, {"ok": True})
