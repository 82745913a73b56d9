"""The consumer, unchanged, as the training iterable of PyTorch Lightning's ``Trainer.fit`` and
of an HF Accelerate loop, single-process: every epoch the model sees every sample once.
Optional, like the torch tests: skipped where torch, lightning or accelerate is missing."""

from __future__ import annotations

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
