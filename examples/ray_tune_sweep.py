#!/usr/bin/env python3
"""A Ray Tune search whose trials share one ladle feed, with ASHA stopping the weak ones
mid-epoch and checkpoints that hold the consumer's position (so a restored or PBT-cloned
trial resumes its epoch exactly).

The model is a numpy softmax regression on 8×8 pooled images, so the example runs anywhere;
in a real search the loop body is your PyTorch step::

    pip install ladle "ray[tune]"
    ladle dataset generate --format cifar10 --count 2000 --out /tmp/cifar
    python examples/ray_tune_sweep.py --dataset /tmp/cifar --trials 6

Each trial names the data (``ladle.Consumer(dataset=...)``): the first starts the node's feed
of it, a process of its own that outlives the trial's worker and stops 30 s after the last
trial. It prints the best config and each trial's last result.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np
from ray import tune
from ray.tune.schedulers import ASHAScheduler

import ladle


def features(images: np.ndarray) -> np.ndarray:
    b = images.shape[0]
    return images.reshape(b, 8, 4, 8, 4, 3).mean(axis=(2, 4), dtype=np.float32).reshape(b, -1) / 255.0


def trainable(config):
    weights = np.zeros((192, 10), dtype=np.float32)
    state, epoch = None, 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:  # restored (a retry, or a PBT clone): model and data position together
        with checkpoint.as_directory() as d:
            saved = json.load(open(os.path.join(d, "state.json")))
        weights = np.array(saved["weights"], dtype=np.float32)
        state, epoch = bytes.fromhex(saved["ladle"]), saved["epoch"]
    with ladle.Consumer(dataset=config["dataset"], image_size=32,
                        batch_size=config["batch_size"], state=state) as consumer:
        while epoch < config["epochs"]:
            for step, batch in enumerate(consumer):
                x, y = features(np.asarray(batch.images)), np.asarray(batch.labels)
                logits = x @ weights
                p = np.exp(logits - logits.max(axis=1, keepdims=True))
                p /= p.sum(axis=1, keepdims=True)
                loss = float(-np.log(p[np.arange(len(y)), y] + 1e-9).mean())
                p[np.arange(len(y)), y] -= 1.0
                weights -= config["lr"] * (x.T @ p) / len(y)
                if step % 10 == 9:  # report (and checkpoint) mid-epoch: ASHA may stop us here
                    with tempfile.TemporaryDirectory() as d:
                        with open(os.path.join(d, "state.json"), "w") as f:
                            json.dump({"weights": weights.tolist(), "epoch": epoch,
                                       "ladle": consumer.state_dict()["ladle_position"].hex()}, f)
                        tune.report({"loss": loss, "epoch": epoch},
                                    checkpoint=tune.Checkpoint.from_directory(d))
            epoch += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space={
            "dataset": os.path.abspath(args.dataset), "epochs": args.epochs,
            "lr": tune.loguniform(1e-3, 1.0), "batch_size": tune.choice([32, 64, 128]),
        },
        tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=args.trials,
                                    scheduler=ASHAScheduler(grace_period=2)),
    )
    results = tuner.fit()
    best = results.get_best_result()
    print(json.dumps({"best": {k: best.config[k] for k in ("lr", "batch_size")},
                      "loss": best.metrics["loss"], "trials": len(results)}))


if __name__ == "__main__":
    main()
