#!/usr/bin/env python3
"""An Optuna study whose trials share one ladle feed: each trial names the data, and the
first to ask starts the node's feed of it; the feed stops by itself after the last trial.

The model is a numpy softmax regression on 8×8 average-pooled images, so that the example
runs anywhere in seconds; in a real study the loop body is your PyTorch step, and the one
ladle line is the same::

    pip install ladle optuna
    ladle dataset generate --format cifar10 --count 2000 --out /tmp/cifar
    python examples/optuna_sweep.py --dataset /tmp/cifar --trials 8 --jobs 4

Trials run as threads (``n_jobs``) here; ``--storage journal.log`` puts the study in a
journal file that any number of worker processes (started at any time, on this node) share:
run the same command in another shell and both feed from one pipeline. Pruned trials leave
their feed at once (a ``with ladle.Consumer(...)`` block closes on the exception).

It prints one JSON line: the best trial, and the feed's figures: samples decoded
(``published``) and samples the trials read (``consumed``).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import optuna

import ladle

IMAGE = 32


def features(images: np.ndarray) -> np.ndarray:
    """[B, 32, 32, 3] uint8 → [B, 192] float: 8×8 average pooling, scaled to 0..1."""
    b = images.shape[0]
    pooled = images.reshape(b, 8, 4, 8, 4, 3).mean(axis=(2, 4), dtype=np.float32)
    return pooled.reshape(b, -1) / 255.0


def objective(trial: optuna.Trial, args) -> float:
    lr = trial.suggest_float("lr", 1e-3, 1.0, log=True)
    batch_size = trial.suggest_categorical("batch_size", [32, 64, 128])
    weights = np.zeros((192, 10), dtype=np.float32)
    loss = float("inf")
    # The one ladle line: the node's feed of this dataset, transform and seed.
    with ladle.Consumer(
        dataset=args.dataset, image_size=IMAGE, transform=args.transform, seed=args.seed,
        batch_size=batch_size,
    ) as consumer:
        for epoch in range(args.epochs):
            losses = []
            for batch in consumer:
                x = features(np.asarray(batch.images))
                y = np.asarray(batch.labels)
                logits = x @ weights
                logits -= logits.max(axis=1, keepdims=True)
                p = np.exp(logits)
                p /= p.sum(axis=1, keepdims=True)
                losses.append(float(-np.log(p[np.arange(len(y)), y] + 1e-9).mean()))
                p[np.arange(len(y)), y] -= 1.0
                weights -= lr * (x.T @ p) / len(y)
            loss = float(np.mean(losses))
            trial.report(loss, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()
    return loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--transform", default="RandomCrop(32, padding=4), RandomHorizontalFlip()")
    parser.add_argument("--seed", type=int, default=0, help="the feed's seed: one feed per seed")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=4, help="trials at once (threads)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--storage", help="a journal file shared by worker processes")
    parser.add_argument("--study", default="ladle-example")
    args = parser.parse_args()

    storage = None
    if args.storage:
        storage = optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(args.storage)
        )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=args.study, storage=storage, load_if_exists=True,
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2),
    )
    # A driver that wants the feed's figures holds it for the study (the trials still name
    # the data themselves); leaving the block lets it go.
    with ladle.feed(args.dataset, image_size=IMAGE, transform=args.transform, seed=args.seed) as feed:
        study.optimize(lambda t: objective(t, args), n_trials=args.trials, n_jobs=args.jobs)
        stats = feed.stats()
    print(json.dumps({
        "best": study.best_params, "best_loss": study.best_value,
        "trials": len(study.trials),
        "pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials),
        "published": stats["published"], "consumed": stats["consumed"],
    }))


if __name__ == "__main__":
    main()
