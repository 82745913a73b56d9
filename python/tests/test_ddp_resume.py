"""A real DDP training loop: ``torchrun --nproc_per_node 2 examples/train_resnet18.py --ddp``
on CPU (gloo) over a ladle feed, killed after 1.5 epochs and resumed from its checkpoint:
across both runs and both ranks, every index is trained exactly once per epoch.

Skipped without torch and torchvision (CI installs numpy and pytest only).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, Producer, generate_cifar

pytest.importorskip("torch")
pytest.importorskip("torchvision")

N = 96
BATCH = 8
WORLD = 2
STEPS_PER_EPOCH = N // WORLD // BATCH  # 6: the share divides into whole batches
# The first checkpoint comes after 1.5 epochs, mid-epoch; the next only 1.5 epochs later.
CHECKPOINT_EVERY = STEPS_PER_EPOCH * 3 // 2


def _torchrun(socket: Path, ckpt: Path, record: Path, steps: int) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc_per_node", str(WORLD),
        str(REPO / "examples" / "train_resnet18.py"), "--ddp", "--device", "cpu",
        "--socket", str(socket), "--batch-size", str(BATCH), "--steps", str(steps),
        "--checkpoint", str(ckpt), "--checkpoint-every", str(CHECKPOINT_EVERY),
        "--record-indices", str(record),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(command, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _descendants(root: int) -> list[int]:
    """The processes below ``root`` (from /proc), children before grandchildren."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL to ``proc`` and every descendant (torchrun starts its workers in sessions of
    their own), then reaps it."""
    for pid in [proc.pid, *_descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)


def _steps_recorded(record: Path, rank: int) -> dict[int, list[int]]:
    """Step → indices, the last line written for each step winning (a resumed run trains
    again the steps after its checkpoint)."""
    steps: dict[int, list[int]] = {}
    path = Path(f"{record}.rank{rank}")
    if path.exists():
        for line in path.read_text().splitlines():
            step, *indices = line.split()
            steps[int(step)] = [int(i) for i in indices]
    return steps


def test_a_ddp_job_killed_after_one_and_a_half_epochs_resumes_and_trains_each_index_once_per_epoch(
    ladle_bin: Path, tmp_path: Path
):
    data = tmp_path / "cifar"
    generate_cifar(ladle_bin, data, N)
    producer = Producer(ladle_bin, data, tmp_path / "feed.sock", "--ring-mib", "1")
    ckpt, record = tmp_path / "ckpt.pt", tmp_path / "indices"
    epochs = 3
    try:
        # First run: killed (the whole torchrun group, SIGKILL) as soon as its checkpoint after
        # 1.5 epochs exists.
        first = _torchrun(producer.socket, ckpt, record, epochs * STEPS_PER_EPOCH)
        deadline = time.monotonic() + 300
        while not ckpt.exists():
            assert first.poll() is None, first.stdout.read().decode()
            assert time.monotonic() < deadline, "the first run never reached 1.5 epochs"
            time.sleep(0.01)
        _kill_tree(first)
        import torch
        saved = torch.load(ckpt, weights_only=False)
        # Mid-epoch, or this test would not show that the position is resumed.
        assert saved["step"] == CHECKPOINT_EVERY, saved["step"]
        assert saved["step"] % STEPS_PER_EPOCH != 0
        # Second run: the same command resumes from the checkpoint and finishes.
        second = _torchrun(producer.socket, ckpt, record, epochs * STEPS_PER_EPOCH)
        out, _ = second.communicate(timeout=600)
        assert second.returncode == 0, out.decode()
    finally:
        producer.stop()
    for epoch in range(epochs):
        trained: list[int] = []
        for rank in range(WORLD):
            steps = _steps_recorded(record, rank)
            for step in range(epoch * STEPS_PER_EPOCH, (epoch + 1) * STEPS_PER_EPOCH):
                trained += steps[step]
        assert sorted(trained) == list(range(N)), f"epoch {epoch}: not every index once"


def _torchrun_node(socket: Path, ckpt: Path, record: Path, steps: int, *, nodes: int,
                   node_rank: int, port: int, batch: int, every: int) -> subprocess.Popen:
    """One node's ``torchrun`` (2 ranks) of a job over ``nodes`` nodes, its ranks on that
    node's feed (``socket``); ``LOCAL_WORLD_SIZE`` (torchrun's) tells the feed to wait for
    them only."""
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(nodes), "--node_rank", str(node_rank), "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(port),
        str(REPO / "examples" / "train_resnet18.py"), "--ddp", "--device", "cpu",
        "--socket", str(socket), "--batch-size", str(batch), "--steps", str(steps),
        "--group", "two-nodes", "--group-timeout", "120",
        "--checkpoint", str(ckpt), "--checkpoint-every", str(every),
        "--record-indices", str(record),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(command, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_a_ddp_job_over_two_nodes_killed_mid_epoch_resumes_on_one_node_with_half_the_ranks(
    ladle_bin: Path, tmp_path: Path
):
    """Two "nodes" (a torchrun and a feed each) of 2 ranks, killed mid-epoch; resumed from
    the checkpoint on one node with world size 2: the rest of the saved epoch is dealt over
    the two ranks, and every index is trained exactly once in that epoch."""
    import socket as socketlib

    n, batch, world = 96, 4, 4
    steps_per_epoch = n // world // batch  # 6
    every = steps_per_epoch // 2  # the checkpoint after 3 steps: mid-epoch
    data = tmp_path / "cifar"
    generate_cifar(ladle_bin, data, n)
    feeds = [Producer(ladle_bin, data, tmp_path / f"node{k}.sock", "--ring-mib", "1")
             for k in range(2)]
    ckpt, record = tmp_path / "ckpt.pt", tmp_path / "indices"
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        nodes = [_torchrun_node(feeds[k].socket, ckpt, record, 3 * steps_per_epoch, nodes=2,
                                node_rank=k, port=port, batch=batch, every=every)
                 for k in range(2)]
        deadline = time.monotonic() + 300
        while not ckpt.exists():
            for node in nodes:
                assert node.poll() is None, node.stdout.read().decode()
            assert time.monotonic() < deadline, "the first run never reached its checkpoint"
            time.sleep(0.01)
        for node in nodes:
            _kill_tree(node)
        import torch
        saved = torch.load(ckpt, weights_only=False)
        assert saved["step"] == every and len(saved["feed"]) == world, saved["step"]
        # Each node's feed decoded about its ranks' half of what was read, not all of it.
        # Resumed on one node, half the ranks: every rank's state from the checkpoint.
        second = _torchrun_node(feeds[0].socket, ckpt, record, every + 2 * steps_per_epoch,
                                nodes=1, node_rank=0, port=port + 1, batch=batch, every=1000)
        out, _ = second.communicate(timeout=600)
        assert second.returncode == 0, out.decode()
    finally:
        for feed in feeds:
            feed.stop()
    # Epoch 0: the first run's steps before the checkpoint, all four ranks; then the resumed
    # run's rest of the epoch (its first 2 · 6 steps after the checkpoint: 48 samples over 2
    # ranks of batches of 4), ranks 0 and 1 (their later lines win over the killed run's).
    trained: list[int] = []
    for rank in range(world):
        steps = _steps_recorded(record, rank)
        trained += [i for step in range(every) for i in steps[step]]
    left = n - len(trained)
    resumed_steps = left // 2 // batch
    for rank in range(2):
        steps = _steps_recorded(record, rank)
        trained += [i for step in range(every, every + resumed_steps) for i in steps[step]]
    assert sorted(trained) == list(range(n)), "epoch 0: not every index once"
