"""A run of ``ladle sweep`` finds its feed in ``LADLE_SOCKET`` and its name in ``LADLE_RUN``:
``ladle.Consumer`` without a socket, and ``ladle consume`` without ``--socket``, use them."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

import ladle

from conftest import DATASET_LEN


def read_epoch(consumer: ladle.Consumer) -> list[int]:
    seen: list[int] = []
    for batch in consumer:
        seen.extend(np.asarray(batch.indices).tolist())
    return sorted(seen)


def test_a_consumer_without_a_socket_joins_the_feed_in_ladle_socket(producer, monkeypatch):
    monkeypatch.setenv("LADLE_SOCKET", os.fspath(producer.socket))
    monkeypatch.setenv("LADLE_RUN", "lr-0.1")
    consumer = ladle.Consumer(batch_size=64)
    assert os.fspath(consumer.socket) == os.fspath(producer.socket)
    assert consumer.name == "lr-0.1"
    assert consumer.batch_size == 64
    assert read_epoch(consumer) == list(range(DATASET_LEN))
    del consumer
    # Positional calls still work, with None for the socket too; name= beats LADLE_RUN.
    explicit = ladle.Consumer(producer.socket, 32, name="mine")
    assert explicit.name == "mine"
    from_env = ladle.Consumer(None, 32)
    assert from_env.batch_size == 32
    assert from_env.name == "lr-0.1"


@pytest.mark.parametrize("value", [None, ""])
def test_no_socket_and_no_ladle_socket_is_a_connect_error_naming_the_variable(
    value, monkeypatch
):
    if value is None:
        monkeypatch.delenv("LADLE_SOCKET", raising=False)
    else:
        monkeypatch.setenv("LADLE_SOCKET", value)
    with pytest.raises(ladle.ConnectError, match="LADLE_SOCKET is not set"):
        ladle.Consumer(batch_size=8)


def test_the_name_defaults_to_consumer_pid_without_ladle_run(producer, monkeypatch):
    monkeypatch.delenv("LADLE_RUN", raising=False)
    consumer = ladle.Consumer(producer.socket, 8)
    assert consumer.name == f"consumer-{os.getpid()}"


def _consume(ladle_bin, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("LADLE_SOCKET", "LADLE_RUN")}
    return subprocess.run(
        [ladle_bin, "consume", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_ladle_consume_without_socket_reads_the_feed_in_ladle_socket(ladle_bin, producer):
    done = _consume(
        ladle_bin,
        {"LADLE_SOCKET": os.fspath(producer.socket), "LADLE_RUN": "sweep-run-7"},
        "--batch-size", "50", "--epochs", "2", "--json",
    )
    assert done.returncode == 0, done.stderr
    *epochs, summary = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["exact_coverage"] for e in epochs] == [True, True]
    assert summary["samples"] == 2 * DATASET_LEN
    # The producer logged the run's name when the consumer joined.
    assert "sweep-run-7" in producer.log.read_text()


def test_ladle_consume_without_any_socket_says_how_to_give_one(ladle_bin):
    done = _consume(ladle_bin, {}, "--epochs", "1")
    assert done.returncode != 0
    assert done.stdout == ""
    assert "--socket" in done.stderr and "LADLE_SOCKET" in done.stderr, done.stderr


def test_python_m_ladle_version_names_the_commit_and_features_it_was_built_from():
    import sys

    from ladle import _native

    done = subprocess.run([sys.executable, "-m", "ladle", "--version"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"ladle {_native.VERSION} (commit {_native.COMMIT}, features: {_native.FEATURES})"
    assert _native.VERSION == ladle.__version__
    # A commit (12 hex digits) when built from a checkout, else "unknown".
    assert _native.COMMIT == "unknown" or (len(_native.COMMIT) == 12 and int(_native.COMMIT, 16) >= 0)
