"""The Python producer's ring is as closed to its consumers as the native producer's: sealed
with ``F_SEAL_FUTURE_WRITE``, so that a consumer holding its fd, even one of the producer's
own user that opens it again read-write through ``/proc`` or changes its mode, can neither map
it writable nor ``write(2)`` it, nor punch holes in it. The producer and the attacker run as
an unprivileged user (``nobody`` when the tests run as root), the producer's own: the case
the uid check on the socket lets in."""

from __future__ import annotations

import json
import os
import pwd
import grp
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _as_unprivileged() -> list[str]:
    """The command prefix that runs a command as an unprivileged user, or a skip saying why
    there is none."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root and no setpriv to drop privileges with (util-linux)")
    try:
        pwd.getpwnam("nobody")
        grp.getgrnam("nogroup")
    except KeyError:
        pytest.skip("running as root and there is no user nobody or group nogroup to run as")
    return [setpriv, "--reuid", "nobody", "--regid", "nogroup", "--clear-groups"]


def _env() -> dict[str, str]:
    """PYTHONPATH names this directory and where ladle and NumPy are installed: a virtual
    environment under a directory the unprivileged user cannot enter is then not needed."""
    import ladle
    import numpy

    paths = [str(HERE), str(Path(ladle.__file__).parents[1]), str(Path(numpy.__file__).parents[1])]
    extra = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([*paths, *([extra] if extra else [])]),
                PYTHONDONTWRITEBYTECODE="1")


_PROBE = """
import multiprocessing, ladle, numpy, pydatasets
if __name__ == "__main__":
    child = multiprocessing.get_context("spawn").Process(target=len, args=((),))
    child.start()
    child.join()
    raise SystemExit(child.exitcode)
"""


def _python(prefix: list[str]) -> str:
    """An interpreter that runs ladle, and starts its spawn workers, as the unprivileged user:
    this one, or the system's of the same version (this one may live where that user cannot
    enter); a skip saying why when neither does."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = [shutil.which(version), f"/usr/local/bin/{version}", f"/usr/bin/{version}"]
    candidates = [sys.executable, *(p for p in found if p and os.path.exists(p))]
    errors = []
    for python in candidates:
        probe = subprocess.run([*prefix, python, "-c", _PROBE], env=_env(), capture_output=True,
                               text=True, timeout=120)
        if probe.returncode == 0:
            return python
        errors.append(f"{python}: exit {probe.returncode} {probe.stderr[-300:]}")
    pytest.skip(f"no Python runs ladle and its workers as the unprivileged user: {errors}")


@pytest.fixture
def private_dir():
    """A directory the unprivileged user owns, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="ladle-sec-"))
    if os.geteuid() == 0:
        os.chown(path, pwd.getpwnam("nobody").pw_uid, grp.getgrnam("nogroup").gr_gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_consumer_of_the_producers_own_user_cannot_write_the_python_producers_ring(private_dir):
    prefix = _as_unprivileged()
    python = _python(prefix)
    sock = private_dir / "feed.sock"
    producer = subprocess.Popen(
        [*prefix, python, "-m", "ladle", "serve", "pydatasets:make_waves",
         "--socket", str(sock), "--workers", "1", "--ring-mib", "16"],
        env=_env(), stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert producer.poll() is None, producer.stderr.read()
            assert time.monotonic() < deadline, "the producer never opened its socket"
            time.sleep(0.05)
        attack = subprocess.run(
            [*prefix, python, str(HERE / "ring_attack.py"), str(sock)],
            env=_env(), capture_output=True, text=True, timeout=120,
        )
        assert attack.returncode == 0, attack.stdout + attack.stderr
        report = json.loads(attack.stdout.strip().splitlines()[-1])
    finally:
        producer.terminate()
        producer.wait(timeout=30)
    tries = report["tries"]
    if prefix:
        assert report["uid"] == pwd.getpwnam("nobody").pw_uid
    # Re-opening the file read-write cannot be stopped (the consumer owns it and may change its
    # mode back): what matters is that the fd it gets can write nothing.
    writes = [name for name in tries if name not in ("reopened_rdwr", "reopened_after_chmod_rdwr", "chmod")]
    assert {"mmap_writable", "pwrite", "punch_hole", "madvise_remove"} <= set(writes), tries
    done = {name: tries[name] for name in writes if not tries[name].startswith("refused")}
    assert not done, f"the consumer wrote the ring: {done} (all tries: {tries})"
    print(f"tries as uid {report['uid']}: {tries}")
    assert report["intact"], "the samples read after the tries are not the dataset's"
