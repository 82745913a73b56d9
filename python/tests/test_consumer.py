"""The Python consumer against a real ``ladle serve``: epochs, zero-copy views, the holding
rule, errors, and the GIL."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import ladle

from conftest import DATASET_LEN, IMAGE


def indices_of(consumer: ladle.Consumer) -> list[int]:
    """Reads one epoch and returns its dataset indices, checking every batch's shape."""
    seen: list[int] = []
    for batch in consumer:
        assert batch.images.shape == [len(batch), IMAGE, IMAGE, 3]
        assert batch.labels.shape == [len(batch)]
        seen.extend(np.asarray(batch.indices).tolist())
    return seen


@pytest.mark.parametrize("batch_size", [1, 7, 64, 128])
def test_each_for_loop_reads_one_epoch_holding_every_sample_once(producer, batch_size):
    consumer = ladle.Consumer(producer.socket, batch_size)
    assert len(consumer) == -(-DATASET_LEN // batch_size)
    assert consumer.dataset_len == DATASET_LEN
    assert consumer.image_shape == (IMAGE, IMAGE, 3)
    for epoch in range(2):
        seen = indices_of(consumer)
        assert consumer.epoch == epoch
        assert sorted(seen) == list(range(DATASET_LEN))


def test_drop_last_skips_the_partial_batch(producer):
    consumer = ladle.Consumer(producer.socket, 64, drop_last=True)
    sizes = [len(batch) for batch in consumer]
    assert sizes == [64] * (DATASET_LEN // 64)
    assert len(consumer) == DATASET_LEN // 64


def test_a_late_joiner_still_reads_whole_epochs(producer):
    first = ladle.Consumer(producer.socket, 50)
    epoch = iter(first)
    for _ in range(3):
        next(epoch)
    late = ladle.Consumer(producer.socket, 32)
    assert late.start_seq > 0, "joined mid-stream"
    del epoch, first  # it stops reading: leave, or the producer waits for it
    assert sorted(indices_of(late)) == list(range(DATASET_LEN))


def test_a_loop_that_keeps_an_example_batch_skims_past_it_and_the_fast_loop_goes_on(
    start_producer,
):
    # Issue 41, item 6: a slow loop keeping one zero-copy batch (an example for logging)
    # held the fast one at 0 samples/s until the stall timeout. Here the stall timeout is
    # longer than the test: only skimming past the kept batch frees the feed.
    producer = start_producer("--ring-mib", "1", "--stall-timeout", "600")  # 512 slots
    slow = ladle.Consumer(producer.socket, 10)
    epoch = iter(slow)
    example = next(epoch)
    example_pixels = np.asarray(example.images).copy()
    seen = np.asarray(example.indices).tolist()
    fast = ladle.Consumer(producer.socket, 64)
    everything = list(range(DATASET_LEN))
    fast_epochs: list[bool] = []

    def read_fast() -> None:
        for _ in range(6):  # seven rings: the kept batch's slots are written again
            fast_epochs.append(sorted(indices_of(fast)) == everything)
        fast.close()  # done: it no longer paces the feed (the slow one may pace it again)

    reader = threading.Thread(target=read_fast)
    reader.start()
    changed_while_intact = 0
    for batch in epoch:
        seen.extend(np.asarray(batch.indices).tolist())
        time.sleep(0.1)  # the slow run's training step: 100 samples/s
        if example.intact and not np.array_equal(np.asarray(example.images), example_pixels):
            changed_while_intact += 1
    reader.join(timeout=120)
    assert not reader.is_alive(), "the fast loop was held back by the kept batch"
    assert fast_epochs == [True] * 6, "the fast loop's epochs are exact"
    assert sorted(seen) == everything, "the slow loop's epoch is exact"
    assert slow.skims >= 1 and slow.rejoins == 0
    assert changed_while_intact == 0, "the kept batch changed while it said it was intact"
    assert not example.intact, "the feed wrote over the kept batch and it must say so"


def test_a_loop_holding_the_previous_batch_at_half_the_ring_finishes(start_producer):
    # Issue 11, defect 2: `for b in c: prev = b` at batch C/2 hung at the start of epoch 1
    # (the consumer waits for cursor + C while up to 7 samples sat unsent in the producer).
    producer = start_producer("--ring-mib", "1")  # 512 slots of 32x32
    started = threading.Event()
    results: dict[str, list[list[int]]] = {}

    def read(name: str, consumer: ladle.Consumer, epochs: int) -> None:
        out = []
        for _ in range(epochs):
            seen: list[int] = []
            prev = None
            for batch in consumer:
                seen.extend(np.asarray(batch.indices).tolist())
                assert batch.bad_count == 0
                prev = batch  # noqa: F841 (held until the next batch arrives)
                started.set()
            del prev
            out.append(sorted(seen))
        results[name] = out

    first = ladle.Consumer(producer.socket, 256)
    thread = threading.Thread(target=read, args=("first", first, 3))
    thread.start()
    assert started.wait(60)
    # A late joiner at an unaligned start, with the same loop.
    late = ladle.Consumer(producer.socket, 256)
    read("late", late, 2)
    thread.join(120)
    assert not thread.is_alive(), "the first consumer hung"
    everything = list(range(DATASET_LEN))
    assert results["first"] == [everything] * 3
    assert results["late"] == [everything] * 2


def test_a_paused_consumer_is_let_go_and_still_reads_its_epoch_exactly(start_producer):
    # Issue 11, defect 6: a run that pauses (validation, a checkpoint) froze every other run.
    producer = start_producer("--ring-mib", "1", "--stall-timeout", "0.5")
    paused = ladle.Consumer(producer.socket, 50)
    epoch = iter(paused)
    seen = [int(i) for i in np.asarray(next(epoch).indices)]
    other = ladle.Consumer(producer.socket, 64)
    for _ in range(3):  # more than a ring's worth while `paused` takes nothing
        assert sorted(indices_of(other)) == list(range(DATASET_LEN))
    for batch in epoch:
        seen.extend(np.asarray(batch.indices).tolist())
    assert sorted(seen) == list(range(DATASET_LEN)), "the paused consumer's epoch is exact"
    assert paused.rejoins >= 1


def test_images_and_labels_are_zero_copy_read_only_numpy_arrays(producer):
    consumer = ladle.Consumer(producer.socket, 16)
    batch = next(iter(consumer))
    images = np.asarray(batch.images)
    labels = np.asarray(batch.labels)
    assert images.dtype == np.uint8 and images.shape == (16, IMAGE, IMAGE, 3)
    assert labels.dtype == np.int64 and labels.shape == (16,)
    assert images.ctypes.data == batch.images.data_ptr  # the ring itself, not a copy
    assert not images.flags.writeable and not labels.flags.writeable
    with pytest.raises(ValueError):
        images[0, 0, 0, 0] = 1
    assert memoryview(batch.images).readonly
    assert images.any(), "decoded images are not all black"
    assert ((labels >= 0) & (labels < 10)).all()
    again = np.from_dlpack(batch.images)
    assert again.ctypes.data == images.ctypes.data and not again.flags.writeable
    assert np.array_equal(np.from_dlpack(batch.labels), labels)


def test_a_writable_buffer_is_refused_with_a_clear_error(producer):
    consumer = ladle.Consumer(producer.socket, 4)
    batch = next(iter(consumer))
    import ctypes

    get_buffer = ctypes.pythonapi.PyObject_GetBuffer
    get_buffer.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int]
    storage = ctypes.create_string_buffer(256)  # room for a Py_buffer
    pybuf_writable = 0x0001
    with pytest.raises(BufferError, match="read-only"):
        get_buffer(batch.images, ctypes.addressof(storage), pybuf_writable)


def test_holding_more_than_max_batches_held_raises_until_one_is_dropped(producer):
    consumer = ladle.Consumer(producer.socket, 8, max_batches_held=3)
    epoch = iter(consumer)
    held = [next(epoch) for _ in range(3)]
    assert consumer.held_batches == 3
    with pytest.raises(ladle.TooManyBatchesHeld, match="max_batches_held|hold"):
        next(epoch)
    del held[0]
    assert consumer.held_batches == 2
    assert len(next(epoch)) == 8


def test_an_array_made_from_a_batch_keeps_it_held(producer):
    consumer = ladle.Consumer(producer.socket, 8)
    epoch = iter(consumer)
    batch = next(epoch)
    images = np.asarray(batch.images)
    pixels = images.copy()
    del batch
    assert consumer.held_batches == 1, "the array still reads the ring"
    assert np.array_equal(images, pixels), "held samples were overwritten"
    del images
    assert consumer.held_batches == 0


def test_bad_arguments_raise_value_errors(producer):
    with pytest.raises(ValueError, match="batch_size"):
        ladle.Consumer(producer.socket, 0)
    with pytest.raises(ValueError, match="max_batches_held"):
        ladle.Consumer(producer.socket, 8, max_batches_held=0)
    # The ring's size is the producer's: it refuses, and the message says the limit.
    with pytest.raises(ladle.ConnectError, match="batch size 100000 is outside"):
        ladle.Consumer(producer.socket, 100_000)


def test_a_missing_socket_is_a_connect_error_naming_it(tmp_path):
    missing = tmp_path / "nobody.sock"
    with pytest.raises(ladle.ConnectError, match="nobody.sock"):
        ladle.Consumer(missing, 8)
    assert issubclass(ladle.ConnectError, ladle.LadleError)


def test_a_killed_producer_raises_producer_gone_and_held_batches_stay_readable(producer):
    consumer = ladle.Consumer(producer.socket, 32)
    epoch = iter(consumer)
    batch = next(epoch)
    before = np.asarray(batch.images).copy()
    producer.signal(signal.SIGKILL)
    with pytest.raises((ladle.ProducerGone, ladle.ProducerEnded)):
        while True:  # samples published before the kill are still delivered first
            next(epoch)
    assert np.array_equal(np.asarray(batch.images), before)


def test_a_stopped_producer_raises_producer_ended(producer):
    consumer = ladle.Consumer(producer.socket, 32)
    epoch = iter(consumer)
    next(epoch)
    producer.signal(signal.SIGTERM)
    with pytest.raises(ladle.ProducerEnded):
        while True:
            next(epoch)


def _blocked_consumer(producer):
    """A consumer whose next batch cannot come: another consumer holds the ring's oldest
    samples, so the producer waits. Returns (holder's batch, blocked epoch)."""
    holder = ladle.Consumer(producer.socket, 8)
    pinned = next(iter(holder))
    reader = ladle.Consumer(producer.socket, 64, max_batches_held=64)
    epoch = iter(reader)
    return holder, pinned, reader, epoch


def test_the_gil_is_released_while_waiting_for_data(producer):
    holder, pinned, reader, epoch = _blocked_consumer(producer)
    got = []
    failed = []

    def read_until_blocked_then_one_more():
        try:
            for batch in epoch:  # an epoch is more than the ring: blocks until `pinned` goes
                got.append(len(batch))
        except Exception as e:  # noqa: BLE001 - reported below
            failed.append(e)

    thread = threading.Thread(target=read_until_blocked_then_one_more)
    thread.start()
    count = 0
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        count += 1  # Python work on this thread while the reader waits
    assert thread.is_alive(), "the reader should be waiting for the pinned samples"
    assert count > 10_000, "this thread barely ran: the waiting thread holds the GIL"
    del pinned, holder  # the holder leaves: the producer goes on
    thread.join(timeout=60)
    assert not thread.is_alive() and not failed, failed
    assert sum(got) > 0
    del reader


def test_ctrl_c_interrupts_a_wait(producer):
    holder, pinned, reader, epoch = _blocked_consumer(producer)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        for _batch in epoch:  # an epoch is more than the ring: blocks on `pinned`
            pass
    timer.join()
    del pinned, holder


def test_a_slow_loop_beside_a_fast_one_skims_and_both_read_exact_epochs(start_producer):
    # Issue 28: a run that keeps the others waiting stops setting the pace.
    producer = start_producer("--ring-mib", "1")
    slow = ladle.Consumer(producer.socket, 10)
    fast = ladle.Consumer(producer.socket, 64)
    stop = threading.Event()
    fast_epochs: list[bool] = []

    def read_fast() -> None:
        while not stop.is_set():
            fast_epochs.append(sorted(indices_of(fast)) == list(range(DATASET_LEN)))

    reader = threading.Thread(target=read_fast)
    reader.start()
    try:
        skimmed_epochs = 0
        for _ in range(8):
            seen: list[int] = []
            for batch in slow:
                seen.extend(np.asarray(batch.indices).tolist())
                time.sleep(0.05)  # the slow run's training step
            assert sorted(seen) == list(range(DATASET_LEN)), "the slow loop's epoch is exact"
            if slow.skimming:
                skimmed_epochs += 1
                if skimmed_epochs == 2:
                    break
        assert skimmed_epochs == 2, f"never skimmed: skims={slow.skims}"
        assert slow.skims >= 1
    finally:
        stop.set()
        reader.join(timeout=60)
    assert fast_epochs and all(fast_epochs), "the fast loop's epochs are exact"
    assert len(fast_epochs) > 4, f"the fast loop read {len(fast_epochs)} epochs"
