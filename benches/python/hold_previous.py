"""Issue 11, defect 2, on any build: the loop ``for b in c: prev = b`` at batch C/2 (256 of a
512-slot ring) beside an unaligned late joiner, each with a 60 s deadline.

    python benches/python/hold_previous.py LADLE_BIN N

runs with the ``ladle`` package of that build installed; prints the epochs each consumer
finished and ``ok`` or ``HUNG``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time

import ladle


def read(done: dict[str, int], name: str, consumer: ladle.Consumer, epochs: int) -> None:
    for epoch in range(epochs):
        prev = None
        for batch in consumer:
            prev = batch  # held until the next batch arrives
        del prev
        done[name] = epoch + 1


def main() -> None:
    ladle_bin, n = sys.argv[1], int(sys.argv[2])
    work = tempfile.mkdtemp()
    subprocess.run(
        [ladle_bin, "dataset", "generate", "--format", "imagefolder", "--count", str(n),
         "--width", "40", "--height", "36", "--out", f"{work}/data"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    sock = f"{work}/s.sock"
    producer = subprocess.Popen(
        [ladle_bin, "serve", "--dataset", f"{work}/data", "--socket", sock,
         "--image-size", "32", "--ring-mib", "2", "--threads", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        done: dict[str, int] = {}
        first = threading.Thread(
            target=read, args=(done, "first", ladle.Consumer(sock, 256), 3), daemon=True
        )
        first.start()
        time.sleep(0.15)
        late = threading.Thread(
            target=read, args=(done, "late", ladle.Consumer(sock, 256), 2), daemon=True
        )
        late.start()
        first.join(60)
        late.join(60)
        hung = first.is_alive() or late.is_alive()
        print("epochs finished:", done, "HUNG" if hung else "ok")
    finally:
        producer.kill()
    os._exit(0)  # a hung consumer thread must not keep the interpreter alive


if __name__ == "__main__":
    main()
