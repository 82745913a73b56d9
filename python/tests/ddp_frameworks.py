"""One DDP job on CPU (gloo, 2 processes) that trains on a ladle feed through PyTorch Lightning or
HF Accelerate, as ``test_frameworks.py`` runs it; each rank writes the indices it trained, one
line per epoch, to ``RECORD.rankN``.

    python ddp_frameworks.py lightning SOCKET RECORD BATCH EPOCHS IMAGE
    python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        ddp_frameworks.py accelerate SOCKET RECORD BATCH EPOCHS IMAGE

Lightning starts its second process itself (``strategy="ddp"`` re-runs this command); under
Accelerate the launcher (torchrun, or ``accelerate launch``) does. The one line each needs is
the consumer's: a ``group`` and the framework's rank and world size.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

import ladle


def tiny_model(image: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(image * image * 3, 10))


def loss_of(model, batch, seen: list[int]):
    seen.extend(np.asarray(batch.indices).tolist())
    images, labels = ladle.to_torch(batch)
    return torch.nn.functional.cross_entropy(model(images.float() / 255.0), labels.long())


def record_epoch(record: str, rank: int, seen: list[int]) -> None:
    with Path(f"{record}.rank{rank}").open("a") as out:
        out.write(" ".join(map(str, seen)) + "\n")
    seen.clear()


def lightning_job(socket: str, record: str, batch: int, epochs: int, image: int) -> None:
    import lightning

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_model(image)
            self.seen: list[int] = []

        def train_dataloader(self):
            # The one line: Lightning sets no $RANK in the processes it starts, so say it.
            return ladle.Consumer(socket, batch, group="lightning", rank=self.global_rank,
                                  world_size=self.trainer.world_size)

        def training_step(self, batch, batch_idx):
            return loss_of(self.model, batch, self.seen)

        def on_train_epoch_end(self) -> None:
            record_epoch(record, self.global_rank, self.seen)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = lightning.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=epochs, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=str(Path(record).parent),
    )
    trainer.fit(Module())


def accelerate_job(socket: str, record: str, batch: int, epochs: int, image: int) -> None:
    import accelerate

    accelerator = accelerate.Accelerator(cpu=True)
    model = tiny_model(image)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # The one line: this rank's share of each epoch. (Under torchrun or `accelerate launch`
    # $RANK and $WORLD_SIZE are set, so `group=` alone would do; saying it is clearer.)
    consumer = ladle.Consumer(socket, batch, group="accelerate",
                              rank=accelerator.process_index,
                              world_size=accelerator.num_processes)
    model, optimizer, loader = accelerator.prepare(model, optimizer, consumer)
    assert loader is consumer, "prepare() should pass the consumer through unchanged"
    seen: list[int] = []
    for _epoch in range(epochs):
        for batch_ in loader:
            loss = loss_of(model, batch_, seen)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
        record_epoch(record, accelerator.process_index, seen)
    accelerator.wait_for_everyone()


def main() -> None:
    framework, socket, record = sys.argv[1:4]
    batch, epochs, image = (int(a) for a in sys.argv[4:7])
    torch.manual_seed(0)
    {"lightning": lightning_job, "accelerate": accelerate_job}[framework](
        socket, record, batch, epochs, image)


if __name__ == "__main__":
    main()
