#!/usr/bin/env python3
"""Streaming a dataset by shard index (issue 45): how soon the first batch comes, what a whole
run costs, and how much a node fetches, against fetching every shard first and against local
disk; and how well the streamed order mixes shards, against WebDataset's shard shuffle plus
a buffer. Arms alternated in one invocation, every number measured here.

The photo set and shards are remote_cost.py's (real photographs in four JPEG encodings, 20
shards of 100 in moto's S3 server on this machine, behind that script's proxy adding
``--latency`` ms to every request). The index is written by ``ladle dataset index`` and
uploaded beside the shards.

Arms (``ladle serve`` at 64 px, 2 decode threads, a consumer ``ladle consume --batch-size 32
--epochs E``, each with a fresh shard cache):
- ``local``: the shards' folder on disk;
- ``fetch-all``: ``s3://bench/shards/`` (every shard fetched before the feed serves);
- ``stream``: ``s3://bench/shards/index.json``, the shard cache's budget holding the set,
  16 shards shuffled together (the default);
- ``stream-w4``: the same, 4 shards shuffled together;
- ``stream-half``: the same with a budget of half the set: a dataset larger than the disk,
  fetched again each epoch.

Measured per arm: seconds from starting ``ladle serve`` to the consumer's first batch (its
``--save-position`` file appearing), samples/s over the whole run (fetch included), the feed's
CPU per sample, and the bytes the proxy relayed over the set's size. Ratios against ``local``
of the same round.

The store's link is limited to ``--bandwidth-mbps`` (40 MB/s) by the same proxy: the first
batch of a fetched-whole dataset waits for the whole set over it.

Mixing, on a dataset of realistic geometry (``--mix-shards`` 40 shards of
``--mix-per-shard`` 1000 small generated images, in the same store): the mean number of
distinct shards in a batch of 32 and of 256, for one epoch's order recorded from real feeds
(``--record-indices``: local shards, a full permutation; streamed with 16 and with 4 shards a
window) and for WebDataset's ``shard shuffle + shuffle(buffer)`` (its algorithm run here on
the same shard sizes with buffers of 1000 and 5000 samples; not a ladle feed).

Usage (after ``cargo build --release -p ladle``)::

    python3 benches/python/stream_cost.py --ladle target/release/ladle \\
        --moto-python /tmp/benchenv/bin/python --rounds 3 --epochs 2 \\
        --out benches/results/stream_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import photoset  # noqa: E402
from remote_cost import KEY, SECRET, LatencyProxy, Moto, cpu_seconds, make_shards  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def run_arm(args, dataset: str, env: dict, n: int, extra: list[str], proxy: LatencyProxy,
            record: Path | None = None) -> dict:
    work = Path(tempfile.mkdtemp(prefix="ladle-stream-"))
    sock, position = work / "feed.sock", work / "position.json"
    env = dict(env, LADLE_REGISTRY_DIR=str(work / "reg"))
    before = proxy.bytes
    started = time.monotonic()
    log = open(work / "serve.log", "wb")
    feed = subprocess.Popen(
        [args.ladle, "serve", "--dataset", dataset, "--socket", str(sock), "--image-size", "64",
         "--ring-mib", "64", "--threads", "2", "--seed", "1",
         "--shard-cache", str(work / "shards"), *extra],
        stdout=subprocess.DEVNULL, stderr=log, env=env)
    while not sock.exists():
        if feed.poll() is not None:
            raise SystemExit(f"ladle serve {dataset} failed: {(work / 'serve.log').read_text()}")
        time.sleep(0.01)
    consume = [args.ladle, "consume", "--socket", str(sock), "--batch-size", "32", "--epochs",
               str(args.epochs), "--json", "--save-position", str(position)]
    if record is not None:
        consume += ["--record-indices", str(record)]
    consumer = subprocess.Popen(consume, stdout=subprocess.PIPE, text=True, env=env)
    while not position.exists():
        if consumer.poll() is not None:
            raise SystemExit(f"the consumer of {dataset} ended before its first batch")
        time.sleep(0.005)
    first = time.monotonic() - started
    out, _ = consumer.communicate(timeout=3600)
    wall = time.monotonic() - started
    cpu = cpu_seconds(feed.pid)
    feed.send_signal(signal.SIGTERM)
    feed.wait(timeout=60)
    epochs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if sum(e.get("exact_coverage") is True for e in epochs) != args.epochs:
        raise SystemExit(f"{dataset}: not {args.epochs} exact epochs: {out}")
    shutil.rmtree(work, ignore_errors=True)
    samples = n * args.epochs
    return {"first_batch_s": first, "wall_s": wall, "samples_per_s": samples / wall,
            "cpu_us_per_sample": 1e6 * cpu / samples, "bytes": proxy.bytes - before}


def shards_per_batch(order: list[int], shard_of, batch: int) -> float:
    counts = [len({shard_of(i) for i in order[k:k + batch]})
              for k in range(0, len(order) - batch + 1, batch)]
    return statistics.mean(counts)


def wds_order(sizes: list[int], buffer: int, rng: random.Random) -> list[int]:
    """WebDataset's shardshuffle + shuffle(buffer): shards in a random order, each read in
    order, through a buffer from which a random sample is taken once it is full (its
    ``_shuffle`` with ``initial=buffer``; its default ``initial=100`` starts yielding sooner
    and mixes the first samples less, so this is the more favourable reading)."""
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    shards = list(range(len(sizes)))
    rng.shuffle(shards)
    stream = [starts[s] + j for s in shards for j in range(sizes[s])]
    out, buf = [], []
    for sample in stream:
        buf.append(sample)
        if len(buf) < buffer:
            continue
        k = rng.randrange(len(buf))
        buf[k], buf[-1] = buf[-1], buf[k]
        out.append(buf.pop())
    rng.shuffle(buf)
    return out + buf


def record_order(args, dataset: str, env: dict, extra: list[str]) -> list[int]:
    """One epoch's order as a real feed serves it (``--record-indices``)."""
    work = Path(tempfile.mkdtemp(prefix="ladle-mix-"))
    sock, record = work / "feed.sock", work / "order.jsonl"
    env = dict(env, LADLE_REGISTRY_DIR=str(work / "reg"))
    feed = subprocess.Popen(
        [args.ladle, "serve", "--dataset", dataset, "--socket", str(sock), "--image-size", "8",
         "--threads", "2", "--seed", "1", "--shard-cache", str(work / "shards"), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    while not sock.exists():
        if feed.poll() is not None:
            raise SystemExit(f"ladle serve {dataset} failed")
        time.sleep(0.01)
    subprocess.run([args.ladle, "consume", "--socket", str(sock), "--batch-size", "256",
                    "--record-indices", str(record)], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    feed.send_signal(signal.SIGTERM)
    feed.wait(timeout=60)
    order = json.loads(record.read_text().splitlines()[0])["indices"]
    shutil.rmtree(work, ignore_errors=True)
    return order


def mix(args, env_moto_proxy) -> dict:
    """Distinct shards per batch over a dataset of realistic geometry (``--mix-shards`` of
    ``--mix-per-shard`` small images): ladle's orders recorded from real feeds, WebDataset's
    from its algorithm."""
    env, moto, _ = env_moto_proxy
    work = Path(tempfile.mkdtemp(prefix="ladle-mix-data-"))
    shards = work / "shards"
    subprocess.run([args.ladle, "dataset", "generate", "--format", "wds", "--count",
                    str(args.mix_shards * args.mix_per_shard), "--shard-size",
                    str(args.mix_per_shard), "--width", "8", "--height", "8", "--out",
                    str(shards)], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([args.ladle, "dataset", "index", str(shards), "--out",
                    str(shards / "index.json")], check=True)
    moto.upload(args.moto_python, shards, "mix", "shards/")
    sizes = [s["nsamples"] for s in json.loads((shards / "index.json").read_text())["shardlist"]]
    ends = [sum(sizes[:k + 1]) for k in range(len(sizes))]
    import bisect

    def shard_of(i: int) -> int:
        return bisect.bisect_right(ends, i)

    orders = {
        "ladle, local shards (a full permutation)": record_order(args, str(shards), env, []),
        "ladle, streamed, 16 shards a window": record_order(
            args, "s3://mix/shards/index.json", env, []),
        "ladle, streamed, 4 shards a window": record_order(
            args, "s3://mix/shards/index.json", env, ["--shuffle-shards", "4"]),
    }
    rng = random.Random(1)
    for buffer in (1000, 5000):
        orders[f"webdataset, shard shuffle + buffer {buffer}"] = wds_order(sizes, buffer, rng)
    shutil.rmtree(work, ignore_errors=True)
    return {name: {str(b): shards_per_batch(order, shard_of, b) for b in (32, 256)}
            for name, order in orders.items()}


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
    parser.add_argument("--latency", type=float, default=20, help="ms added to each request")
    parser.add_argument("--bandwidth-mbps", type=float, default=40,
                        help="the store's link, MB/s over all responses (0: unlimited)")
    parser.add_argument("--mix-shards", type=int, default=40)
    parser.add_argument("--mix-per-shard", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=REPO / "benches/results/stream_cost.json")
    args = parser.parse_args()

    if not args.photos.exists():
        photoset.make_photos(args.source, args.photos, args.count)
    if not args.shards.exists():
        make_shards(args.photos, args.shards, args.per_shard)
    n = len(photoset.samples(args.photos))
    tars = sorted(args.shards.glob("*.tar"))
    set_bytes = sum(f.stat().st_size for f in tars)
    work = Path(tempfile.mkdtemp(prefix="ladle-stream-bench-"))
    index_dir = work / "index"
    index_dir.mkdir()
    subprocess.run([args.ladle, "dataset", "index", str(args.shards), "--out",
                    str(index_dir / "index.json")], check=True)
    moto = Moto(args.moto_python, work)
    try:
        moto.upload(args.moto_python, args.shards, "bench", "shards/")
        moto.upload(args.moto_python, index_dir, "bench", "shards/")
        proxy = LatencyProxy(moto.port)
        proxy.delay = args.latency / 1000
        proxy.rate = args.bandwidth_mbps * 1e6
        env = dict(os.environ, AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy.port}",
                   AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION="us-east-1")
        half = f"{set_bytes / 2 / (1 << 30):.9f}"
        arms = {
            "local": (str(args.shards), []),
            "fetch-all": ("s3://bench/shards/", []),
            "stream": ("s3://bench/shards/index.json", []),
            "stream-w4": ("s3://bench/shards/index.json", ["--shuffle-shards", "4"]),
            "stream-half": ("s3://bench/shards/index.json", ["--shard-cache-gib", half]),
        }
        rounds = []
        for r in range(args.rounds):
            names = list(arms) if r % 2 == 0 else list(reversed(arms))
            results = {}
            for arm in names:
                dataset, extra = arms[arm]
                results[arm] = run_arm(args, dataset, env, n, extra, proxy)
                print(f"round {r} {arm}: first batch after {results[arm]['first_batch_s']:.2f} s, "
                      f"{results[arm]['samples_per_s']:.0f} samples/s, "
                      f"{results[arm]['cpu_us_per_sample']:.0f} us CPU/sample, fetched "
                      f"{results[arm]['bytes'] / set_bytes:.2f}x the set", flush=True)
            rounds.append(results)
        proxy.delay, proxy.rate = 0.0, 0.0
        env_for_mix = (env, moto, proxy)
        mixing = mix(args, env_for_mix)
    finally:
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)

    summary = {}
    for arm in arms:
        summary[arm] = {
            "first_batch_s": statistics.median(r[arm]["first_batch_s"] for r in rounds),
            "samples_per_s": statistics.median(r[arm]["samples_per_s"] for r in rounds),
            "rate_vs_local": statistics.median(
                r[arm]["samples_per_s"] / r["local"]["samples_per_s"] for r in rounds),
            "cpu_vs_local": statistics.median(
                r[arm]["cpu_us_per_sample"] / r["local"]["cpu_us_per_sample"] for r in rounds),
            "fetched_sets": statistics.median(r[arm]["bytes"] / set_bytes for r in rounds),
        }
    result = {"command": " ".join(sys.argv), "machine": platform.node(),
              "cores": os.cpu_count(), "samples": n, "shards": len(tars),
              "set_bytes": set_bytes, "epochs": args.epochs, "latency_ms": args.latency,
              "bandwidth_mbps": args.bandwidth_mbps,
              "mix_geometry": {"shards": args.mix_shards, "per_shard": args.mix_per_shard},
              "rounds": rounds, "summary": summary, "distinct_shards_per_batch": mixing}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"summary": summary, "distinct_shards_per_batch": mixing}, indent=2))


if __name__ == "__main__":
    main()
