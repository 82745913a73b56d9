"""What the GPU check scripts share: finding the ``ladle`` binary, a ``ladle serve`` that lives
as long as a ``with`` block, and running a command to completion without any way to hang."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def ladle_bin() -> Path:
    """``$LADLE_BIN``, else the repository's release or debug build."""
    if os.environ.get("LADLE_BIN"):
        return Path(os.environ["LADLE_BIN"])
    for p in (REPO / "target/release/ladle", REPO / "target/debug/ladle"):
        if p.exists():
            return p
    raise SystemExit("build ladle first (cargo build --release -p ladle) or set LADLE_BIN")


@contextlib.contextmanager
def serving(dataset: str | None, ring_mib: int) -> Iterator[Path]:
    """Runs ``ladle serve`` on ``dataset`` (an ImageFolder; 1000 generated images when
    ``None``) with a ``ring_mib`` ring; yields its socket once it exists, and stops it
    (SIGTERM, waited) when the block ends. A serve that does not start within 30 s is an
    error carrying its log."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if dataset is None:
            dataset = str(tmp / "data")
            subprocess.run(
                [ladle_bin(), "dataset", "generate", "--format", "imagefolder", "--count", "1000",
                 "--out", dataset],
                check=True, stdout=subprocess.DEVNULL,
            )
        sock = tmp / "p.sock"
        log = tmp / "serve.log"
        with open(log, "w") as log_file:
            serve = subprocess.Popen(
                [ladle_bin(), "serve", "--dataset", dataset, "--socket", sock,
                 "--ring-mib", str(ring_mib)],
                stdout=subprocess.DEVNULL, stderr=log_file,
            )
        try:
            deadline = time.monotonic() + 30
            while not sock.exists():
                if serve.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"ladle serve did not start: {log.read_text()}")
                time.sleep(0.05)
            yield sock
        finally:
            serve.terminate()
            serve.wait(timeout=30)


def run_to_files(cmd, out_path, err_path, *, timeout: float, env=None, cwd=None,
                 input_text: str | None = None) -> dict:
    """Runs ``cmd`` to completion in a session of its own, stdout and stderr to files (a
    daemon it leaves holding a pipe cannot hang the caller), ``input_text`` on stdin. After
    ``timeout`` seconds its process group is killed. Returns ``{"rc": code}``, or
    ``{"rc": None, "error": ..., "timed_out": True}``, or ``{"rc": None, "error": ...}`` when
    it cannot start."""
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            p = subprocess.Popen(
                [str(c) for c in cmd],
                stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                stdout=out, stderr=err, env=env, cwd=cwd, start_new_session=True)
    except OSError as e:
        return {"rc": None, "error": f"cannot run: {type(e).__name__}: {e}"}
    try:
        if input_text is not None:
            try:
                p.stdin.write(input_text.encode())
                p.stdin.close()
            except OSError:
                pass
        return {"rc": p.wait(timeout=timeout)}
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        return {"rc": None, "timed_out": True, "error": f"timed out after {timeout:.0f} s"}
    finally:
        if p.stdin and not p.stdin.closed:
            try:
                p.stdin.close()
            except OSError:
                pass
