"""The consumer, unchanged, as the training iterable of PyTorch Lightning's ``Trainer.fit`` and
of an HF Accelerate loop: single-process, every epoch the model sees every sample once; under
DDP (2 processes on CPU, gloo), the ranks' shares of every epoch are disjoint and together the
whole epoch. Optional, like the torch tests: skipped where torch, lightning or accelerate is
missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ladle
from conftest import DATASET_LEN, IMAGE

torch = pytest.importorskip("torch")


def tiny_model():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(IMAGE * IMAGE * 3, 10))


def step(model, batch, seen):
    """One training step on a ladle batch; records its indices."""
    seen.extend(np.asarray(batch.indices).tolist())
    images, labels = ladle.to_torch(batch)
    logits = model(images.float() / 255.0)
    return torch.nn.functional.cross_entropy(logits, labels.long())


def test_lightning_trainer_fit_takes_the_consumer_as_train_dataloaders(producer, tmp_path):
    lightning = pytest.importorskip("lightning")
    seen: list[int] = []

    class Module(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = tiny_model()

        def training_step(self, batch, batch_idx):
            return step(self.model, batch, seen)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    consumer = ladle.Consumer(producer.socket, 64)
    trainer = lightning.Trainer(
        max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )
    trainer.fit(Module(), train_dataloaders=consumer)
    assert sorted(seen[:DATASET_LEN]) == list(range(DATASET_LEN))
    assert sorted(seen[DATASET_LEN:]) == list(range(DATASET_LEN))
    assert len(seen) == 2 * DATASET_LEN


def test_an_accelerate_loop_takes_the_consumer_as_it_is(producer):
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True)
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    consumer = ladle.Consumer(producer.socket, 64)
    # prepare() wraps the model and optimizer; the consumer passes through unchanged.
    model, optimizer, loader = accelerator.prepare(model, optimizer, consumer)
    assert loader is consumer
    for _epoch in range(2):
        seen: list[int] = []
        for batch in loader:
            loss = step(model, batch, seen)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
        assert sorted(seen) == list(range(DATASET_LEN))


DDP_SCRIPT = Path(__file__).with_name("ddp_frameworks.py")
DDP_BATCH = 50  # each rank's 300 samples of an epoch in 6 whole batches
DDP_EPOCHS = 2


def _run_ddp_job(command: list[str]) -> None:
    """Runs a 2-process DDP job to its end (a hang guard of 10 minutes kills its whole session)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    job = subprocess.Popen(command, env=env, start_new_session=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = job.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        out, _ = job.communicate()
        pytest.fail(f"the DDP job did not end within 10 minutes:\n{out.decode()[-4000:]}")
    assert job.returncode == 0, out.decode()[-4000:]


def _assert_ranks_share_each_epoch(record: Path) -> None:
    ranks = [Path(f"{record}.rank{rank}").read_text().splitlines() for rank in range(2)]
    for rank, epochs in enumerate(ranks):
        assert len(epochs) == DDP_EPOCHS, f"rank {rank} recorded {len(epochs)} epochs"
    for epoch in range(DDP_EPOCHS):
        shares = [[int(i) for i in ranks[rank][epoch].split()] for rank in range(2)]
        assert [len(share) for share in shares] == [DATASET_LEN // 2] * 2, (epoch, shares)
        assert not set(shares[0]) & set(shares[1]), f"epoch {epoch}: the ranks overlap"
        assert sorted(shares[0] + shares[1]) == list(range(DATASET_LEN)), f"epoch {epoch}"


def test_lightning_ddp_ranks_each_train_their_own_share_of_every_epoch(producer, tmp_path):
    pytest.importorskip("lightning")
    record = tmp_path / "indices"
    _run_ddp_job([sys.executable, str(DDP_SCRIPT), "lightning", str(producer.socket),
                  str(record), str(DDP_BATCH), str(DDP_EPOCHS), str(IMAGE)])
    _assert_ranks_share_each_epoch(record)


def test_accelerate_ddp_ranks_each_train_their_own_share_of_every_epoch(producer, tmp_path):
    pytest.importorskip("accelerate")
    record = tmp_path / "indices"
    _run_ddp_job([sys.executable, "-m", "torch.distributed.run", "--standalone",
                  "--nproc_per_node", "2", str(DDP_SCRIPT), "accelerate", str(producer.socket),
                  str(record), str(DDP_BATCH), str(DDP_EPOCHS), str(IMAGE)])
    _assert_ranks_share_each_epoch(record)
