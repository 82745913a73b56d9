#!/usr/bin/env python3
"""What the decoded-sample cache saves (issue 44, decode once per dataset): the decode CPU per
sample of feeds with and without ``--cache-gib``, over real photos, arms alternated in one
invocation.

The photo set (``--photos DIR``, made on first use from ``--source``, needs Pillow): the real
colour photographs of scikit-image's data (astronaut, chelsea, coffee, rocket, retina,
hubble_deep_field, ihc, the two motorcycles), each cut into crop_decode.py's six 4:3 windows
resized to 500x375 (ImageNet-like), each window encoded as JPEG four ways (baseline 4:2:0,
4:2:2, 4:4:4 and progressive 4:2:0, quality 90, as resume_cost.py does), then hard-linked into
``--count`` files over 10 classes. The cache keys a sample by its index, so every link is an
entry of its own: the decoded set is ``sum(w * h * 3)`` over the ``--count`` samples.

Every arm: ``ladle serve`` at 64 px, 2 decode threads, a 64 MiB ring, and a consumer per feed
(``ladle.Consumer``, batches of 32) reading 3 whole epochs; the feed's stats are asked after
the consumer finishes each epoch. Each arm has a registry directory of its own
(``$LADLE_REGISTRY_DIR``), so a fresh cache keeper, let go (directory removed, keeper waited
for) at its end.

- A: one feed, no cache;  B: one feed, a budget of 1.1 x the decoded set;
- C: two feeds at once (seeds 1 and 2), no cache;  D: the same with the cache;
- E: one feed, a budget of half the decoded set.

Before any timing, the digests of every (index, image bytes) of two epochs of a cached feed
are checked against those of an uncached feed of the same seed (the second epoch is read from
the cache); any difference aborts.

Usage (after ``cargo build --release -p ladle`` and installing the wheel)::

    python3 benches/python/cache_cost.py --ladle target/release/ladle \\
        --source /tmp/photos --photos /tmp/photos-cache --count 2000 --rounds 5 \\
        --out benches/results/cache_cost.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import ladle
from photoset import default_source, make_photos, samples

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 3
ARMS = ("A", "B", "C", "D", "E")


def decoded_bytes(files: list[Path]) -> int:
    from PIL import Image

    total = 0
    for f in files:
        with Image.open(f) as im:
            w, h = im.size
        total += w * h * 3
    return total


class Arm:
    """An arm's registry directory (its own cache keeper) and its feeds."""

    def __init__(self, args: argparse.Namespace, name: str) -> None:
        self.args = args
        self.dir = Path(tempfile.mkdtemp(prefix=f"ladle-cache-{name}-"))
        self.env = dict(os.environ, LADLE_REGISTRY_DIR=str(self.dir))
        self.env.pop("LADLE_CACHE_GIB", None)
        self.feeds: list[Feed] = []

    def feed(self, seed: int, cache_gib: float) -> "Feed":
        feed = Feed(self, len(self.feeds), seed, cache_gib)
        self.feeds.append(feed)
        return feed

    def keeper(self) -> dict | None:
        out = subprocess.run([self.args.ladle, "cache", "ls", "--json"], env=self.env,
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out)

    def close(self) -> None:
        for feed in self.feeds:
            feed.stop()
        pid = None
        try:
            pid = json.loads((self.dir / "cache.json").read_text())["pid"]
        except (OSError, ValueError, KeyError):
            pass
        # The keeper exits once its socket is gone; it is waited for so that the next arm
        # starts with its memory back.
        shutil.rmtree(self.dir, ignore_errors=True)
        if pid is not None:
            deadline = time.monotonic() + 20
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            if Path(f"/proc/{pid}").exists():
                print(f"keeper {pid} still up 20 s after its directory went: SIGTERM", flush=True)
                os.kill(pid, signal.SIGTERM)


class Feed:
    """A ``ladle serve`` in an arm, stopped with SIGTERM."""

    def __init__(self, arm: Arm, k: int, seed: int, cache_gib: float) -> None:
        args = arm.args
        self.socket = arm.dir / f"feed{k}.sock"
        self.log = arm.dir.parent / f"{arm.dir.name}-feed{k}.log"
        cmd = [args.ladle, "serve", "--dataset", str(args.photos), "--socket", str(self.socket),
               "--image-size", "64", "--ring-mib", "64", "--threads", "2", "--seed", str(seed),
               "--cache-gib", f"{cache_gib:.4f}"]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=arm.env)
        deadline = time.monotonic() + 120
        while True:
            try:
                self.start = ladle.feed_stats(self.socket)
                break
            except Exception:  # not up yet
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"ladle serve did not start: {cmd}\n{self.log.read_text()}")
                time.sleep(0.05)
        if (self.start.get("cache") is None) != (cache_gib == 0):
            raise SystemExit(f"feed {cmd}: cache {self.start.get('cache')!r}\n"
                             f"{self.log.read_text()}")

    def stats(self) -> dict:
        return ladle.feed_stats(self.socket)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)
        self.log.unlink(missing_ok=True)


def read_epochs(feed: Feed, epochs: int, digests: bool = False) -> dict:
    """A consumer reads `epochs` whole epochs; the feed's stats after each, and the time."""
    marks = [feed.stats()]
    seconds, seen = [], []
    with ladle.Consumer(feed.socket, batch_size=32) as consumer:
        n = consumer.dataset_len
        for _ in range(epochs):
            started = time.monotonic()
            got = 0
            sums = {} if digests else None
            for batch in consumer:
                got += len(batch)
                if digests:
                    images = np.asarray(batch.images)
                    for i, image in zip(np.asarray(batch.indices).tolist(), images):
                        sums[i] = hashlib.blake2b(image.tobytes(), digest_size=16).digest()
                del batch
            seconds.append(time.monotonic() - started)
            marks.append(feed.stats())
            if got != n:
                raise SystemExit(f"an epoch of {got} samples, not {n}")
            if digests:
                seen.append(sums)
    return {"marks": marks, "seconds": seconds, "digests": seen}


def per_epoch(run: dict) -> list[dict]:
    """Per epoch: deltas of the feed's counters between the consumer's epoch boundaries."""
    rows = []
    marks = run["marks"]
    for e in range(1, len(marks)):
        a, b = marks[e - 1], marks[e]
        published = b["published"] - a["published"]
        cpu = b["decode_cpu_s"] - a["decode_cpu_s"]
        row = {"epoch": e, "seconds": run["seconds"][e - 1], "published": published,
               "decode_cpu_s": cpu, "cpu_us_per_sample": 1e6 * cpu / published}
        if b.get("cache") is not None:
            for k in ("hits", "misses", "fills", "stale", "bytes_filled"):
                row[k] = b["cache"][k] - a["cache"][k]
            looked = row["hits"] + row["misses"]
            row["hit_rate"] = row["hits"] / looked if looked else 0.0
        rows.append(row)
    return rows


def totals(run: dict) -> dict:
    a, b = run["marks"][0], run["marks"][-1]
    out = {"published": b["published"] - a["published"],
           "decode_cpu_s": b["decode_cpu_s"] - a["decode_cpu_s"],
           "seconds": sum(run["seconds"])}
    if b.get("cache") is not None:
        out.update({k: b["cache"][k] - a["cache"][k]
                    for k in ("hits", "misses", "fills", "stale", "bytes_filled")})
    return out


def arm_one(args, name: str, gib: float) -> dict:
    arm = Arm(args, name)
    try:
        run = read_epochs(arm.feed(3, gib), EPOCHS)
        keeper = arm.keeper() if gib else None
    finally:
        arm.close()
    return {"arm": name, "cache_gib": gib, "epochs": per_epoch(run), "total": totals(run),
            "keeper": keeper}


def arm_two(args, name: str, gib: float) -> dict:
    arm = Arm(args, name)
    try:
        feeds = [arm.feed(seed, gib) for seed in (1, 2)]
        runs: list = [None, None]
        errors: list = []

        def reader(k: int) -> None:
            try:
                runs[k] = read_epochs(feeds[k], EPOCHS)
            except BaseException as e:  # re-raised below
                errors.append(e)

        started = time.monotonic()
        threads = [threading.Thread(target=reader, args=(k,)) for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - started
        if errors:
            raise errors[0]
        keeper = arm.keeper() if gib else None
    finally:
        arm.close()
    return {"arm": name, "cache_gib": gib, "wall_s": wall,
            "feeds": [{"seed": s, "epochs": per_epoch(r), "total": totals(r)}
                      for s, r in zip((1, 2), runs)],
            "total": {k: sum(totals(r)[k] for r in runs)
                      for k in totals(runs[0])},
            "keeper": keeper}


def check_identical(args, gib: float) -> dict:
    """Two epochs of a cached feed (the second from the cache) against an uncached one."""
    got = []
    for g in (0.0, gib):
        arm = Arm(args, "check")
        try:
            got.append(read_epochs(arm.feed(5, g), 2, digests=True))
        finally:
            arm.close()
    plain, cached = got
    for e in range(2):
        if plain["digests"][e] != cached["digests"][e]:
            bad = sorted(i for i in plain["digests"][e]
                         if plain["digests"][e][i] != cached["digests"][e].get(i))
            raise SystemExit(f"epoch {e + 1}: {len(bad)} samples differ with the cache, "
                             f"first {bad[:10]}")
    hits = cached["marks"][-1]["cache"]["hits"] - cached["marks"][1]["cache"]["hits"]
    return {"epochs": 2, "samples_per_epoch": len(plain["digests"][0]),
            "cached_epoch_2_hits": hits, "identical": True}


def median(xs):
    return statistics.median(xs)


def summarize(rounds: list[dict], n: int) -> dict:
    def arms(name):
        return [r[name] for r in rounds]

    # B: epoch 1 all misses (decode + fill), epochs 2+ hits.
    b1 = [a["epochs"][0]["cpu_us_per_sample"] for a in arms("B")]
    b_later = [sum(e["decode_cpu_s"] for e in a["epochs"][1:]) * 1e6
               / sum(e["published"] for e in a["epochs"][1:]) for a in arms("B")]
    a1 = [a["epochs"][0]["cpu_us_per_sample"] for a in arms("A")]
    a_later = [sum(e["decode_cpu_s"] for e in a["epochs"][1:]) * 1e6
               / sum(e["published"] for e in a["epochs"][1:]) for a in arms("A")]
    c_cpu = [a["total"]["decode_cpu_s"] for a in arms("C")]
    d_cpu = [a["total"]["decode_cpu_s"] for a in arms("D")]
    e_hit = [sum(e["hits"] for e in a["epochs"][1:])
             / sum(e["hits"] + e["misses"] for e in a["epochs"][1:]) for a in arms("E")]
    e_later = [sum(e["decode_cpu_s"] for e in a["epochs"][1:]) * 1e6
               / sum(e["published"] for e in a["epochs"][1:]) for a in arms("E")]
    e1 = [a["epochs"][0]["cpu_us_per_sample"] for a in arms("E")]
    per_round = []
    for k in range(len(rounds)):
        c_hit, c_miss = b_later[k], b1[k]
        b_run = arms("B")[k]
        per_round.append({
            "b_fills": b_run["total"]["fills"],
            "b_hit_rate_later": sum(e["hits"] for e in b_run["epochs"][1:])
            / sum(e["hits"] + e["misses"] for e in b_run["epochs"][1:]),
            "b_later_over_b1": c_hit / c_miss,
            "a1_over_b1": a1[k] / c_miss,
            "a_later_over_a1": a_later[k] / a1[k],
            "d_fills": arms("D")[k]["total"]["fills"],
            "d_keeper_fills": arms("D")[k]["keeper"]["datasets"][0]["fills"],
            "d_keeper_duplicates": arms("D")[k]["keeper"]["datasets"][0]["duplicates"],
            "d_cpu_over_c_cpu": d_cpu[k] / c_cpu[k],
            "e_hit_rate_later": e_hit[k],
            # E's misses after its budget is spent decode without filling: what A pays.
            "e_saving_vs_a": 1 - e_later[k] / a_later[k],
            "e_saving_vs_b_miss": 1 - e_later[k] / c_miss,
            "e_predicted_saving": e_hit[k] * (1 - c_hit / c_miss),
            "e_predicted_saving_a": e_hit[k] * (1 - c_hit / a_later[k]),
            "e_entries": arms("E")[k]["keeper"]["datasets"][0]["entries"],
            "keeper_cpu_s": {name: arms(name)[k]["keeper"]["cpu_s"] for name in "BDE"},
            "seconds": {name: arms(name)[k]["wall_s"] if name in "CD"
                        else arms(name)[k]["total"]["seconds"] for name in ARMS},
        })
    out = {"n": n, "rounds": len(rounds),
           "a1_us": median(a1), "a_later_us": median(a_later),
           "b1_us": median(b1), "b_later_us": median(b_later),
           "c_decode_cpu_s": median(c_cpu), "d_decode_cpu_s": median(d_cpu),
           "e1_us": median(e1), "e_later_us": median(e_later), "per_round": per_round}
    for key in ("b_fills", "b_hit_rate_later", "d_fills", "d_keeper_fills",
                "d_keeper_duplicates", "e_entries", "b_later_over_b1", "a1_over_b1",
                "a_later_over_a1", "d_cpu_over_c_cpu",
                "e_hit_rate_later", "e_saving_vs_a", "e_saving_vs_b_miss",
                "e_predicted_saving", "e_predicted_saving_a"):
        out[key] = median(r[key] for r in per_round)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ladle", default=str(REPO / "target/release/ladle"))
    parser.add_argument("--photos", type=Path, default=Path("/tmp/photos-cache"),
                        help="the photo set: made here from --source if absent, else reused")
    parser.add_argument("--source", type=Path, default=default_source(),
                        help="scikit-image's data directory (default: the installed one)")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of the five arms, the order rotated each round")
    parser.add_argument("--out", type=Path, default=REPO / "benches/results/cache_cost.json")
    args = parser.parse_args()
    args.ladle = str(Path(args.ladle).resolve())
    args.photos = args.photos.resolve()
    if not args.photos.exists():
        if args.source is None:
            raise SystemExit("no photo set at --photos and no --source (scikit-image's data)")
        make_photos(args.source, args.photos, args.count)
    files = samples(args.photos)
    if len(files) != args.count:
        raise SystemExit(f"{args.photos} holds {len(files)} samples, not --count {args.count}: "
                         "give another --photos")
    n = len(files)
    decoded = decoded_bytes(files)
    gib = decoded / (1 << 30)
    whole_gib = math.ceil(1.1 * gib * 100) / 100
    half_gib = round(0.5 * gib, 4)
    print(f"{n} samples, {len({f.stat().st_ino for f in files})} distinct files, decoded "
          f"{decoded / 1e9:.3f} GB ({gib:.3f} GiB); budgets: B and D {whole_gib} GiB, "
          f"E {half_gib} GiB", flush=True)

    check = check_identical(args, whole_gib)
    print(f"identical: {json.dumps(check)}", flush=True)

    budget = {"A": 0.0, "B": whole_gib, "C": 0.0, "D": whole_gib, "E": half_gib}
    rounds = []
    for r in range(args.rounds):
        order = ARMS[r % len(ARMS):] + ARMS[:r % len(ARMS)]
        got = {}
        for name in order:
            run = (arm_two if name in "CD" else arm_one)(args, name, budget[name])
            got[name] = run
            t = run["total"]
            print(f"round {r + 1} {name}: {t['published']} decoded, "
                  f"{t['decode_cpu_s']:.2f} s decode CPU, {t['seconds']:.1f} s of epochs"
                  + (f", fills {t['fills']}, hits {t['hits']}" if "fills" in t else "")
                  + (f", keeper {run['keeper']['cpu_s']:.2f} s CPU" if run["keeper"] else ""),
                  flush=True)
        got["order"] = "".join(order)
        rounds.append(got)
    summary = summarize(rounds, n)

    s = summary
    print()
    print("| figure | median | per round | target |")
    print("|---|---|---|---|")

    def line(label, key, fmt, target=""):
        per = ", ".join(format(r[key], fmt) for r in s["per_round"])
        print(f"| {label} | {format(s[key], fmt)} | {per} | {target} |")

    print(f"| A: decode CPU per sample, epoch 1 / epochs 2–3 | {s['a1_us']:.0f} / "
          f"{s['a_later_us']:.0f} µs | | |")
    print(f"| B: epoch 1 (decode + fill) / epochs 2–3 (hits) | {s['b1_us']:.0f} / "
          f"{s['b_later_us']:.0f} µs | | |")
    print(f"| E: epoch 1 / epochs 2–3 | {s['e1_us']:.0f} / {s['e_later_us']:.0f} µs | | |")
    line("B: fills (N = %d)" % n, "b_fills", ".0f", f"= {n}")
    line("B: hit rate, epochs 2–3", "b_hit_rate_later", ".3f", "1")
    line("B epochs 2–3 ÷ B epoch 1", "b_later_over_b1", ".3f", "≤ 0.3")
    line("A epoch 1 ÷ B epoch 1 (the price of a fill)", "a1_over_b1", ".3f")
    line("D: fills of both feeds (N = %d)" % n, "d_fills", ".0f", f"= {n}")
    line("D: keeper's duplicates", "d_keeper_duplicates", ".0f")
    line("D decode CPU ÷ C decode CPU", "d_cpu_over_c_cpu", ".3f")
    line("E: entries held", "e_entries", ".0f")
    line("E: hit rate, epochs 2–3", "e_hit_rate_later", ".3f")
    line("E: CPU saved per sample, epochs 2–3, against B epoch 1 (c_miss)",
         "e_saving_vs_b_miss", ".3f")
    line("E: predicted, hit rate × (1 − c_hit / c_miss), c_hit and c_miss from B",
         "e_predicted_saving", ".3f")
    line("E: CPU saved per sample, epochs 2–3, against A epochs 2–3 (c_decode)",
         "e_saving_vs_a", ".3f")
    line("E: predicted, hit rate × (1 − c_hit / c_decode)", "e_predicted_saving_a", ".3f")
    for name in ARMS:
        both = " (both feeds, wall)" if name in "CD" else ""
        print(f"| arm {name}: seconds of its 3 epochs{both} | | "
              + ", ".join(f"{r['seconds'][name]:.1f} s" for r in s["per_round"]) + " | |")
    for name in "BDE":
        print(f"| keeper CPU, arm {name} | | "
              + ", ".join(f"{r['keeper_cpu_s'][name]:.2f} s" for r in s["per_round"]) + " | |")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python3 " + " ".join(sys.argv),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "samples": n, "decoded_bytes": decoded,
        "budgets_gib": budget, "epochs": EPOCHS, "image_size": 64, "batch_size": 32,
        "threads": 2, "identical": check, "summary": summary, "rounds": rounds,
    }, indent=1) + "\n")
    print(f"\nwritten {args.out}")


if __name__ == "__main__":
    main()
