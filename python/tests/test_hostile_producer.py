"""The Python consumer against a hostile producer: a few lines of Python speaking the control
protocol (a length-prefixed JSON frame, the ring and cursor-page memfds passed with SCM_RIGHTS).

The Python ``Consumer`` wraps the Rust one, so these are the Rust tests in
``consumer-sdk/tests/hostile_producer.rs`` seen from Python: before the fixes, the unsealed
ring killed the interpreter with SIGBUS and the trickled ``Welcome`` hung it for ever.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket as socketlib
import struct
import threading
from pathlib import Path

import pytest

import ladle

PAGE = 4096
# The ring header's magic, "ladlerng".
MAGIC = 0x676E_7272_656C_6461
# A ring of 512 samples of one i64 field: the header page, then the field, the dataset indices
# and the flags, 8 bytes per sample each.
LAYOUT = {"capacity": 512, "schema": {"fields": [{"name": "x", "dtype": "i64", "shape": []}]}}
RING_LEN = PAGE + 512 * 8 * 3


class HostileProducer:
    """Accepts one consumer on a socket of its own and answers its Hello with ``answer``."""

    def __init__(self, path: Path, answer) -> None:
        self.listener = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.path = path
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(answer,), daemon=True)
        self.thread.start()

    def _serve(self, answer) -> None:
        conn, _ = self.listener.accept()
        with conn:
            (length,) = struct.unpack("<I", _read_exactly(conn, 4))
            hello = json.loads(_read_exactly(conn, length))
            assert hello["type"] == "Hello", hello
            answer(conn, hello, self.stop)

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self.thread.join(timeout=60)


def _read_exactly(conn: socketlib.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        assert chunk, "the consumer hung up"
        data += chunk
    return data


def _welcome(version: int) -> bytes:
    body = json.dumps(
        {
            "type": "Welcome",
            "version": version,
            "consumer_id": 1,
            "layout": LAYOUT,
            "dataset": {"len": 10, "class_names": [], "source": "hostile"},
            "start_seq": 0,
            "identity": {"source": "hostile", "len": 10, "classes": "cbf29ce484222325",
                         "seed": 0, "transform": "", "schema": "x: i64"},
        }
    ).encode()
    return struct.pack("<I", len(body)) + body


def _hang_on(conn: socketlib.socket, stop: threading.Event) -> None:
    """Keeps the connection open until the consumer hangs up or the test ends."""
    conn.settimeout(0.05)
    while not stop.is_set():
        try:
            if not conn.recv(4096):
                return
        except TimeoutError:
            pass
        except OSError:
            return


@pytest.fixture
def sock_path(tmp_path: Path) -> Path:
    return tmp_path / "hostile.sock"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("unsealed", ["ring", "cursor page"])
def test_an_unsealed_ring_or_cursor_page_is_refused_naming_the_socket(sock_path, unsealed):
    flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
    ring = os.memfd_create("hostile-ring", flags)
    os.ftruncate(ring, RING_LEN)
    os.pwrite(ring, struct.pack("<Q", MAGIC), 0)
    cursor = os.memfd_create("hostile-cursor", flags)
    os.ftruncate(cursor, PAGE)
    # The other file is sealed as a real producer's is.
    sealed = cursor if unsealed == "ring" else ring
    fcntl.fcntl(sealed, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)

    def answer(conn, hello, stop):
        socketlib.send_fds(conn, [_welcome(hello["version"])], [ring, cursor])
        _hang_on(conn, stop)

    producer = HostileProducer(sock_path, answer)
    try:
        consumer = None
        try:
            consumer = ladle.Consumer(str(sock_path), batch_size=2, timeout=30)
        except ladle.ConnectError as error:
            message = str(error)
        if consumer is not None:
            # What the check prevents: the file shrinks under the mapping, and the next read
            # of it kills the interpreter with SIGBUS.
            os.ftruncate(ring if unsealed == "ring" else cursor, 0)
            next(iter(consumer))
            pytest.fail("connected to a producer whose memory is not size-sealed")
        assert f"{unsealed} is not size-sealed" in message, message
        assert str(sock_path) in message, message
    finally:
        producer.close()
        os.close(ring)
        os.close(cursor)


@pytest.mark.timeout(120)
def test_a_welcome_trickled_a_byte_at_a_time_is_a_handshake_timeout(sock_path):
    def answer(conn, hello, stop):
        conn.sendall(struct.pack("<I", 60_000))
        # One byte every 10 ms, far within the consumer's timeout; the frame never completes.
        while not stop.wait(0.01):
            try:
                conn.sendall(b" ")
            except OSError:
                return

    producer = HostileProducer(sock_path, answer)
    try:
        with pytest.raises(ladle.ConnectError, match="did not answer within") as raised:
            ladle.Consumer(str(sock_path), batch_size=2, timeout=0.3)
        assert str(sock_path) in str(raised.value)
    finally:
        producer.close()
