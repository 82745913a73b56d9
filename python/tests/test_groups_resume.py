"""DDP groups and resumable positions, with real ``ladle serve`` producers and every rank (and
every incarnation of a run) a process of its own: each rank's share of each epoch, a rank
killed with SIGKILL, a group that never becomes whole, ``state_dict`` saved and the process
killed, then resumed by a new process (against the same producer, a restarted one, or one of
another seed), and a whole DDP job killed and restarted from its ranks' states.

The processes are this file run as a script (``child``, at the bottom): each reads its
epochs, reports every batch's indices and labels as JSON lines on stdout, and at the end
waits on stdin, as DDP's ranks wait for each other at the end of training; the test closes
stdin to let it go, or kills it.
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import Producer, generate_cifar

HERE = Path(__file__).resolve()

#: Not divisible by 2 or 3: the ranks' shares need padding (or dropping).
ODD_LEN = 101
#: The resume tests' dataset: batches of 10 make 10% steps.
EVEN_LEN = 100

#: A deadline for anything a child is waiting for; only a hang reaches it.
DEADLINE = 60.0




def _labels(dataset: Path) -> list[int]:
    """Every index's label, read from the CIFAR-10 file itself (1 label byte + 3072 pixels
    per record, in index order)."""
    data = (dataset / "data_batch_1.bin").read_bytes()
    return list(data[:: 1 + 3 * 32 * 32])


@pytest.fixture(scope="module")
def odd_dataset(ladle_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_cifar(ladle_bin, tmp_path_factory.mktemp("odd") / "cifar", ODD_LEN)


@pytest.fixture(scope="module")
def even_dataset(ladle_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_cifar(ladle_bin, tmp_path_factory.mktemp("even") / "cifar", EVEN_LEN)


@pytest.fixture
def serve(ladle_bin: Path, tmp_path: Path):
    """Starts ``ladle serve`` on a dataset (its own socket unless given); all stopped at
    teardown."""
    started: list[Producer] = []

    def start(dataset: Path, *extra: str, sock: Path | None = None) -> Producer:
        sock = sock or tmp_path / f"p{len(started)}.sock"
        producer = Producer(ladle_bin, dataset, sock, "--ring-mib", "1", *extra)
        started.append(producer)
        return producer

    yield start
    for producer in started:
        producer.stop()


class Child:
    """One reader process (``child`` below); its JSON events arrive on a queue."""

    def __init__(self, **spec) -> None:
        self.spec = spec
        self.proc = subprocess.Popen(
            [sys.executable, HERE, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.events: list[dict] = []
        self._queue: queue.Queue[dict | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self._stderr.extend(self.proc.stderr), daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(json.loads(line))
        self._queue.put(None)

    def wait_for(self, kind: str, timeout: float = DEADLINE) -> dict:
        """Collects events until one of `kind` (returned); fails on the process's end."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"{self.spec}: no {kind!r} within {timeout} s; events so far: "
                            f"{[e['event'] for e in self.events]}; stderr: {self.stderr()}")
            if event is None:
                pytest.fail(f"{self.spec}: exited ({self.proc.wait()}) before {kind!r}; "
                            f"stderr: {self.stderr()}")
            self.events.append(event)
            if event["event"] == kind:
                return event
            if event["event"] in ("error", "broken"):
                pytest.fail(f"{self.spec}: {event['type']}: {event['message']}")

    def stderr(self) -> str:
        return "".join(self._stderr)[-3000:]

    def release(self) -> None:
        """Lets a child waiting at its end go, and reaps it."""
        self.proc.stdin.close()
        assert self.proc.wait(timeout=DEADLINE) == 0, self.stderr()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=DEADLINE)

    def epochs(self) -> dict[int, list[int]]:
        """The indices of every batch seen, by epoch."""
        out: dict[int, list[int]] = {}
        for e in self.events:
            if e["event"] == "batch":
                out.setdefault(e["epoch"], []).extend(e["indices"])
        return out


@pytest.fixture
def children():
    """Starts reader processes; any still running at teardown is killed."""
    started: list[Child] = []

    def start(**spec) -> Child:
        child = Child(**spec)
        started.append(child)
        return child

    yield start
    for child in started:
        if child.proc.poll() is None:
            child.kill()


def _check_labels(child: Child, labels: list[int]) -> None:
    for e in child.events:
        if e["event"] == "batch":
            assert e["labels"] == [labels[i] for i in e["indices"]], "a sample is not its index's"


def _share(n: int, world: int, even: str) -> int:
    return -(-n // world) if even == "pad" else n // world


@pytest.mark.parametrize(
    ("world", "batch_size", "even"),
    [(2, 32, "pad"), (3, 50, "pad"), (2, 32, "drop"), (3, 50, "drop")],
)
def test_the_ranks_of_a_group_split_each_epoch_evenly_beside_a_whole_epoch_consumer(
    serve, children, odd_dataset, world, batch_size, even
):
    producer = serve(odd_dataset)
    epochs = 3
    ranks = [
        children(socket=str(producer.socket), batch_size=batch_size, epochs=epochs,
                 group="job", rank=r, world_size=world, even=even)
        for r in range(world)
    ]
    whole = children(socket=str(producer.socket), batch_size=batch_size, epochs=epochs)
    share = _share(ODD_LEN, world, even)
    for r, child in enumerate(ranks):
        connected = child.wait_for("connected")
        assert (connected["group"], connected["rank"], connected["world_size"]) == ("job", r, world)
        assert connected["even"] == even
        assert connected["len"] == -(-share // batch_size)
    assert whole.wait_for("connected")["group"] is None
    for child in [*ranks, whole]:
        child.wait_for("done")
    for child in [*ranks, whole]:
        child.release()

    labels = _labels(odd_dataset)
    for child in [*ranks, whole]:
        _check_labels(child, labels)
    for epoch in range(epochs):
        assert sorted(whole.epochs()[epoch]) == list(range(ODD_LEN)), f"epoch {epoch}"
        shares = [child.epochs()[epoch] for child in ranks]
        for got in shares:
            assert len(got) == share, "every rank gets the same count"
            assert len(set(got)) == share, "a rank never gets an index twice"
        counts = Counter(i for got in shares for i in got)
        if even == "pad":
            assert set(counts) == set(range(ODD_LEN)), "together the whole epoch"
            repeats = sum(counts.values()) - ODD_LEN
            assert repeats == world * share - ODD_LEN
            assert max(counts.values()) <= 2
        else:
            assert max(counts.values()) == 1, "disjoint"
            assert len(counts) == world * share
    # Each batch is full but the last of an epoch.
    for child in ranks:
        sizes = [len(e["indices"]) for e in child.events if e["event"] == "batch"]
        per_epoch = -(-share // batch_size)
        for epoch in range(epochs):
            chunk = sizes[epoch * per_epoch:(epoch + 1) * per_epoch]
            assert chunk[:-1] == [batch_size] * (per_epoch - 1)
            assert sum(chunk) == share


def test_a_rank_killed_mid_epoch_breaks_its_group_for_the_others(serve, children, odd_dataset):
    producer = serve(odd_dataset)
    ranks = [
        children(socket=str(producer.socket), batch_size=10, epochs=1_000_000, pace=0.02,
                 group="job", rank=r, world_size=3, group_timeout=DEADLINE)
        for r in range(3)
    ]
    for child in ranks:
        child.wait_for("batch")
        child.wait_for("batch")
    victim, survivors = ranks[1], [ranks[0], ranks[2]]
    killed_at = time.monotonic()
    victim.kill()
    for child in survivors:
        # A deadline that only a hang reaches; the time it took is printed.
        error = child.wait_for("broken", timeout=10.0)  # fails on any other error
        took = error["t"] - killed_at
        print(f"rank {child.spec['rank']} raised GroupBroken {took:.3f} s after rank 1's SIGKILL")
        assert error["type"] == "GroupBroken"
        assert "rank 1" in error["message"] and '"job"' in error["message"]
        assert error["is_ladle_error"]
        child.release()


@pytest.mark.parametrize("how", ["raise", "exit", "sigint"])
def test_a_rank_that_dies_the_ordinary_way_mid_epoch_breaks_its_group(
    serve, children, odd_dataset, how
):
    # It used to say Leave as the interpreter dropped it: the others read on as if it were
    # done, and its restart joined them at once.
    producer = serve(odd_dataset)
    ranks = [
        children(socket=str(producer.socket), batch_size=5, epochs=1_000_000, pace=0.02,
                 group="job", rank=r, world_size=2, group_timeout=DEADLINE,
                 **({"die_after": 2, "die_how": how} if r == 1 else {}))
        for r in range(2)
    ]
    ranks[1].wait_for("dying")
    assert ranks[1].proc.wait(timeout=DEADLINE) != 0, ranks[1].stderr()
    error = ranks[0].wait_for("broken")
    assert error["type"] == "GroupBroken" and "rank 1" in error["message"], error
    ranks[0].release()


@pytest.mark.parametrize("end", ["epoch end", "close"])
def test_a_rank_that_ends_at_an_epoch_end_or_closes_leaves_its_group_unbroken(
    serve, children, odd_dataset, end
):
    producer = serve(odd_dataset)
    how = {"die_at_epoch_end": True, "die_how": "exit"} if end == "epoch end" else {
        "die_after": 2, "die_how": "close"}
    ranks = [
        children(socket=str(producer.socket), batch_size=5, epochs=3, pace=0.01,
                 group="job", rank=r, world_size=2, group_timeout=DEADLINE,
                 **(how if r == 1 else {}))
        for r in range(2)
    ]
    ranks[1].wait_for("dying")
    ranks[1].proc.wait(timeout=DEADLINE)
    ranks[0].wait_for("done")  # fails on GroupBroken
    ranks[0].release()


def test_a_group_whose_ranks_never_all_join_names_the_missing_ones(serve, odd_dataset):
    import ladle

    producer = serve(odd_dataset)
    started = time.monotonic()
    with pytest.raises(ladle.GroupIncomplete, match=r"rank 1 never joined") as raised:
        ladle.Consumer(producer.socket, 10, group="lonely", rank=0, world_size=2,
                       group_timeout=1.0)
    assert time.monotonic() - started >= 1.0
    assert isinstance(raised.value, ladle.ConnectError)
    assert "lonely" in str(raised.value)


def test_connecting_a_rank_releases_the_gil_while_it_waits_for_the_others(serve, odd_dataset):
    import ladle

    producer = serve(odd_dataset)
    joined: dict[int, ladle.Consumer] = {}
    thread = threading.Thread(target=lambda: joined.__setitem__(
        0, ladle.Consumer(producer.socket, 10, group="gil", rank=0, world_size=2)))
    thread.start()
    count = 0
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        count += 1  # Python work on this thread while rank 0 waits for rank 1
    assert thread.is_alive(), "rank 0 should wait for rank 1"
    assert count > 10_000, "this thread barely ran: the connecting thread holds the GIL"
    joined[1] = ladle.Consumer(producer.socket, 10, group="gil", rank=1, world_size=2)
    thread.join(DEADLINE)
    assert not thread.is_alive()
    assert (joined[0].rank, joined[1].rank) == (0, 1)
    assert len(joined[0]) == len(joined[1]) == 6  # ceil(ceil(101 / 2) / 10)


def test_ctrl_c_interrupts_a_rank_waiting_for_its_group(serve, odd_dataset):
    import ladle

    producer = serve(odd_dataset)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        ladle.Consumer(producer.socket, 10, group="waits", rank=0, world_size=2,
                       group_timeout=DEADLINE)
    timer.join()
    assert time.monotonic() - started < DEADLINE / 2, "interrupted, not timed out"


@pytest.mark.parametrize("restart_producer", [False, True], ids=["same_producer", "restarted_producer"])
def test_a_killed_consumer_resumes_its_epoch_exactly_from_its_saved_state(
    serve, children, even_dataset, tmp_path, restart_producer
):
    producer = serve(even_dataset, "--seed", "7")
    state = tmp_path / "state.pkl"
    first = children(socket=str(producer.socket), batch_size=10, epochs=1, save_after=4,
                     state_out=str(state))
    saved = first.wait_for("saved")
    first.kill()
    before = first.epochs()[0]
    assert len(before) == 40 and len(set(before)) == 40
    assert saved["state"]["delivered"] == 40 and saved["state"]["epoch"] == 0

    if restart_producer:
        producer.stop()
        producer = serve(even_dataset, "--seed", "7", sock=producer.socket)
    second = children(socket=str(producer.socket), batch_size=10, epochs=2,
                      state_in=str(state))
    loaded = second.wait_for("connected")
    assert loaded["state"]["delivered"] == 40, "the loaded position, before the first epoch"
    assert loaded["len"] == 10, "len() is a whole epoch's"
    second.wait_for("done")
    second.release()
    after = second.epochs()
    assert sorted(after[0]) == sorted(set(range(EVEN_LEN)) - set(before)), "the other 60%"
    assert len(after[0]) == 60
    assert sorted(after[1]) == list(range(EVEN_LEN)), "then whole epochs"
    labels = _labels(even_dataset)
    _check_labels(first, labels)
    _check_labels(second, labels)


def test_a_state_of_a_feed_with_another_seed_is_refused_naming_the_seed(serve, even_dataset):
    import ladle

    one, two = serve(even_dataset, "--seed", "1"), serve(even_dataset, "--seed", "2")
    reader = ladle.Consumer(one.socket, 10)
    epoch = iter(reader)
    next(epoch), next(epoch)
    state = reader.state_dict()
    with pytest.raises(ValueError, match="seed"):
        ladle.Consumer(two.socket, 10, state=state)
    other = ladle.Consumer(two.socket, 10)
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(state["ladle_position"])
    got = [int(i) for b in other for i in np.asarray(b.indices)]
    assert sorted(got) == list(range(EVEN_LEN)), "a refused state changes nothing"


def test_state_dict_is_a_plain_picklable_dict_and_bad_states_are_clear_errors(
    serve, even_dataset
):
    import ladle

    producer = serve(even_dataset)
    reader = ladle.Consumer(producer.socket, 10)
    assert (reader.group, reader.rank, reader.world_size, reader.even) == (None,) * 4
    epoch = iter(reader)
    next(epoch)
    state = reader.state_dict()
    assert set(state) == {"ladle_position", "version", "epoch", "delivered", "group", "rank",
                          "world_size"}
    assert type(state) is dict and isinstance(state["ladle_position"], bytes)
    assert (state["version"], state["epoch"], state["delivered"]) == (1, 0, 10)
    assert (state["group"], state["rank"], state["world_size"]) == (None, None, None)
    assert pickle.loads(pickle.dumps(state)) == state

    with pytest.raises(RuntimeError, match="before the first epoch"):
        reader.load_state_dict(state)  # this consumer has begun epoch 0
    fresh = ladle.Consumer(producer.socket, 10)
    with pytest.raises(ValueError, match="not a ladle consumer position"):
        fresh.load_state_dict(b"garbage")
    corrupt = bytearray(state["ladle_position"])
    corrupt[-12] ^= 0xFF
    with pytest.raises(ValueError, match="corrupt"):
        fresh.load_state_dict(corrupt)
    with pytest.raises(ValueError, match="ladle_position"):
        fresh.load_state_dict({"epoch": 0})
    with pytest.raises(TypeError, match="state_dict"):
        fresh.load_state_dict(42)
    # A rank's state is not a whole-epoch consumer's, nor another group's.
    solo = ladle.Consumer(producer.socket, 10, group="solo", rank=0, world_size=1)
    solo_state = solo.state_dict()
    assert (solo_state["group"], solo_state["rank"], solo_state["world_size"]) == ("solo", 0, 1)
    with pytest.raises(ValueError, match="group"):
        fresh.load_state_dict(solo_state)
    with pytest.raises(ValueError, match="solo"):
        ladle.Consumer(producer.socket, 10, group="other", rank=0, world_size=1,
                       state=solo_state)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state, "loaded, not yet begun: the loaded position"
    del reader, epoch, solo  # idle consumers would hold the feed back
    rest = [int(i) for b in fresh for i in np.asarray(b.indices)]
    assert len(rest) == EVEN_LEN - 10 and len(set(rest)) == EVEN_LEN - 10


def _fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def _crafted_position(length: int) -> bytes:
    """A well-formed position (right checksum, nothing delivered) claiming ``length`` samples:
    what an attacker writes in 260 bytes whatever the length says."""
    def text(s: str) -> bytes:
        return len(s).to_bytes(4, "little") + s.encode()

    out = b"LADLEPOS" + (1).to_bytes(4, "little")
    out += text("data") + length.to_bytes(8, "little") + text("classes")
    out += (7).to_bytes(8, "little") + text("transform") + text("schema")
    out += (0).to_bytes(8, "little") + (10).to_bytes(4, "little") + b"\x00\x00"
    out += length.to_bytes(8, "little") + b"\x01\x00"  # a delivered list of no index
    return out + _fnv1a64(out).to_bytes(8, "little")


def test_a_crafted_position_claiming_a_huge_length_is_a_value_error_that_costs_no_memory(
    serve, even_dataset
):
    import resource

    import ladle

    producer = serve(even_dataset)
    fresh = ladle.Consumer(producer.socket, 10)
    for length in (1 << 33, 1 << 36, 1 << 40):
        crafted = _crafted_position(length)
        assert len(crafted) < 300
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
        with pytest.raises(ValueError, match="length"):
            fresh.load_state_dict(crafted)
        with pytest.raises(ValueError, match="length"):
            ladle.Consumer(producer.socket, 10, state=crafted)
        grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        # 2^33 bits are 1 GiB: refused by its length before any of it is allocated.
        assert grown_mib < 256, f"{length}: the peak grew by {grown_mib:.0f} MiB"
    del fresh


def test_group_arguments_default_to_torchruns_variables_and_bad_ones_are_value_errors(
    serve, even_dataset, monkeypatch
):
    import ladle

    producer = serve(even_dataset)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="RANK.*WORLD_SIZE"):
        ladle.Consumer(producer.socket, 10, group="job")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match=r"rank= \(or \$RANK\)") as raised:
        ladle.Consumer(producer.socket, 10, group="job")
    assert "world_size= (or $WORLD_SIZE)" not in str(raised.value)
    # Lightning's launcher sets WORLD_SIZE but no RANK: the message says what to pass there.
    assert "rank=self.global_rank" in str(raised.value)
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match=r"\$RANK is 'zero'|\$RANK is \"zero\""):
        ladle.Consumer(producer.socket, 10, group="job")
    monkeypatch.setenv("RANK", "0")
    consumer = ladle.Consumer(producer.socket, 10, group="job")
    assert (consumer.group, consumer.rank, consumer.world_size, consumer.even) == (
        "job", 0, 1, "pad")
    assert "group=\"job\", rank=0, world_size=1" in repr(consumer)
    del consumer
    with pytest.raises(ValueError, match="pad.*drop"):
        ladle.Consumer(producer.socket, 10, group="job", even="even")
    with pytest.raises(ValueError, match="rank and world_size"):
        ladle.Consumer(producer.socket, 10, rank=0, world_size=1)
    with pytest.raises(ValueError, match="out of range"):
        ladle.Consumer(producer.socket, 10, group="job", rank=2, world_size=2)
    with pytest.raises(ValueError, match="group_timeout"):
        ladle.Consumer(producer.socket, 10, group="job", group_timeout=0)


def test_ranks_take_slurms_variables_and_a_nodes_feed_waits_for_its_local_ranks_only(
    serve, even_dataset, monkeypatch
):
    import threading

    import ladle

    producer = serve(even_dataset)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE",
                "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NODEID"):
        monkeypatch.delenv(var, raising=False)
    # A task of `srun -n 1`: Slurm's variables say rank and world size.
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    consumer = ladle.Consumer(producer.socket, 10, group="slurm")
    assert (consumer.rank, consumer.world_size) == (0, 1)
    n = consumer.dataset_len
    consumer.close()
    # Ranks 2 and 3 of 4, two on this node ($LOCAL_WORLD_SIZE, as torchrun sets it, read
    # even though rank and world size are passed): they start without ranks 0 and 1, whose
    # node has a feed of its own, and read half of each epoch between them.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    read = {}

    def rank(r):
        with ladle.Consumer(producer.socket, 10, group="two-nodes", rank=r, world_size=4,
                            group_timeout=60) as c:
            read[r] = [int(i) for batch in c for i in np.asarray(batch.indices)]

    threads = [threading.Thread(target=rank, args=(r,)) for r in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(read) == [2, 3], read
    assert len(read[2]) == len(read[3]) == -(-n // 4), (n, len(read[2]))
    assert len(set(read[2]) | set(read[3])) == 2 * len(read[2]), "the two shares overlap"
    with pytest.raises(ValueError, match="local_world_size must be at least 1"):
        ladle.Consumer(producer.socket, 10, group="x", rank=0, world_size=2, local_world_size=0)
    # A bad variable is named.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(ladle.ConnectError, match=r"\$LOCAL_WORLD_SIZE=\"two\""):
        ladle.Consumer(producer.socket, 10, group="y", rank=0, world_size=2)


def test_a_group_resumed_on_fewer_ranks_from_every_ranks_state_delivers_the_rest_once(
    serve, even_dataset
):
    import threading

    import ladle

    producer = serve(even_dataset)
    n = EVEN_LEN
    states, before = {}, []

    def first(r):
        with ladle.Consumer(producer.socket, 5, group="elastic", rank=r, world_size=4,
                            local_world_size=4, group_timeout=60) as c:
            epoch = iter(c)
            for _ in range(r + 1):
                before.extend(int(i) for i in np.asarray(next(epoch).indices))
            states[r] = c.state_dict()

    threads = [threading.Thread(target=first, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(states) == [0, 1, 2, 3]
    saved = [states[r] for r in range(4)]  # what rank 0 gathers into the checkpoint
    after = {}

    def second(r):
        with ladle.Consumer(producer.socket, 5, group="elastic", rank=r, world_size=2,
                            local_world_size=2, group_timeout=60, state=saved) as c:
            after[r] = [int(i) for b in c for i in np.asarray(b.indices)]

    threads = [threading.Thread(target=second, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(after) == [0, 1]
    rest = after[0] + after[1]
    assert len(after[0]) == len(after[1]), "equal shares"
    assert not set(rest) & set(before), "an index delivered before the requeue came again"
    assert set(rest) | set(before) == set(range(n))
    assert len(rest) <= n - len(before) + 1, "at most pad's one repeat"
    # A group's states with a rank missing are refused, naming it.
    with ladle.Consumer(producer.socket, 5, group="elastic", rank=0, world_size=1,
                        local_world_size=1) as c:
        with pytest.raises(ValueError, match="lacks rank 3 of 4"):
            c.load_state_dict(saved[:3])


def test_a_ddp_job_killed_mid_epoch_and_restarted_from_its_ranks_states_delivers_each_index_as_the_pad_rule_allows(  # noqa: E501
    serve, children, odd_dataset, tmp_path
):
    producer = serve(odd_dataset)
    world, batch_size = 2, 5
    share = _share(ODD_LEN, world, "pad")  # 51: 11 batches, 5 of them about half
    states = [tmp_path / f"rank{r}.pkl" for r in range(world)]
    first = [
        children(socket=str(producer.socket), batch_size=batch_size, epochs=1, save_after=5,
                 state_out=str(states[r]), group="job", rank=r, world_size=world)
        for r in range(world)
    ]
    for child in first:
        assert child.wait_for("saved")["state"]["delivered"] == 25
    for child in first:
        child.kill()
    second = [
        children(socket=str(producer.socket), batch_size=batch_size, epochs=2,
                 state_in=str(states[r]), group="job", rank=r, world_size=world)
        for r in range(world)
    ]
    for child in second:
        child.wait_for("done")
    for child in second:
        child.release()

    labels = _labels(odd_dataset)
    counts: Counter[int] = Counter()
    for before, after in zip(first, second):
        _check_labels(before, labels)
        _check_labels(after, labels)
        mine = before.epochs()[0] + after.epochs()[0]
        assert len(mine) == share and len(set(mine)) == share, "each rank its whole share once"
        counts.update(mine)
        assert len(after.epochs()[1]) == share, "then whole shares"
    assert set(counts) == set(range(ODD_LEN))
    assert sum(counts.values()) == world * share
    assert Counter(counts.values()) == {1: ODD_LEN - (world * share - ODD_LEN),
                                        2: world * share - ODD_LEN}
    # The epoch after the restart is whole too, split the same way.
    later = Counter(i for child in second for i in child.epochs()[1])
    assert set(later) == set(range(ODD_LEN)) and sum(later.values()) == world * share


class _Crash(Exception):
    """A training loop's own error: not reported, left to end the process."""


def _die(how: str, consumer) -> None:
    """Ends a rank the ordinary ways a training loop ends, leaving the consumer to the
    interpreter: an exception, sys.exit(1), Ctrl-C; or closes it first."""
    if how == "raise":
        raise _Crash("the loss is NaN")
    if how == "exit":
        sys.exit(1)
    if how == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(DEADLINE)  # KeyboardInterrupt comes first
    if how == "close":
        consumer.close()
        sys.exit(0)
    raise AssertionError(how)


def child(spec: dict) -> None:
    """One reader process: connects as `spec` says (loading the pickled state `state_in`),
    reads `epochs` epochs (pausing `pace` seconds per batch), reporting each batch; after
    `save_after` batches it pickles `state_dict()` to `state_out`, says "saved" and waits to
    be killed. After `die_after` batches (or at the end of its first epoch, with
    `die_at_epoch_end`) it says "dying" and ends as `die_how` says (`_die`). At the end it
    says "done" and waits for stdin to close."""
    import numpy as np

    import ladle

    def emit(event: str, **fields) -> None:
        print(json.dumps({"event": event, **fields}), flush=True)

    state = None
    if spec.get("state_in"):
        with open(spec["state_in"], "rb") as f:
            state = pickle.load(f)
    try:
        consumer = ladle.Consumer(
            spec["socket"], spec["batch_size"], group=spec.get("group"),
            rank=spec.get("rank"), world_size=spec.get("world_size"),
            even=spec.get("even", "pad"), group_timeout=spec.get("group_timeout", DEADLINE),
            state=state,
        )
        now = consumer.state_dict()
        del now["ladle_position"]
        emit("connected", len=len(consumer), group=consumer.group, rank=consumer.rank,
             world_size=consumer.world_size, even=consumer.even, state=now)
        batches = 0
        for _ in range(spec["epochs"]):
            for batch in consumer:
                emit("batch", epoch=batch.epoch, indices=np.asarray(batch.indices).tolist(),
                     labels=np.asarray(batch.labels).tolist())
                del batch
                batches += 1
                if batches == spec.get("save_after"):
                    saved = consumer.state_dict()
                    partial = spec["state_out"] + ".partial"
                    with open(partial, "wb") as f:
                        pickle.dump(saved, f)
                    os.replace(partial, spec["state_out"])
                    del saved["ladle_position"]
                    emit("saved", state=saved)
                    sys.stdin.read()  # killed here
                if batches == spec.get("die_after"):
                    emit("dying")
                    _die(spec["die_how"], consumer)
                time.sleep(spec.get("pace", 0))
            if spec.get("die_at_epoch_end"):
                emit("dying")
                _die(spec["die_how"], consumer)
    except _Crash:
        raise
    except ladle.GroupBroken as error:
        emit("broken", type=type(error).__name__, message=str(error), t=time.monotonic(),
             is_ladle_error=isinstance(error, ladle.LadleError))
    except Exception as error:  # noqa: BLE001 - reported to the test
        emit("error", type=type(error).__name__, message=str(error))
    else:
        emit("done")
    sys.stdin.read()


if __name__ == "__main__":
    child(json.loads(sys.argv[1]))
