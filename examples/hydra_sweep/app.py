#!/usr/bin/env python3
"""A Hydra multirun whose jobs share one ladle feed, run in parallel by the joblib launcher.

    pip install ladle hydra-core hydra-joblib-launcher
    ladle dataset generate --format cifar10 --count 2000 --out /tmp/cifar
    cd examples/hydra_sweep
    python app.py -m hydra/launcher=joblib hydra.launcher.n_jobs=3 data=/tmp/cifar \
        lr=0.01,0.1,0.3 batch_size=32,128

Each job names the data in its consumer line; the callback in config.yaml holds the feed for
the whole multirun and prints its figures at the end (the joblib launcher pickles callbacks:
a `ladle.feed` handle pickles as a reference to the feed).
"""

from __future__ import annotations

import json

import hydra
import numpy as np
from hydra.experimental.callback import Callback

import ladle


class FeedCallback(Callback):
    """Holds the node's feed for the multirun; prints what it decoded and what jobs read."""

    def __init__(self, data: str, image_size: int) -> None:
        self.data, self.image_size, self.feed = data, image_size, None

    def on_multirun_start(self, config, **kwargs) -> None:
        self.feed = ladle.feed(self.data, image_size=self.image_size).open()

    def on_multirun_end(self, config, **kwargs) -> None:
        stats = self.feed.stats()
        print(json.dumps({"published": stats["published"], "consumed": stats["consumed"]}))
        self.feed.close()


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(cfg) -> float:
    weights = np.zeros((192, 10), dtype=np.float32)
    loss = float("nan")
    with ladle.Consumer(dataset=cfg.data, image_size=cfg.image_size,
                        batch_size=cfg.batch_size) as consumer:
        for _ in range(cfg.epochs):
            for batch in consumer:
                images = np.asarray(batch.images)
                x = images.reshape(len(images), 8, 4, 8, 4, 3).mean(axis=(2, 4)).reshape(len(images), -1) / 255.0
                y = np.asarray(batch.labels)
                logits = x @ weights
                p = np.exp(logits - logits.max(axis=1, keepdims=True))
                p /= p.sum(axis=1, keepdims=True)
                loss = float(-np.log(p[np.arange(len(y)), y] + 1e-9).mean())
                p[np.arange(len(y)), y] -= 1.0
                weights -= cfg.lr * (x.T @ p).astype(np.float32) / len(y)
    print(json.dumps({"lr": cfg.lr, "batch_size": cfg.batch_size, "loss": loss}))
    return loss


if __name__ == "__main__":
    main()
