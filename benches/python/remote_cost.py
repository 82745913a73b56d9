#!/usr/bin/env python3
"""Datasets where users keep them (issue 45): what a feed of WebDataset shards in an
S3-compatible store costs against the same shards on local disk, and what a node fetches for
a 4-run sweep. Arms alternated in one invocation, every number measured here.

The photo set: photoset.py's (scikit-image's colour photographs cut into 500x375 windows,
each encoded four ways: baseline 4:2:0, 4:2:2, 4:4:4 and progressive 4:2:0), ``--count``
samples written as WebDataset shards of ``--per-shard`` (``KEY.jpg`` + ``KEY.cls``) into
``--shards DIR``, uploaded to moto's standalone S3 server (``--moto-python``, a Python with
``moto[server]``) on this machine.

Between the feed and moto sits a proxy of this script's (asyncio) that holds every chunk a
client sends for ``--latency`` ms before passing it on: each request (a GET, a listing) reaches
the store that much later, which is what a round trip of that length adds to a request's time
to first byte. It counts the bytes and GETs it relays.

Arms (``ladle serve`` at 64 px, 2 decode threads, a 64 MiB ring, a consumer ``ladle consume
--batch-size 32 --epochs E`` joining as soon as the socket is up):
- ``local``: the shards' folder on disk;
- ``s3+0ms``, ``s3+20ms``, ``s3+100ms``: ``s3://bench/shards/`` through the proxy, each with a
  fresh shard cache, so every shard is fetched (the first epoch waits for the whole set).

Measured per arm: wall time from starting ``ladle serve`` to the consumer's last epoch (fetch
included), samples/s over it, the feed's CPU per sample (its utime + stime from /proc, fetcher
thread included), and the time until the feed's socket is up. Ratios are against ``local`` of
the same round.

Then the sweep's fetch: four feeds of the dataset (seeds 1-4, as four runs of a seed sweep
would start) started at once with one fresh shard cache through the 20 ms proxy; the proxy's
byte count over the shards' size says how many times the node fetched the set.

Usage (after ``cargo build --release -p ladle``; Pillow and scikit-image for the photos)::

    python3 benches/python/remote_cost.py --ladle target/release/ladle \\
        --moto-python target/pyenv-moto/bin/python --count 2000 --rounds 3 --epochs 2 \\
        --out benches/results/remote_cost.json
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import photoset  # noqa: E402  (the real-photo set, shared with photoset.py)

REPO = Path(__file__).resolve().parents[2]
TICK = os.sysconf("SC_CLK_TCK")
KEY, SECRET = "bench-key", "bench-secret"


def make_shards(photos: Path, out: Path, per_shard: int) -> int:
    files = photoset.samples(photos)
    out.mkdir(parents=True)
    for s in range(0, len(files), per_shard):
        with tarfile.open(out / f"shard-{s // per_shard:06d}.tar", "w") as tar:
            for k in range(s, min(s + per_shard, len(files))):
                f = files[k]
                tar.add(f, arcname=f"{k:08d}.jpg")
                label = f.parent.name[1:].encode()
                info = tarfile.TarInfo(f"{k:08d}.cls")
                info.size = len(label)
                tar.addfile(info, io.BytesIO(label))
    return len(files)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Moto:
    def __init__(self, python: str, work: Path) -> None:
        self.port = free_port()
        self.log = open(work / "moto.log", "wb")
        self.proc = subprocess.Popen(
            [python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self.log, stderr=self.log)
        wait_port(self.port, self.proc)

    def upload(self, python: str, folder: Path, bucket: str, prefix: str) -> None:
        script = (
            "import boto3, os, sys\n"
            f"s3 = boto3.client('s3', endpoint_url='http://127.0.0.1:{self.port}', "
            f"region_name='us-east-1', aws_access_key_id='{KEY}', aws_secret_access_key='{SECRET}')\n"
            f"s3.create_bucket(Bucket='{bucket}')\n"
            "for f in sorted(os.listdir(sys.argv[1])):\n"
            f"    s3.upload_file(os.path.join(sys.argv[1], f), '{bucket}', '{prefix}' + f)\n")
        subprocess.run([python, "-c", script, str(folder)], check=True)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def wait_port(port: int, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"port {port} never opened")
            time.sleep(0.05)


class LatencyProxy:
    """Relays to `upstream`, holding each chunk a client sends `delay` s before passing it,
    and (with `rate`) sending responses no faster than `rate` bytes/s in all: one link."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.delay = 0.0
        # Bytes per second over all responses together (0: as fast as they come), and when
        # the link is next free.
        self.rate = 0.0
        self.free_at = 0.0
        self.bytes = 0
        self.gets = 0
        self.loop = asyncio.new_event_loop()
        self.port = free_port()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", self.port))
        ready.set()
        self.loop.run_until_complete(server.serve_forever())

    async def _client(self, reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.close()
            return

        async def upward() -> None:
            while data := await reader.read(65536):
                self.gets += data.count(b"GET ")
                if self.delay:
                    await asyncio.sleep(self.delay)
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def downward() -> None:
            while data := await up_reader.read(1 << 20):
                self.bytes += len(data)
                if self.rate:
                    now = self.loop.time()
                    self.free_at = max(now, self.free_at) + len(data) / self.rate
                    await asyncio.sleep(self.free_at - now)
                writer.write(data)
                await writer.drain()
            writer.close()

        await asyncio.gather(upward(), downward(), return_exceptions=True)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def run_arm(args, dataset: str, env: dict, n: int, seed: int = 1) -> dict:
    """One feed and one consumer of E epochs: wall time, socket-up time, CPU per sample."""
    work = Path(tempfile.mkdtemp(prefix="ladle-remote-"))
    sock = work / "feed.sock"
    env = dict(env, LADLE_REGISTRY_DIR=str(work / "reg"))
    started = time.monotonic()
    log = open(work / "serve.log", "wb")
    feed = subprocess.Popen(
        [args.ladle, "serve", "--dataset", dataset, "--socket", str(sock), "--image-size", "64",
         "--ring-mib", "64", "--threads", "2", "--seed", str(seed),
         "--shard-cache", str(work / "shards")], stdout=subprocess.DEVNULL, stderr=log, env=env)
    while not sock.exists():
        if feed.poll() is not None:
            raise SystemExit(f"ladle serve {dataset} failed: {(work / 'serve.log').read_text()}")
        time.sleep(0.01)
    up = time.monotonic() - started
    consumed = subprocess.run(
        [args.ladle, "consume", "--socket", str(sock), "--batch-size", "32", "--epochs",
         str(args.epochs), "--json"], capture_output=True, text=True, env=env, check=True)
    wall = time.monotonic() - started
    cpu = cpu_seconds(feed.pid)
    feed.send_signal(signal.SIGTERM)
    feed.wait(timeout=60)
    epochs = [json.loads(line) for line in consumed.stdout.splitlines() if line.startswith("{")]
    exact = [e for e in epochs if e.get("exact_coverage") is True]
    if len(exact) != args.epochs:
        raise SystemExit(f"{dataset}: not {args.epochs} exact epochs: {consumed.stdout}")
    said = [line for line in (work / "serve.log").read_text().splitlines()
            if "shards fetched" in line]
    shutil.rmtree(work, ignore_errors=True)
    samples = n * args.epochs
    return {"wall_s": wall, "socket_up_s": up, "samples_per_s": samples / wall,
            "cpu_us_per_sample": 1e6 * cpu / samples, "fetch_said": said[-1] if said else None}


def sweep_fetch(args, dataset: str, env: dict, proxy: LatencyProxy) -> dict:
    """Four feeds at once (seeds 1-4) with one fresh shard cache: bytes through the proxy."""
    work = Path(tempfile.mkdtemp(prefix="ladle-remote-sweep-"))
    env = dict(env, LADLE_REGISTRY_DIR=str(work / "reg"))
    before_bytes, before_gets = proxy.bytes, proxy.gets
    feeds = []
    for seed in range(1, 5):
        sock = work / f"feed{seed}.sock"
        feeds.append((sock, subprocess.Popen(
            [args.ladle, "serve", "--dataset", dataset, "--socket", str(sock),
             "--image-size", "64", "--ring-mib", "16", "--threads", "1", "--seed", str(seed),
             "--shard-cache", str(work / "shards")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)))
    for sock, feed in feeds:
        while not sock.exists():
            if feed.poll() is not None:
                raise SystemExit("a feed of the sweep failed")
            time.sleep(0.01)
    for _, feed in feeds:
        feed.send_signal(signal.SIGTERM)
        feed.wait(timeout=60)
    shutil.rmtree(work, ignore_errors=True)
    return {"bytes": proxy.bytes - before_bytes, "gets": proxy.gets - before_gets}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ladle", default=str(REPO / "target/release/ladle"))
    parser.add_argument("--moto-python", default=str(REPO / "target/pyenv-moto/bin/python"))
    parser.add_argument("--source", type=Path, default=photoset.default_source())
    parser.add_argument("--photos", type=Path, default=Path("/tmp/photos-remote"))
    parser.add_argument("--shards", type=Path, default=Path("/tmp/photos-remote-shards"))
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--per-shard", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latencies", default="0,20,100", help="added ms, comma-separated")
    parser.add_argument("--out", type=Path, default=REPO / "benches/results/remote_cost.json")
    args = parser.parse_args()

    if not args.photos.exists():
        if args.source is None:
            raise SystemExit("no --source photographs (pip install scikit-image)")
        photoset.make_photos(args.source, args.photos, args.count)
    if not args.shards.exists():
        make_shards(args.photos, args.shards, args.per_shard)
    n = len(photoset.samples(args.photos))
    shard_bytes = sum(f.stat().st_size for f in args.shards.glob("*.tar"))
    work = Path(tempfile.mkdtemp(prefix="ladle-remote-bench-"))
    moto = Moto(args.moto_python, work)
    try:
        moto.upload(args.moto_python, args.shards, "bench", "shards/")
        proxy = LatencyProxy(moto.port)
        env = dict(os.environ, AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy.port}",
                   AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION="us-east-1")
        latencies = [float(x) for x in args.latencies.split(",")]
        arms = ["local"] + [f"s3+{ms:g}ms" for ms in latencies]
        rounds = []
        for r in range(args.rounds):
            order = arms if r % 2 == 0 else list(reversed(arms))
            results = {}
            for arm in order:
                if arm == "local":
                    results[arm] = run_arm(args, str(args.shards), env, n)
                else:
                    proxy.delay = float(arm[3:-2]) / 1000
                    results[arm] = run_arm(args, "s3://bench/shards/", env, n)
                print(f"round {r} {arm}: {results[arm]['samples_per_s']:.0f} samples/s, "
                      f"{results[arm]['cpu_us_per_sample']:.0f} us CPU/sample, socket up "
                      f"after {results[arm]['socket_up_s']:.2f} s", flush=True)
            rounds.append(results)
        proxy.delay = 0.020
        sweep = sweep_fetch(args, "s3://bench/shards/", env, proxy)
    finally:
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)

    summary = {}
    for arm in arms:
        rate = statistics.median(r[arm]["samples_per_s"] / r["local"]["samples_per_s"]
                                 for r in rounds)
        cpu = statistics.median(r[arm]["cpu_us_per_sample"] / r["local"]["cpu_us_per_sample"]
                                for r in rounds)
        summary[arm] = {
            "samples_per_s": statistics.median(r[arm]["samples_per_s"] for r in rounds),
            "cpu_us_per_sample": statistics.median(r[arm]["cpu_us_per_sample"] for r in rounds),
            "socket_up_s": statistics.median(r[arm]["socket_up_s"] for r in rounds),
            "rate_vs_local": rate, "cpu_vs_local": cpu}
    sweep["shard_bytes"] = shard_bytes
    sweep["times_fetched"] = sweep["bytes"] / shard_bytes
    result = {"command": " ".join(sys.argv), "machine": platform.node(),
              "cores": os.cpu_count(), "samples": n, "shards": len(list(args.shards.glob("*.tar"))),
              "shard_bytes": shard_bytes, "epochs": args.epochs, "rounds": rounds,
              "summary": summary, "sweep_fetch": sweep}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"summary": summary, "sweep_fetch": sweep}, indent=2))


if __name__ == "__main__":
    main()
