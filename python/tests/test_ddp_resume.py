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
        # torchrun starts its workers in sessions of their own: kill every descendant.
        for pid in [first.pid, *_descendants(first.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        first.wait(timeout=60)
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
