"""The Python producer (``ladle.serve``, ``ladle.Producer``, ``python -m ladle serve``) with
real worker processes, real shared memory and real consumers: exact contents over two
epochs, every dtype through the buffer protocol and DLPack, a raising ``__getitem__``, a
sample that does not fit the schema, a worker killed mid-sample, late joiners."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ladle

import pydatasets
from pydatasets import WAVE, FailsOnce, Mixed, Raises, Waves

HERE = Path(__file__).resolve().parent


def read_epochs(sock, batch_size: int, epochs: int, check) -> list[list[int]]:
    """Reads ``epochs`` epochs, calling ``check(batch)`` on each batch; returns the indices."""
    consumer = ladle.Consumer(sock, batch_size=batch_size)
    seen = []
    for _ in range(epochs):
        indices = []
        for batch in consumer:
            check(batch)
            indices.extend(np.asarray(batch.indices).tolist())
        seen.append(indices)
    return seen


def in_threads(*jobs):
    """Runs the callables on threads; re-raises the first failure."""
    errors = []

    def run(job):
        try:
            job()
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]


def test_two_consumers_read_a_wave_dataset_exactly_over_two_epochs(tmp_path):
    sock = tmp_path / "waves.sock"
    dataset = Waves()

    def check(batch):
        assert batch.keys() == ["wave", "label"]
        waves, labels = np.asarray(batch["wave"]), np.asarray(batch["label"])
        assert waves.shape == (len(batch), WAVE) and waves.dtype == np.float32
        assert not waves.flags.writeable
        for k, i in enumerate(np.asarray(batch.indices)):
            expected = dataset[int(i)]
            np.testing.assert_array_equal(waves[k], expected["wave"])
            assert labels[k] == expected["label"]
        assert batch.bad_count == 0

    with ladle.Producer(dataset, sock, workers=2, ring_mib=64) as producer:
        assert producer.schema == "wave: f32[16000], label: i64"
        results = {}

        def reader(bs):
            return lambda: results.__setitem__(bs, read_epochs(sock, bs, 2, check))

        in_threads(reader(32), reader(100))
        stats = producer.stats()
    for bs in (32, 100):
        for epoch in results[bs]:
            assert sorted(epoch) == list(range(len(dataset))), bs
    assert stats["bad_samples"] == 0 and stats["workers_died"] == 0


def test_every_dtype_reaches_the_consumer_zero_copy_through_buffers_and_dlpack(tmp_path):
    sock = tmp_path / "mixed.sock"
    dataset = Mixed()
    with ladle.Producer(dataset, sock, workers=2, ring_mib=16):
        consumer = ladle.Consumer(sock, batch_size=64)
        assert consumer.schema == (
            "image: u8[8, 8, 3], label: i64, half: f16[5], mask: bool[3], length: i32, "
            "small: i8[2, 3], score: f64"
        )
        assert consumer.image_shape == (8, 8, 3)
        batch = next(iter(consumer))
        for name, view in batch.items():
            via_buffer = np.asarray(view)
            via_dlpack = np.from_dlpack(view)
            assert via_buffer.dtype.name == view.dtype == via_dlpack.dtype.name, name
            assert via_buffer.ctypes.data == via_dlpack.ctypes.data == view.data_ptr, name
            for k, i in enumerate(np.asarray(batch.indices)):
                np.testing.assert_array_equal(via_buffer[k], np.asarray(dataset[int(i)][name]))
        # The image-feed aliases work on any feed with an image and a label field.
        assert np.asarray(batch.images).shape == (64, 8, 8, 3)
        np.testing.assert_array_equal(np.asarray(batch.labels), np.asarray(batch.indices))
        with pytest.raises(KeyError, match='no field "nope"'):
            batch["nope"]
        assert "mask" in batch and "nope" not in batch
        del batch, view, via_buffer, via_dlpack


def test_a_feed_without_images_says_so_when_asked_for_images(tmp_path):
    sock = tmp_path / "w.sock"
    with ladle.Producer(Waves(50), sock, workers=1, ring_mib=64):
        consumer = ladle.Consumer(sock, batch_size=10)
        assert consumer.image_shape is None
        batch = next(iter(consumer))
        with pytest.raises(AttributeError, match="no images"):
            batch.images
        assert np.asarray(batch.labels).shape == (10,)


def test_a_raising_or_misshapen_sample_is_delivered_as_bad_and_counted(tmp_path):
    sock = tmp_path / "r.sock"
    dataset = Raises(60)
    bad = {}

    def check(batch):
        waves, labels = np.asarray(batch["wave"]), np.asarray(batch["label"])
        for k, i in enumerate(np.asarray(batch.indices).tolist()):
            if i in (5, 7):
                bad[i] = (np.count_nonzero(waves[k]), int(labels[k]))
        assert batch.bad_count == sum(i in (5, 7) for i in np.asarray(batch.indices).tolist())

    with ladle.Producer(dataset, sock, workers=2, ring_mib=64) as producer:
        [epoch] = read_epochs(sock, 16, 1, check)
        stats = producer.stats()
    assert sorted(epoch) == list(range(60)), "a bad sample keeps its place in the epoch"
    assert bad == {5: (0, -1), 7: (0, -1)}, "zeroed, label -1"
    assert stats["samples_failed"] >= 2 and stats["bad_samples"] >= 2


def test_on_error_raise_stops_the_feed_with_the_samples_error(tmp_path):
    sock = tmp_path / "r.sock"
    producer = ladle.Producer(Raises(60), sock, workers=1, ring_mib=64, on_error="raise")
    producer.start()
    consumer = ladle.Consumer(sock, batch_size=8)
    # The feed decodes what its consumer asks for (a bounded read-ahead), so the consumer
    # reads until the feed ends under it.
    ended: list[BaseException] = []

    def read() -> None:
        try:
            for _ in range(20):
                for _ in consumer:
                    pass
        except ladle.LadleError as e:
            ended.append(e)

    reader = threading.Thread(target=read)
    reader.start()
    assert producer.wait(timeout=60), "the feed did not stop on the first bad sample"
    with pytest.raises(ladle.LadleError, match=r"index [57] of Raises"):
        producer.stop()
    reader.join(timeout=60)
    assert not reader.is_alive(), "the consumer did not see the feed end"
    assert len(ended) == 1 and isinstance(ended[0], (ladle.ProducerEnded, ladle.ProducerGone))


def test_a_worker_killed_mid_sample_is_replaced_and_its_sample_made_again(tmp_path):
    sock = tmp_path / "k.sock"
    dataset = FailsOnce(str(tmp_path / "marker"), 13, "die", 200)

    def check(batch):
        waves = np.asarray(batch["wave"])
        for k, i in enumerate(np.asarray(batch.indices)):
            np.testing.assert_array_equal(waves[k], Waves.__getitem__(dataset, int(i))["wave"])
        assert batch.bad_count == 0

    with ladle.Producer(dataset, sock, workers=2, ring_mib=64) as producer:
        # The first request for index 13 may come in a later epoch (the producer decodes a
        # little ahead of what the consumers asked for): read many epochs.
        epochs = read_epochs(sock, 20, 6, check)
        deadline = time.monotonic() + 30
        while producer.stats()["worker_restarts"] < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        stats = producer.stats()
    for epoch in epochs:
        assert sorted(epoch) == list(range(len(dataset)))
    assert stats["workers_died"] == 1 and stats["bad_samples"] == 0
    assert stats["worker_restarts"] >= 1, "the dead worker was not replaced"


def test_a_worker_stuck_past_the_timeout_is_killed_and_its_sample_made_again(tmp_path):
    sock = tmp_path / "h.sock"
    dataset = FailsOnce(str(tmp_path / "marker"), 11, "hang", 120)

    def check(batch):
        assert batch.bad_count == 0

    with ladle.Producer(dataset, sock, workers=2, ring_mib=64, timeout=2.0) as producer:
        # The first request for index 11 may be a later epoch's (the producer runs up to a
        # ring, 1024 samples, ahead, on two threads): read past the whole first ring.
        epochs = read_epochs(sock, 20, 10, check)
        stats = producer.stats()
    for epoch in epochs:
        assert sorted(epoch) == list(range(len(dataset)))
    assert stats["workers_died"] == 1 and stats["bad_samples"] == 0
    with pytest.raises(ValueError, match="timeout"):
        ladle.Producer(dataset, sock, timeout=0)


def test_a_late_joiner_sees_every_sample_once_per_epoch(tmp_path):
    sock = tmp_path / "late.sock"
    with ladle.Producer(Waves(300), sock, workers=2, ring_mib=64):
        early = ladle.Consumer(sock, batch_size=25)
        it = iter(early)
        held = [next(it) for _ in range(3)]
        del held
        late = ladle.Consumer(sock, batch_size=32)
        results = {}

        def rest_of_early():
            results["early"] = [int(i) for b in it for i in np.asarray(b.indices)]

        def late_epochs():
            seen = []
            for _ in range(2):
                seen.append([int(i) for b in late for i in np.asarray(b.indices)])
            results["late"] = seen

        in_threads(rest_of_early, late_epochs)
    assert late.start_seq > 0
    for epoch in results["late"]:
        assert sorted(epoch) == list(range(300))


def test_bad_arguments_and_datasets_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="on_error"):
        ladle.Producer(Waves(), tmp_path / "s", on_error="ignore")
    with pytest.raises(ValueError, match="workers"):
        ladle.Producer(Waves(), tmp_path / "s", workers=0)
    with pytest.raises(ValueError, match="empty"):
        ladle.Producer(Waves(0), tmp_path / "s").start()
    with pytest.raises(TypeError, match="dict of field name"):
        ladle.Producer(["a", "b"], tmp_path / "s").start()
    with pytest.raises(TypeError, match="dtype object"):
        ladle.Producer([{"x": {"nested": 1}}], tmp_path / "s").start()


def serve_from_the_shell(
    sock: Path, workers: int, stderr, factory: str = "pydatasets:make_waves", **env_vars: str
) -> subprocess.Popen:
    """``python -m ladle serve pydatasets:make_waves`` (or ``factory``), once its socket
    exists."""
    env = dict(os.environ, PYTHONPATH=str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(env_vars)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ladle", "serve", factory, "--socket", str(sock),
         "--workers", str(workers), "--ring-mib", "64"],
        env=env,
        stderr=stderr,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("python -m ladle serve did not open its socket")
        time.sleep(0.1)
    return proc


def test_a_dataset_workers_cannot_load_stops_the_feed_with_a_clear_error(tmp_path):
    from pydatasets import Unloadable

    sock = tmp_path / "u.sock"
    producer = ladle.Producer(Unloadable(50), sock, workers=1, ring_mib=64).start()
    assert producer.wait(timeout=120), "workers that cannot start should stop the feed"
    with pytest.raises(ladle.LadleError, match="exited before any could serve Unloadable"):
        producer.stop()
    assert not sock.exists()


def test_a_dataset_that_cannot_be_pickled_is_a_clear_error_and_leaves_nothing_behind(tmp_path):
    from pydatasets import Unpicklable

    sock = tmp_path / "p.sock"
    with pytest.raises(ladle.LadleError, match="cannot start worker processes for Unpicklable"):
        ladle.Producer(Unpicklable(), sock, workers=1, ring_mib=64).start()
    assert not sock.exists(), "the feed's socket outlived a failed start"
    # The socket path is free again.
    with ladle.Producer(Waves(20), sock, workers=1, ring_mib=64):
        assert sum(len(b) for b in ladle.Consumer(sock, batch_size=10)) == 20


def test_module_colon_name_may_be_a_factory_a_class_or_a_dataset_object():
    from ladle.__main__ import _load

    sys.path.insert(0, str(HERE))
    assert len(_load("pydatasets:make_waves")) == 200
    assert len(_load("pydatasets:Waves")) == 400
    assert len(_load("pydatasets:WAVES_OBJECT")) == 30
    with pytest.raises(SystemExit, match="has no nope"):
        _load("pydatasets:nope")


def test_python_m_ladle_serve_serves_a_factory_until_sigterm(tmp_path):
    sock = tmp_path / "cli.sock"
    proc = serve_from_the_shell(sock, workers=1, stderr=subprocess.PIPE)
    try:
        [epoch] = read_epochs(sock, 50, 1, lambda b: None)
        assert sorted(epoch) == list(range(200))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "served" in err and "0 bad" in err, err


def _children(pid: int) -> set[int]:
    """The pids of ``pid``'s children (Linux ``/proc/PID/task/*/children``)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.update(int(c) for c in (task / "children").read_text().split())
    return found


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_a_killed_python_producer_leaves_no_worker_behind_and_consumers_see_it_gone(tmp_path):
    sock = tmp_path / "kill.sock"
    proc = serve_from_the_shell(sock, workers=2, stderr=subprocess.DEVNULL)
    try:
        consumer = ladle.Consumer(sock, batch_size=10)
        epoch = iter(consumer)
        next(epoch)
        workers = _children(proc.pid)
        assert len(workers) >= 3, f"two workers and a spare expected, found {workers}"
        proc.kill()
        proc.wait()
        # What was published before the kill stays readable; reading on reaches the end.
        with pytest.raises((ladle.ProducerGone, ladle.ProducerEnded)):
            for _ in range(1000):
                for _ in epoch:
                    pass
                epoch = iter(consumer)
        deadline = time.monotonic() + 20
        while not all(_gone(w) for w in workers):
            assert time.monotonic() < deadline, f"workers left behind: {[w for w in workers if not _gone(w)]}"
            time.sleep(0.1)
    finally:
        proc.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl_c"])
def test_sigterm_or_ctrl_c_stops_a_feed_whose_workers_never_return_and_kills_them(tmp_path, sig):
    sock = tmp_path / "stuck.sock"
    stuck = tmp_path / "stuck"
    stuck.mkdir()
    proc = serve_from_the_shell(
        sock, workers=2, stderr=subprocess.PIPE, factory="pydatasets:make_stuck",
        LADLE_TEST_STUCK_DIR=str(stuck),
    )
    try:
        consumer = ladle.Consumer(sock, batch_size=10)
        # The feed decodes from a consumer's first ask (protocol 14), so ask, on a thread of
        # its own: the batch never comes, and the feed's end is what ends the wait.
        ended = []

        def ask():
            try:
                for _ in range(100):
                    for _ in consumer:
                        pass
            except ladle.LadleError as e:
                ended.append(e)

        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        deadline = time.monotonic() + 60
        while len(list(stuck.iterdir())) < 2:
            assert time.monotonic() < deadline, "the two workers never reached __getitem__"
            time.sleep(0.05)
        workers = _children(proc.pid)
        assert {int(p.name) for p in stuck.iterdir()} <= workers
        started = time.monotonic()
        proc.send_signal(sig)
        try:
            # A deadline against a hang (the bound), not a measurement: the typical
            # time is in benches/README.md.
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"python -m ladle serve still runs 10 s after {sig.name}")
        print(f"stopped {time.monotonic() - started:.2f} s after {sig.name}")
        assert proc.returncode == 0, err
        assert "Traceback" not in err, err
        asker.join(timeout=30)
        assert not asker.is_alive(), "the consumer still waits after the feed ended"
        assert len(ended) == 1 and isinstance(ended[0], ladle.ProducerEnded), ended
        deadline = time.monotonic() + 20
        while not all(_gone(w) for w in workers):
            left = [w for w in workers if not _gone(w)]
            assert time.monotonic() < deadline, f"workers left behind: {left}"
            time.sleep(0.1)
    finally:
        proc.kill()
