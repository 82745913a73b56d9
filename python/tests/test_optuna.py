"""Optuna studies sharing one feed (issue 42), with the real package: trials as threads of one
process with pruning mid-epoch, and trials as worker processes on one journal file, started at
different times (as W&B agents are), each naming the data. Every finished epoch of every
trial is exact, the feed decoded fewer samples than the trials read, pruned trials never held
the feed back, and nothing of ladle is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import ladle

from feeds_support import exact_epoch, wait_gone

optuna = pytest.importorskip("optuna", reason="optuna is not installed (scripts/check installs it)")

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
IMAGE = 32


def test_optuna_trials_as_threads_share_one_feed_and_pruned_ones_leave_it_at_once(
    registry, feed_data
):
    data, n = feed_data
    epochs: dict[int, list[list[int]]] = {}

    def objective(trial):
        lr = trial.suggest_float("lr", 1e-3, 1.0, log=True)
        batch_size = trial.suggest_categorical("batch_size", [16, 32, 64])
        doomed = trial.number % 3 == 1
        finished = epochs.setdefault(trial.number, [])
        with ladle.Consumer(dataset=data, image_size=IMAGE, batch_size=batch_size,
                            idle_timeout=0.5) as consumer:
            for epoch in range(3):
                seen = []
                for step, batch in enumerate(consumer):
                    seen.extend(np.asarray(batch.indices).tolist())
                    if step == 5:
                        # A doomed trial reports a hopeless loss mid-epoch and is pruned there.
                        trial.report(100.0 if doomed else lr, epoch * 1000 + step)
                        if trial.should_prune():
                            raise optuna.TrialPruned()
                finished.append(seen)
        return lr

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=10.0))
    with ladle.feed(data, image_size=IMAGE, idle_timeout=0.5) as feed:
        study.optimize(objective, n_trials=9, n_jobs=3)
        stats = feed.stats()
        key = feed.entry["key"]
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.PRUNED) == 3, states
    assert states.count(optuna.trial.TrialState.COMPLETE) == 6, states
    for number, done in epochs.items():
        for seen in done:
            exact_epoch(seen, n)
        assert len(done) == (0 if number % 3 == 1 else 3), (number, len(done))
    assert stats["joins"] == 9
    assert stats["let_gos"] == 0, f"a pruned trial held the feed back: {stats}"
    assert stats["published"] < stats["consumed"], stats
    wait_gone(registry, key)


WORKER = r"""
import json, sys
import numpy as np
import optuna
import ladle

import os, time
from pathlib import Path
data, journal, out, trials = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
me, workers = int(sys.argv[5]), int(sys.argv[6])
gate = Path(out).parent
first = [True]
storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(journal))
study = optuna.load_study(study_name="shared", storage=storage)

def objective(trial):
    batch_size = trial.suggest_categorical("batch_size", [16, 32, 64])
    if first[0]:
        # Each worker's first trial waits until every worker has begun one: the workers
        # start at different times, and their first trials overlap on the node's feed.
        first[0] = False
        (gate / f"begun-{me}").touch()
        deadline = time.monotonic() + 300
        while len(list(gate.glob("begun-*"))) < workers:
            assert time.monotonic() < deadline, "the other workers never began"
            time.sleep(0.01)
    epochs = []
    with ladle.Consumer(dataset=data, image_size=32, batch_size=batch_size,
                        idle_timeout=2.0) as consumer:
        for _ in range(2):
            epochs.append([i for b in consumer for i in np.asarray(b.indices).tolist()])
    with open(out, "a") as f:
        f.write(json.dumps({"trial": trial.number, "epochs": epochs}) + "\n")
    return float(batch_size)

optuna.logging.set_verbosity(optuna.logging.WARNING)
study.optimize(objective, n_trials=trials)
"""


def test_optuna_worker_processes_started_at_different_times_share_the_nodes_feed(
    registry, feed_data, tmp_path
):
    data, n = feed_data
    journal = tmp_path / "journal.log"
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal))
    )
    optuna.create_study(study_name="shared", storage=storage)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    outs = [tmp_path / f"worker{i}.jsonl" for i in range(3)]

    def records() -> list[dict]:
        return [json.loads(line) for out in outs if out.exists()
                for line in out.read_text().splitlines()]

    workers = []
    try:
        for i, out in enumerate(outs):
            workers.append(subprocess.Popen(
                [sys.executable, str(script), str(data), str(journal), str(out), "3", str(i),
                 str(len(outs))],
                cwd=tmp_path,
            ))
            # Staggered: the next worker starts once this one has begun its first trial.
            deadline = time.monotonic() + 300
            while not (tmp_path / f"begun-{i}").exists():
                assert time.monotonic() < deadline, "a worker finished no trial"
                assert all(w.poll() in (None, 0) for w in workers), "a worker failed"
                time.sleep(0.05)
        for w in workers:
            assert w.wait(timeout=300) == 0
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    done = records()
    assert len(done) == 9
    consumed = 0
    for record in done:
        assert len(record["epochs"]) == 2
        for seen in record["epochs"]:
            exact_epoch(seen, n)
            consumed += len(seen)
    # Every feed of this identity has stopped by itself; their logs say what they decoded.
    keys = {p.stem for p in registry.glob("*.log")}
    assert len(keys) == 1, keys
    key = keys.pop()
    wait_gone(registry, key)
    log = (registry / f"{key}.log").read_text()
    published = sum(json.loads(line)["published"] for line in log.splitlines()
                    if line.startswith('{"bad_samples"'))
    assert 0 < published < consumed, (published, consumed, log[-2000:])


def test_the_optuna_example_runs_and_reports_the_sharing(registry, feed_data):
    data, _ = feed_data
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "optuna_sweep.py"), "--dataset", str(data),
         "--trials", "4", "--jobs", "2", "--epochs", "2"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["trials"] == 4
    assert 0 < report["published"] < report["consumed"], report
    # The example's driver started the feed and stopped it as it left (the fixture checks
    # that nothing is left).
