"""Feeds by name from Python (issue 42): ``ladle.Consumer(dataset=...)`` joins or starts the
node's feed of that identity, ``ladle.feed(...)`` owns one and pickles as a reference to it,
``ladle.feed_stats`` reads its figures; nothing of ladle is left running afterwards."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import ladle

from feeds_support import exact_epoch, registry_entries, wait_gone, wait_stats

pytestmark = pytest.mark.timeout(300)

IMAGE = 32


def indices(batch) -> list[int]:
    return np.asarray(batch.indices).tolist()


def ask(data: Path, **kw):
    """The identity every test here names: the dataset at 32 pixels, small ring, one thread."""
    return dict(dataset=data, image_size=IMAGE, ring_mib=4, threads=1, **kw)


def test_consumers_that_name_their_data_share_one_feed_that_stops_by_itself(registry, feed_data):
    data, n = feed_data
    a = ladle.Consumer(batch_size=16, **ask(data, idle_timeout=0.5))
    b = ladle.Consumer(batch_size=48, **ask(data, idle_timeout=0.5))
    entries = registry_entries(registry)
    assert len(entries) == 1, entries
    assert len(ladle.feed_stats(dataset=data, image_size=IMAGE)["consumers"]) == 2
    # Both read one epoch side by side, each at its own batch size: one decode serves both.
    seen = {"a": [], "b": []}
    epochs = {"a": iter(a), "b": iter(b)}
    while epochs:
        for name, epoch in list(epochs.items()):
            batch = next(epoch, None)
            if batch is None:
                del epochs[name]
            else:
                seen[name].extend(indices(batch))
            del batch
    exact_epoch(seen["a"], n)
    exact_epoch(seen["b"], n)
    stats = ladle.feed_stats(dataset=data, image_size=IMAGE)
    assert stats["published"] < stats["consumed"] == 2 * n, stats
    a.close()
    b.close()
    wait_gone(registry, entries[0]["key"])


def test_a_dataset_with_ladle_socket_of_another_seed_raises_naming_the_difference(
    registry, feed_data, monkeypatch
):
    data, n = feed_data
    with ladle.feed(**ask(data, seed=0, idle_timeout=0.5)) as feed:
        monkeypatch.setenv("LADLE_SOCKET", os.fspath(feed))
        with pytest.raises(ladle.ConnectError, match=r"seed.*'1'.*'0'|seed"):
            ladle.Consumer(batch_size=16, **ask(data, seed=1))
        with ladle.Consumer(batch_size=16, **ask(data, seed=0)) as c:
            exact_epoch([i for b in c for i in indices(b)], n)
        assert len(registry_entries(registry)) == 1, "the matching socket is joined, nothing started"
        key = feed.entry["key"]
    wait_gone(registry, key)


def _read_one_epoch(feed) -> list[int]:
    # In a spawned process: the feed arrived pickled, as a reference to the socket.
    with ladle.Consumer(feed, batch_size=16) as c:
        return [i for b in c for i in indices(b)]


def test_a_feed_handle_pickles_through_spawn_and_the_copies_do_not_stop_it(registry, feed_data):
    data, n = feed_data
    with ladle.feed(**ask(data, idle_timeout=0.5)) as feed:
        assert feed.started
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(2) as pool:
            epochs = pool.map(_read_one_epoch, [feed, feed, feed])
        for epoch in epochs:
            exact_epoch(epoch, n)
        # The copies are gone; the owner's handle still holds the feed.
        stats = wait_stats(feed, lambda s: s["leaves"] == 3, "the copies' consumers to leave")
        assert stats["consumed"] == 3 * n, stats
        assert stats["joins"] == 3
        assert feed._handle.alive()
        key = feed.entry["key"]
    # Its owner started it, so leaving the block stopped it.
    wait_gone(registry, key)


def test_a_driver_killed_with_sigkill_leaves_no_feed_after_its_timeouts(registry, feed_data):
    data, _ = feed_data
    driver = subprocess.Popen(
        [sys.executable, "-c",
         "import ladle, sys, time\n"
         f"f = ladle.feed({str(data)!r}, image_size={IMAGE}, ring_mib=4, threads=1,"
         " idle_timeout=0.5, orphan_timeout=0.5).open()\n"
         "print(f.entry['key'], flush=True)\n"
         "time.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        key = driver.stdout.readline().strip()
        assert key, "the driver opened a feed"
        # Held: the feed stays past its timeouts while the driver lives.
        assert registry_entries(registry)[0]["key"] == key
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=60)
    # Gone by itself after its timeouts (wait_gone's deadline catches one that never stops).
    wait_gone(registry, key)


def test_feed_stats_counts_what_gone_consumers_consumed(registry, feed_data):
    data, n = feed_data
    with ladle.feed(**ask(data, idle_timeout=0.5)) as feed:
        for _ in range(2):
            with ladle.Consumer(feed, batch_size=20) as c:
                exact_epoch([i for b in c for i in indices(b)], n)
        stats = wait_stats(feed, lambda s: s["leaves"] == 2, "both consumers to leave")
        assert stats["consumers"] == []
        assert stats["consumed"] == 2 * n, stats
        assert stats["joins"] == 2 and stats["leaves"] == 2
        by_name = ladle.feed_stats(dataset=data, image_size=IMAGE)
        assert by_name["consumed"] == 2 * n
    wait_gone(registry, feed.entry["key"])
    with pytest.raises(LookupError, match="no live feed"):
        ladle.feed_stats(dataset=data, image_size=IMAGE)


def test_a_consumer_leaving_its_block_by_an_exception_lets_the_feed_go_on(registry, feed_data):
    data, _ = feed_data

    class Pruned(Exception):
        pass

    with ladle.feed(**ask(data, idle_timeout=0.5)) as feed:
        with pytest.raises(Pruned):
            with ladle.Consumer(feed, batch_size=16) as c:
                for _ in c:
                    raise Pruned()
        # Closed as it left: the feed holds no consumer for the stall timeout.
        stats = wait_stats(feed, lambda s: s["leaves"] == 1, "the consumer to leave")
        assert stats["consumers"] == [] and stats["let_gos"] == 0, stats
        key = feed.entry["key"]
    wait_gone(registry, key)


def test_a_dataset_by_url_starts_its_feed_on_demand_and_reads_exact_epochs(
    registry, ladle_bin, tmp_path, monkeypatch
):
    """``dataset=`` takes a URL: a shard index on a real web server (Python's own
    ``http.server``), streamed into a shard cache under ``$XDG_CACHE_HOME``."""
    import socket as socketlib

    shards = tmp_path / "www"
    subprocess.run(
        [ladle_bin, "dataset", "generate", "--format", "wds", "--count", "100", "--shard-size",
         "25", "--width", "40", "--height", "32", "--out", shards],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([ladle_bin, "dataset", "index", shards, "--out", shards / "index.json"],
                   check=True, stderr=subprocess.DEVNULL)
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    web = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
         "--directory", shards], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socketlib.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "http.server never listened"
                time.sleep(0.05)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        url = f"http://127.0.0.1:{port}/index.json"
        with ladle.Consumer(batch_size=16, **ask(url, idle_timeout=0.5)) as consumer:
            for _ in range(2):
                seen = []
                for batch in consumer:
                    seen.extend(indices(batch))
                    del batch
                exact_epoch(seen, 100)
        entries = registry_entries(registry)
        assert [e["request"]["dataset"] for e in entries] == [url], entries
        assert (tmp_path / "cache" / "ladle" / "shards").is_dir()
        wait_gone(registry, entries[0]["key"])
    finally:
        web.terminate()
        web.wait(timeout=30)
