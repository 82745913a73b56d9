"""The package's ``ladle`` console script: the ladle command line run inside the native module
(no Rust toolchain, no separate binary). It generates a dataset, serves it, and a Python
consumer reads two exact epochs from it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import ladle
from conftest import Producer
from ladle import _native


@pytest.fixture(scope="module")
def console_script() -> Path:
    # Installed beside this interpreter by pip (and by maturin develop).
    found = shutil.which("ladle", path=os.path.dirname(sys.executable))
    if found is None:
        pytest.skip(f"no ladle console script beside {sys.executable}: install the package with pip")
    return Path(found)


def test_the_console_script_is_the_command_line_with_its_version(console_script):
    done = subprocess.run([console_script, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"ladle {_native.VERSION} (commit {_native.COMMIT}, features: {_native.FEATURES})"
    # Argument errors keep clap's exit code and message.
    bad = subprocess.run([console_script, "nonsense"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "unrecognized subcommand 'nonsense'" in bad.stderr


def test_the_console_script_generates_and_serves_a_dataset_read_in_two_exact_epochs(
    console_script, tmp_path
):
    data = tmp_path / "data"
    done = subprocess.run(
        [console_script, "dataset", "generate", "--format", "cifar10", "--count", "60", "--out", data],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    producer = Producer(console_script, data, tmp_path / "feed.sock")
    try:
        consumer = ladle.Consumer(producer.socket, 16)
        for epoch in range(2):
            seen: list[int] = []
            for batch in consumer:
                seen.extend(np.asarray(batch.indices).tolist())
            assert consumer.epoch == epoch
            assert sorted(seen) == list(range(60))
    finally:
        producer.stop()
    # SIGTERM ended it cleanly, as it does the binary.
    assert producer.proc.returncode == 0, producer.log.read_text()


def test_a_batch_script_written_by_the_console_script_runs_the_console_script(console_script, tmp_path):
    # The CLI runs itself again on each node: through this script (LADLE_EXE), not the
    # Python interpreter that hosts it.
    data = tmp_path / "data"
    subprocess.run(
        [console_script, "dataset", "generate", "--format", "cifar10", "--count", "8", "--out", data],
        check=True, capture_output=True, timeout=120,
    )
    env = {k: v for k, v in os.environ.items() if k != "LADLE_EXE"}
    done = subprocess.run(
        [console_script, "sweep", "--slurm", "--slurm-dry-run", "--nodes", "1", "--gpus-per-node", "1",
         "--dataset", data, "--out", tmp_path / "sweep", "--", "true"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert done.returncode == 0, done.stderr
    assert f"LADLE={os.path.abspath(console_script)}\n" in done.stdout, done.stdout


def test_ladle_serve_module_factory_serves_a_python_dataset_through_the_console_script(
    console_script, tmp_path
):
    # One `serve` for both producers: `ladle serve module:factory` hands over to the Python
    # producer in the console script's own interpreter, with `ladle serve`'s option names.
    sock = tmp_path / "py.sock"
    here = Path(__file__).resolve().parent
    env = {k: v for k, v in os.environ.items() if k != "LADLE_PYTHON"}
    env["PYTHONPATH"] = str(here) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [console_script, "serve", "pydatasets:make_waves", "--socket", sock, "--threads", "1",
         "--ring-mib", "64", "--stall-timeout", "5"],
        env=env, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not sock.exists():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "ladle serve module:factory never opened its socket"
            time.sleep(0.05)
        consumer = ladle.Consumer(sock, 50)
        assert "wave: f32[16000]" in consumer.schema, consumer.schema
        seen = [i for batch in consumer for i in np.asarray(batch.indices).tolist()]
        assert sorted(seen) == list(range(200))
        del consumer
        # The process the console script started is now the Python producer (exec): SIGTERM
        # reaches it and it ends cleanly.
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "1 workers" in err and "served" in err, err


def test_what_the_console_script_starts_does_not_inherit_its_host_settings(console_script, tmp_path):
    # The console script tells the CLI its own path and interpreter in-process: a run it
    # starts (here a sweep's) must not inherit them as LADLE_EXE / LADLE_PYTHON, or another
    # environment's `ladle` started from that run would use this one's.
    data = tmp_path / "data"
    subprocess.run(
        [console_script, "dataset", "generate", "--format", "cifar10", "--count", "8", "--out", data],
        check=True, capture_output=True, timeout=120,
    )
    seen = tmp_path / "seen"
    env = {k: v for k, v in os.environ.items() if k not in ("LADLE_EXE", "LADLE_PYTHON")}
    done = subprocess.run(
        [console_script, "sweep", "--dataset", data, "--image-size", "32", "--ring-mib", "2",
         "--gpu", "sim", "--sim-gpus", "1", "--settle-s", "0", "--tick-ms", "100",
         "--measure-s", "1", "--private-scheduler", "--out", tmp_path / "sweep", "--json", "--",
         "sh", "-c", f'echo "${{LADLE_EXE-unset}} ${{LADLE_PYTHON-unset}}" > {seen}'],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, done.stderr
    assert seen.read_text().split() == ["unset", "unset"]
