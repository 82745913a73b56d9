#!/usr/bin/env python3
"""ladle against PyTorch DataLoader and TensorSocket, side by side, in one run.

N consumer processes (batch sizes 32, 64, 128, 256 by default) read the same ImageFolder
dataset for the same time through each system in turn:

  ladle        one ``ladle serve`` producer (decode threads = cores); each consumer is a
               ``ladle.Consumer`` and takes ``torch.from_dlpack`` of its batch (zero copy).
  ladle-python the Python producer (``ladle.serve``) running *the user's own* torchvision
               pipeline (the dataloader system's Dataset and transforms, below, wrapped to
               return ``{"image": HWC tensor, "label": int}``) in worker processes (= cores)
               that write each sample straight into the ring; the consumers are ladle's.
  dataloader   N independent ``torch.utils.data.DataLoader``s, one per consumer, over
               ``torchvision.datasets.ImageFolder`` with PIL decode and
               RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor; workers per loader =
               max(1, cores // N), so together they fill the cores.
  tensorsocket TensorSocket 0.0.5 (PyPI), CPU mode: one producer process wrapping such a
               DataLoader (workers = cores, loader batch 32, 8 loader batches per broadcast)
               and N ``TensorConsumer``s with flexible batch sizes. (Its payloads go through
               ``zmq.send_pyobj``, i.e. plain pickle, which serialises CPU tensors by value:
               in CPU mode every consumer receives a copy of every batch over TCP.)

Every system delivers uint8 images (conversion and normalisation belong on the GPU, where
``Batch.to_torch`` does them), so all three do the same work per sample: decode, random
resized crop to 224, flip.

``--recipe cifar`` runs the CIFAR training recipe instead: the dataset is CIFAR-10 binary
batches (default: 50 000 synthetic records made by ``ladle dataset generate --format cifar10
--count 50000``), the transform ``RandomCrop(32, padding=4), RandomHorizontalFlip()``, and
the systems ladle (``ladle serve --transform '...'``) and dataloader, whose Dataset is
``CifarBinary`` below: a small map-style Dataset holding the binary batches in memory, as
``torchvision.datasets.CIFAR10`` does (its own reader wants the pickled Python version of
the files), returning a PIL image per record for torchvision's ``RandomCrop(32, padding=4)``,
``RandomHorizontalFlip()`` and ``PILToTensor()``. Nothing else changes: the same consumers,
workers per loader, timing and CPU accounting.

Measured per system: aggregate samples/s (the sum over consumers of samples / seconds, timed
from each consumer's first batch), CPU-seconds per 1000 samples (user + system time of every
process of the system, producers, workers and consumers, sampled with psutil every
0.25 s, so up to 0.25 s of each process's last moments is missed), consumer-side
CPU µs per batch (each consumer process's own CPU time over its batches: what reading a
batch costs the training process), and peak memory (the largest sum of PSS over the
system's processes, sampled once a second; PSS splits shared pages fairly between the
processes that map them).

Usage (from the repository root, after ``pip install ./python`` and
``pip install torch torchvision pillow tensorsocket==0.0.5 matplotlib psutil``)::

    cargo build --release -p ladle
    python benches/python/compare.py --seconds 30 --json out.json --plot out.png
    python benches/python/compare.py --recipe cifar --seconds 30 --json cifar.json
    python benches/python/compare.py --systems ladle-python,dataloader --seconds 30 --json py.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SYSTEMS = ("ladle", "ladle-python", "dataloader", "tensorsocket")
RECIPES = ("imagenet", "cifar")
CIFAR_TRANSFORM = "RandomCrop(32, padding=4), RandomHorizontalFlip()"


# ---------------------------------------------------------------------------------------------
# Roles run in child processes
# ---------------------------------------------------------------------------------------------


class CifarBinary:
    """CIFAR-10 binary batches (``data_batch_*.bin``: records of 1 label byte and 3072 bytes
    of planar RGB) as a map-style Dataset of ``(PIL image, label)``, held in memory like
    ``torchvision.datasets.CIFAR10``."""

    def __init__(self, root: str, transform) -> None:
        import numpy as np

        files = sorted(Path(root).glob("data_batch_*.bin"))
        if not files:
            raise SystemExit(f"{root}: no data_batch_*.bin files (a CIFAR-10 binary dataset)")
        records = np.concatenate([np.fromfile(f, dtype=np.uint8) for f in files])
        records = records.reshape(-1, 3073)
        self.labels = records[:, 0].astype(np.int64)
        self.images = np.ascontiguousarray(
            records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        )
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        from PIL import Image

        image = self.transform(Image.fromarray(self.images[index]))
        return image, int(self.labels[index])


def _torchvision_dataset(dataset: str, recipe: str = "imagenet"):
    """The user's own pipeline: torchvision's dataset with PIL decode and the recipe's
    transforms, ending in a uint8 CHW tensor."""
    from torchvision import datasets, transforms

    if recipe == "cifar":
        transform = transforms.Compose(
            [
                transforms.RandomCrop(32, padding=4),
                transforms.RandomHorizontalFlip(),
                transforms.PILToTensor(),
            ]
        )
        return CifarBinary(dataset, transform)
    transform = transforms.Compose(
        [
            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),
            transforms.PILToTensor(),
        ]
    )
    return datasets.ImageFolder(dataset, transform=transform)


def _torchvision_loader(dataset: str, batch_size: int, workers: int, recipe: str = "imagenet"):
    import torch

    return torch.utils.data.DataLoader(
        _torchvision_dataset(dataset, recipe),
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        prefetch_factor=2 if workers > 0 else None,
    )


class UserPipeline:
    """What a user hands ``ladle.serve``: their torchvision dataset, each sample as a dict
    with the image HWC (the ring's layout; ``to_torch`` makes NCHW floats on the device)."""

    def __init__(self, dataset: str, recipe: str) -> None:
        self.data = _torchvision_dataset(dataset, recipe)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict:
        image, label = self.data[index]
        return {"image": image.permute(1, 2, 0), "label": label}


def role_py_producer(args: argparse.Namespace) -> None:
    """The Python producer serving the user's pipeline (``ladle.serve``)."""
    import ladle

    ladle.serve(UserPipeline(args.dataset, args.recipe), args.socket, workers=args.workers,
                ring_mib=512)


def _report(batches: int, samples: int, first: float | None, cpu0: float) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - cpu0
    elapsed = time.monotonic() - first if first is not None else 0.0
    print(
        json.dumps(
            {
                "batches": batches,
                "samples": samples,
                "seconds": elapsed,
                "consumer_cpu_us_per_batch": cpu / batches * 1e6 if batches else None,
            }
        ),
        flush=True,
    )


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def role_consumer(args: argparse.Namespace) -> None:
    """One training process: read for ``args.seconds`` after the first batch, then report."""
    import torch

    batches = samples = 0
    first: float | None = None
    cpu0 = 0.0

    def batches_of_ladle():
        import ladle

        consumer = ladle.Consumer(args.socket, args.batch_size, name=f"bench-{args.batch_size}")
        while True:
            for batch in consumer:
                images = torch.from_dlpack(batch.images)  # [B, S, S, 3] uint8, no copy
                labels = torch.from_dlpack(batch.labels)
                yield images, labels

    def batches_of_dataloader():
        loader = _torchvision_loader(args.dataset, args.batch_size, args.workers, args.recipe)
        while True:
            yield from loader

    def batches_of_tensorsocket():
        from tensorsocket import TensorConsumer

        _quiet_tensorsocket()
        consumer = TensorConsumer(batch_size=args.batch_size)
        while True:
            for batch in consumer:
                yield batch[0], batch[1]

    source = {
        "ladle": batches_of_ladle,
        "ladle-python": batches_of_ladle,
        "dataloader": batches_of_dataloader,
        "tensorsocket": batches_of_tensorsocket,
    }[args.system]()
    for images, labels in source:
        if first is None:
            # Time and CPU from the first batch on: startup (imports, workers) is not reading.
            first = time.monotonic()
            cpu0 = _self_cpu()
            continue
        if images.shape[0] != labels.shape[0]:
            raise SystemExit(f"malformed batch: {tuple(images.shape)} / {tuple(labels.shape)}")
        batches += 1
        samples += int(images.shape[0])
        del images, labels
        if time.monotonic() - first >= args.seconds:
            break
    _report(batches, samples, first, cpu0)
    os._exit(0)  # TensorSocket's threads never end; the report is out


def _quiet_tensorsocket() -> None:
    """TensorSocket 0.0.5 calls ``logging.basicConfig(level=DEBUG)`` on import, which makes
    PIL log every PNG chunk it decodes; no user would run it that way, so back to WARNING."""
    import logging

    logging.getLogger().setLevel(logging.WARNING)


def role_ts_producer(args: argparse.Namespace) -> None:
    """TensorSocket's producer wrapping a DataLoader, until SIGTERM."""
    from tensorsocket import TensorProducer

    _quiet_tensorsocket()

    loader = _torchvision_loader(args.dataset, 32, args.workers, args.recipe)
    producer = TensorProducer(loader, producer_batch_size=8, consumer_max_buffer_size=10)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set():
        for _ in producer:
            if stop.is_set():
                break
    os._exit(0)


# ---------------------------------------------------------------------------------------------
# The harness
# ---------------------------------------------------------------------------------------------


class Sampler(threading.Thread):
    """Samples the CPU time of a process tree four times a second and its PSS once a second
    (reading smaps is not free: it would steal the cores being measured)."""

    def __init__(self, roots: list[int]) -> None:
        super().__init__(daemon=True)
        self.roots = roots
        self.cpu: dict[int, float] = {}
        self.peak_pss = 0
        self.halt = threading.Event()

    def processes(self):
        import psutil

        seen = []
        for pid in self.roots:
            try:
                root = psutil.Process(pid)
                seen.append(root)
                seen.extend(root.children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        return seen

    def sample(self, memory: bool = False) -> None:
        import psutil

        pss = 0
        for proc in self.processes():
            try:
                times = proc.cpu_times()
                self.cpu[proc.pid] = times.user + times.system
                if memory:
                    pss += proc.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        self.peak_pss = max(self.peak_pss, pss)

    def run(self) -> None:
        tick = 0
        while not self.halt.wait(0.25):
            tick += 1
            self.sample(memory=tick % 4 == 0)

    def add(self, pid: int) -> None:
        self.roots.append(pid)


def ladle_bin() -> Path:
    for profile in ("release", "debug"):
        path = REPO / "target" / profile / "ladle"
        if path.exists():
            return path
    raise SystemExit("no ladle binary: run `cargo build --release -p ladle` first")


def run_system(system: str, args: argparse.Namespace, tmp: Path) -> dict:
    cores = os.cpu_count() or 1
    n = len(args.batch_sizes)
    me = [sys.executable, os.path.abspath(__file__)]
    sampler = Sampler([])
    producers: list[subprocess.Popen] = []
    socket = tmp / f"{system}.sock"
    if system == "ladle":
        transform = ["--transform", CIFAR_TRANSFORM] if args.recipe == "cifar" else []
        producers.append(
            subprocess.Popen(
                [ladle_bin(), "serve", "--dataset", args.dataset, "--socket", socket,
                 "--threads", str(cores), "--ring-mib", "512", *transform],
                stdout=subprocess.DEVNULL,
                stderr=open(tmp / "serve.log", "wb"),
            )
        )
        deadline = time.monotonic() + 60
        while not socket.exists():
            if time.monotonic() > deadline or producers[0].poll() is not None:
                raise SystemExit(f"ladle serve did not start: {(tmp / 'serve.log').read_text()}")
            time.sleep(0.05)
    elif system == "ladle-python":
        producers.append(
            subprocess.Popen(
                [*me, "--role", "py-producer", "--dataset", args.dataset, "--socket", socket,
                 "--workers", str(cores), "--recipe", args.recipe],
                stdout=subprocess.DEVNULL,
                stderr=open(tmp / "py-producer.log", "wb"),
            )
        )
        deadline = time.monotonic() + 120
        while not socket.exists():
            if time.monotonic() > deadline or producers[0].poll() is not None:
                log = (tmp / "py-producer.log").read_text()[-2000:]
                raise SystemExit(f"the Python producer did not start: {log}")
            time.sleep(0.05)
    elif system == "tensorsocket":
        producers.append(
            subprocess.Popen(
                [*me, "--role", "ts-producer", "--dataset", args.dataset,
                 "--workers", str(cores), "--recipe", args.recipe],
                stderr=open(tmp / "ts-producer.log", "wb"),
            )
        )
        time.sleep(2.0)
    for p in producers:
        sampler.add(p.pid)
    consumers = []
    for batch_size in args.batch_sizes:
        cmd = [*me, "--role", "consumer", "--system", system, "--batch-size", str(batch_size),
               "--seconds", str(args.seconds), "--dataset", args.dataset,
               "--socket", str(socket), "--workers", str(max(1, cores // n)),
               "--recipe", args.recipe]
        consumers.append(subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                          stderr=open(tmp / f"{system}-{batch_size}.log", "wb")))
        sampler.add(consumers[-1].pid)
    sampler.start()
    reports = []
    for batch_size, proc in zip(args.batch_sizes, consumers):
        try:
            out, _ = proc.communicate(timeout=args.seconds + 240)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        sampler.sample()
        lines = [line for line in out.decode().splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            log = (tmp / f"{system}-{batch_size}.log").read_text()[-2000:]
            raise SystemExit(f"{system} consumer (batch {batch_size}) failed:\n{log}")
        report = json.loads(lines[-1])
        report["batch_size"] = batch_size
        reports.append(report)
    sampler.sample()
    for p in producers:
        p.send_signal(signal.SIGTERM)
    for p in producers:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    sampler.halt.set()
    sampler.join()
    samples = sum(r["samples"] for r in reports)
    cpu_seconds = sum(sampler.cpu.values())
    return {
        "samples_per_s": sum(r["samples"] / r["seconds"] for r in reports if r["seconds"] > 0),
        "cpu_s_per_1000_samples": cpu_seconds / samples * 1000 if samples else None,
        "cpu_seconds": cpu_seconds,
        "samples": samples,
        "consumer_cpu_us_per_batch": {
            str(r["batch_size"]): r["consumer_cpu_us_per_batch"] for r in reports
        },
        "peak_pss_mib": sampler.peak_pss / 2**20,
        "consumers": reports,
    }


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(results["systems"])
    metrics = [
        ("samples_per_s", "aggregate samples/s (higher is better)"),
        ("cpu_s_per_1000_samples", "CPU-seconds per 1000 samples (lower is better)"),
        ("peak_pss_mib", "peak memory, PSS MiB (lower is better)"),
    ]
    fig, axes = plt.subplots(1, len(metrics), figsize=(15, 4.5))
    colours = {"ladle": "#2a7ab9", "dataloader": "#d9822b", "tensorsocket": "#7a7a7a"}
    for ax, (key, title) in zip(axes, metrics):
        values = [results["systems"][s][key] or 0 for s in systems]
        bars = ax.bar(systems, values, color=[colours.get(s, "#999") for s in systems])
        ax.bar_label(bars, fmt="%.1f")
        ax.set_title(title, fontsize=10)
    fig.suptitle(
        f"{len(results['batch_sizes'])} consumers (batch {results['batch_sizes']}), "
        f"{results['cores']} cores, {results['seconds']} s each"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("harness", "consumer", "ts-producer", "py-producer"),
                        default="harness", help=argparse.SUPPRESS)
    parser.add_argument("--system", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--recipe", choices=RECIPES, default="imagenet",
                        help="imagenet: an ImageFolder with RandomResizedCrop(224) + flip "
                             "(default); cifar: CIFAR-10 binary with RandomCrop(32, padding=4) "
                             "+ flip, systems ladle and dataloader")
    parser.add_argument("--dataset", default=None,
                        help="ImageFolder directory, or CIFAR-10 binary directory with "
                             "--recipe cifar (default: ladle's cached demo dataset, "
                             "generated with `ladle dataset generate` if missing)")
    parser.add_argument("--batch-sizes", default="32,64,128,256",
                        help="one consumer per batch size (default: 32,64,128,256)")
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="how long each consumer reads, from its first batch (default 30)")
    parser.add_argument("--systems", default=None,
                        help="which systems to run, in order (default: all four; "
                             "ladle,dataloader with --recipe cifar)")
    parser.add_argument("--json", help="write the results as JSON to this file")
    parser.add_argument("--plot", help="write a bar chart (PNG) to this file")
    args = parser.parse_args()
    if args.role == "consumer":
        return role_consumer(args)
    if args.role == "ts-producer":
        return role_ts_producer(args)
    if args.role == "py-producer":
        return role_py_producer(args)

    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.systems is None:
        args.systems = "ladle,dataloader" if args.recipe == "cifar" else ",".join(SYSTEMS)
    if args.dataset is None:
        if args.recipe == "cifar":
            cached = Path.home() / ".cache" / "ladle" / "cifar10-50000"
            generate = ["--format", "cifar10", "--count", "50000"]
        else:
            cached = Path.home() / ".cache" / "ladle" / "demo-imagefolder-v2-1000"
            generate = ["--format", "imagefolder", "--count", "1000"]
        if not cached.exists():
            subprocess.run([ladle_bin(), "dataset", "generate", *generate, "--out", cached],
                           check=True)
        args.dataset = str(cached)
    results = {
        "recipe": args.recipe,
        "transform": CIFAR_TRANSFORM if args.recipe == "cifar"
        else "RandomResizedCrop(224), RandomHorizontalFlip()",
        "dataset": args.dataset,
        "batch_sizes": args.batch_sizes,
        "seconds": args.seconds,
        "cores": os.cpu_count(),
        "systems": {},
    }
    with tempfile.TemporaryDirectory(prefix="ladle-compare-") as tmp:
        for system in args.systems.split(","):
            print(f"running {system} ...", file=sys.stderr, flush=True)
            results["systems"][system] = run_system(system, args, Path(tmp))
            r = results["systems"][system]
            print(f"  {r['samples_per_s']:.1f} samples/s, "
                  f"{r['cpu_s_per_1000_samples']:.2f} CPU-s per 1000 samples, "
                  f"peak PSS {r['peak_pss_mib']:.0f} MiB", file=sys.stderr, flush=True)
    ladle_rate = results["systems"].get("ladle", {}).get("samples_per_s")
    if ladle_rate:
        results["ladle_speedup"] = {
            s: ladle_rate / r["samples_per_s"]
            for s, r in results["systems"].items()
            if s != "ladle" and r["samples_per_s"]
        }
    ladle_cpu = results["systems"].get("ladle", {}).get("cpu_s_per_1000_samples")
    if ladle_cpu:
        # How many times the CPU per sample the other systems spend (higher favours ladle).
        results["ladle_cpu_advantage"] = {
            s: r["cpu_s_per_1000_samples"] / ladle_cpu
            for s, r in results["systems"].items()
            if s != "ladle" and r["cpu_s_per_1000_samples"]
        }
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
