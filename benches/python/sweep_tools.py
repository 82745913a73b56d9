"""The sweep tools on one feed against the same trials each decoding for itself (issue 42).
See benches/README.md, "Sweep tools".

For each tool (Optuna trials as threads, Ray Tune trials as worker processes, Hydra's joblib
launcher), the same trials run twice, one arm after the other:

- `ladle`: each trial names the data, `ladle.Consumer(dataset=...)`; the first starts the
  node's feed, the others join it; the figures are the feed's summaries (samples decoded,
  samples its consumers read);
- `private`: each trial decodes its own epochs in its own process or thread, as a PyTorch
  DataLoader's worker does: PIL opens the file, `RandomResizedCrop` and a horizontal flip
  (torchvision's algorithm, here on PIL directly so that no torch is needed), to a uint8 array.

Every trial reads `--epochs` epochs at its batch size and does the same per-batch "training"
(a numpy softmax regression step on 8×8-pooled images); the figure is the aggregate samples/s
of all trials (total samples read / wall time of the sweep), and ladle / private is the ratio.

    python benches/python/sweep_tools.py --ladle target/release/ladle --photos DIR \
        [--classes 12] [--trials 8] [--jobs 4] [--epochs 2] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

IMAGE = 64

TRIAL = r'''
import math, os, random
import numpy as np

IMAGE = 64

def step(weights, images, labels, lr=0.1):
    b = images.shape[0]
    x = images.reshape(b, 8, IMAGE // 8, 8, IMAGE // 8, 3).mean(axis=(2, 4), dtype=np.float32)
    x = x.reshape(b, -1) / 255.0
    logits = x @ weights
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(b), labels % weights.shape[1]] -= 1.0
    weights -= lr * (x.T @ p) / b

def random_resized_crop(img, rng, size=IMAGE, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's RandomResizedCrop.get_params, then crop, resize (bilinear)."""
    from PIL import Image
    width, height = img.size
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            i, j = rng.randint(0, height - h), rng.randint(0, width - w)
            break
    else:
        w, h = min(width, height), min(width, height)
        i, j = (height - h) // 2, (width - w) // 2
    return img.resize((size, size), Image.BILINEAR, box=(j, i, j + w, i + h))

def private_epochs(root, batch_size, epochs, seed):
    """A private loader: every sample decoded and augmented by this trial (PIL)."""
    from PIL import Image
    files = sorted((c, os.path.join(root, c, f)) for c in os.listdir(root)
                   for f in os.listdir(os.path.join(root, c)))
    classes = {c: k for k, c in enumerate(sorted({c for c, _ in files}))}
    rng = random.Random(seed)
    weights = np.zeros((192, 10), dtype=np.float32)
    samples = 0
    for _ in range(epochs):
        order = list(range(len(files)))
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            images, labels = [], []
            for k in order[start:start + batch_size]:
                c, path = files[k]
                img = Image.open(path).convert("RGB")
                img = random_resized_crop(img, rng)
                if rng.random() < 0.5:
                    img = img.transpose(Image.FLIP_LEFT_RIGHT)
                images.append(np.asarray(img))
                labels.append(classes[c])
            step(weights, np.stack(images), np.asarray(labels))
            samples += len(labels)
    return samples

def ladle_epochs(root, batch_size, epochs, seed):
    """The same trial on the node's feed of the data."""
    import ladle
    weights = np.zeros((192, 10), dtype=np.float32)
    samples = 0
    with ladle.Consumer(dataset=root, image_size=IMAGE, batch_size=batch_size,
                        idle_timeout=5.0) as consumer:
        for _ in range(epochs):
            for batch in consumer:
                step(weights, np.asarray(batch.images), np.asarray(batch.labels))
                samples += len(batch)
    return samples

def trial(arm, root, batch_size, epochs, seed):
    run = ladle_epochs if arm == "ladle" else private_epochs
    return run(root, batch_size, epochs, seed)
'''

OPTUNA = r'''
import json, sys, time
import optuna
from trial import trial
arm, root, trials, jobs, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
total = []
def objective(t):
    bs = t.suggest_categorical("batch_size", [16, 32, 64])
    total.append(trial(arm, root, bs, epochs, t.number))
    return float(bs)
optuna.logging.set_verbosity(optuna.logging.WARNING)
started = time.monotonic()
optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).optimize(objective, n_trials=trials, n_jobs=jobs)
print(json.dumps({"samples": sum(total), "seconds": time.monotonic() - started}))
'''

RAY = r'''
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import ray
from ray import tune
arm, root, trials, jobs, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False)
def trainable(config):
    from trial import trial
    tune.report({"samples": trial(arm, root, config["batch_size"], epochs, config["seed"])})
started = time.monotonic()
results = tune.Tuner(
    tune.with_resources(trainable, {"cpu": 1}),
    param_space={"batch_size": tune.grid_search([16, 32, 64, 16, 32, 64, 16, 32][:trials]),
                 "seed": tune.randint(0, 1000)},
    tune_config=tune.TuneConfig(max_concurrent_trials=jobs),
    run_config=tune.RunConfig(storage_path=os.path.join(os.getcwd(), "ray"), verbose=0),
).fit()
seconds = time.monotonic() - started
print(json.dumps({"samples": sum(r.metrics["samples"] for r in results), "seconds": seconds}))
ray.shutdown()
'''

HYDRA = r'''
import json, os, sys, time
import hydra
from trial import trial

@hydra.main(version_base=None, config_path=None)
def main(cfg):
    samples = trial(cfg.arm, cfg.root, cfg.batch_size, cfg.epochs, cfg.batch_size)
    with open(os.path.join(cfg.out, f"{os.getpid()}-{time.monotonic_ns()}.json"), "w") as f:
        json.dump(samples, f)

if __name__ == "__main__":
    main()
'''


def photo_folder(photos: Path, out: Path, classes: int) -> int:
    files = sorted(p for p in photos.iterdir() if p.suffix.lower() in {".jpg", ".jpeg", ".png"})
    if not files:
        sys.exit(f"no .jpg/.jpeg/.png in {photos}")
    for c in range(classes):
        folder = out / f"c{c:02d}"
        folder.mkdir(parents=True)
        for f in files:
            os.link(f, folder / f"{f.stem}_{c}{f.suffix}")
    return len(files) * classes


def feed_summaries(registry: Path) -> tuple[int, int]:
    published = consumed = 0
    for log in registry.glob("*.log"):
        for line in log.read_text().splitlines():
            if line.startswith('{"bad_samples"'):
                s = json.loads(line)
                published += s["published"]
                consumed += s["consumed"]
    return published, consumed


def wait_feeds_gone(registry: Path) -> None:
    import fcntl

    deadline = time.monotonic() + 120
    for live in registry.glob("*.live"):
        while True:
            fd = os.open(live, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    sys.exit(f"{live}: the feed never stopped")
                time.sleep(0.05)
            finally:
                os.close(fd)


def run_arm(tool: str, arm: str, data: Path, work: Path, args) -> dict:
    registry = work / f"reg-{tool}-{arm}"
    env = dict(os.environ, LADLE_REGISTRY_DIR=str(registry), LADLE_BIN=args.ladle,
               PYTHONPATH=str(work))
    common = [arm, str(data), str(args.trials), str(args.jobs), str(args.epochs)]
    if tool == "optuna":
        cmd = [sys.executable, str(work / "optuna_driver.py"), *common]
    elif tool == "ray":
        cmd = [sys.executable, str(work / "ray_driver.py"), *common]
    else:
        out = work / f"hydra-{arm}"
        out.mkdir()
        sizes = ",".join(str([16, 32, 64][k % 3]) for k in range(args.trials))
        # A trial per batch size value; repeated values are told apart by a seed.
        cmd = [sys.executable, str(work / "hydra_app.py"), "-m", "hydra/launcher=joblib",
               f"hydra.launcher.n_jobs={args.jobs}", f"+arm={arm}", f"+root={data}",
               f"+epochs={args.epochs}", f"+out={out}", f"+batch_size={sizes}",
               f"hydra.sweep.dir={work / ('sweep-' + arm)}"]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"{tool} {arm} failed:\n{done.stderr[-3000:]}")
    if tool == "hydra":
        samples = sum(json.loads(p.read_text()) for p in (work / f"hydra-{arm}").glob("*.json"))
        seconds = wall
    else:
        report = json.loads(done.stdout.strip().splitlines()[-1])
        samples, seconds = report["samples"], report["seconds"]
    result = {"samples": samples, "seconds": seconds, "samples_per_s": samples / seconds}
    if arm == "ladle":
        wait_feeds_gone(registry)
        published, consumed = feed_summaries(registry)
        result.update(published=published, consumed=consumed,
                      consumed_per_decoded=consumed / max(published, 1))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ladle", required=True)
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--classes", type=int, default=12)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--tools", default="optuna,ray,hydra")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.ladle = os.path.abspath(args.ladle)
    results = {}
    with tempfile.TemporaryDirectory(prefix="lst-") as tmp:
        work = Path(tmp)
        data = work / "photos"
        n = photo_folder(args.photos, data, args.classes)
        (work / "trial.py").write_text(TRIAL)
        (work / "optuna_driver.py").write_text(OPTUNA)
        (work / "ray_driver.py").write_text(RAY)
        (work / "hydra_app.py").write_text(HYDRA)
        for tool in args.tools.split(","):
            # Private first, then ladle: the page cache is warm for both after the first.
            private = run_arm(tool, "private", data, work, args)
            shared = run_arm(tool, "ladle", data, work, args)
            results[tool] = {"private": private, "ladle": shared,
                             "speedup": shared["samples_per_s"] / private["samples_per_s"]}
            print(json.dumps({tool: results[tool]}), flush=True)
    report = {"dataset_len": n, "photos": str(args.photos), "classes": args.classes,
              "trials": args.trials, "jobs": args.jobs, "epochs": args.epochs,
              "image": IMAGE, "cores": os.cpu_count(), "tools": results}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
