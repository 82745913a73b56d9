#!/usr/bin/env python3
"""What a resume costs the feed (issue 43, decode on demand): a consumer alone on its feed
reads part of an epoch, saves its position, the producer restarts, and the consumer resumes
with a fraction f of its epoch left. How many samples does the new feed decode for that
remainder, and how long does the rest of the epoch take against the same feed decoding a
whole epoch right after (side by side in one invocation)?

The photo set (``--make-photos SRC``, needs Pillow): every colour photograph in SRC (PNG or
JPEG, scikit-image's samples for example) encoded as JPEG four ways (baseline 4:2:0, 4:2:2,
4:4:4 and progressive 4:2:0, quality 90), then hard-linked into ``--count`` files over 10
classes, so that an epoch is ``--count`` samples of real photos in every encoding.

Usage (after ``cargo build --release -p ladle`` and installing the wheel)::

    python3 benches/python/resume_cost.py --make-photos /tmp/photos --dataset /tmp/photos10k \\
        --count 10000 --fractions 0.1,0.5 --json benches/results/resume_cost.json
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import ladle

REPO = Path(__file__).resolve().parents[2]
ENCODINGS = (
    ("b420", {"subsampling": 2}),
    ("b422", {"subsampling": 1}),
    ("b444", {"subsampling": 0}),
    ("p420", {"subsampling": 2, "progressive": True}),
)


def make_photos(src: Path, out: Path, count: int) -> None:
    from PIL import Image

    encoded = out / "_encoded"
    encoded.mkdir(parents=True, exist_ok=True)
    files = []
    for photo in sorted(src.iterdir()):
        if photo.suffix.lower() not in (".png", ".jpg", ".jpeg"):
            continue
        image = Image.open(photo)
        if image.mode != "RGB" or min(image.size) < 128:
            continue  # colour photographs only
        for name, options in ENCODINGS:
            path = encoded / f"{photo.stem}_{name}.jpg"
            image.save(path, "JPEG", quality=90, **options)
            files.append(path)
    if not files:
        raise SystemExit(f"{src}: no colour photographs")
    for k in range(count):
        klass = out / f"c{k % 10}"
        klass.mkdir(exist_ok=True)
        link = klass / f"{k:06d}.jpg"
        if not link.exists():
            link.hardlink_to(files[k % len(files)])
    # The encodings live outside the classes: an ImageFolder reads class folders only.
    (out / "_encoded").rename(out.parent / f".{out.name}-encoded")


class Feed:
    """A ``ladle serve`` on `socket`, stopped with SIGTERM."""

    def __init__(self, args: argparse.Namespace, socket: Path) -> None:
        self.socket = socket
        cmd = [args.ladle, "serve", "--dataset", args.dataset, "--socket", str(socket),
               "--image-size", str(args.image_size), "--ring-mib", str(args.ring_mib),
               "--seed", "3"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while True:
            try:
                ladle.feed_stats(socket)
                return
            except Exception:  # not up yet
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"ladle serve did not start: {cmd}")
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def one(args: argparse.Namespace, f: float, tmp: Path) -> dict:
    socket = tmp / f"feed-{f}.sock"
    feed = Feed(args, socket)
    consumer = ladle.Consumer(socket, args.batch_size)
    n = consumer.dataset_len
    keep = n - round(f * n)
    read = 0
    epoch = iter(consumer)
    while read < keep:
        read += len(next(epoch))
    state = consumer.state_dict()
    consumer.close()
    feed.stop()
    left = n - read
    # A fresh producer: its counters are the resume's alone.
    feed = Feed(args, socket)
    consumer = ladle.Consumer(socket, args.batch_size)
    consumer.load_state_dict(state)
    started = time.monotonic()
    got = sum(len(batch) for batch in consumer)
    resumed_s = time.monotonic() - started
    after_resume = ladle.feed_stats(socket)
    started = time.monotonic()
    whole = sum(len(batch) for batch in consumer)
    whole_s = time.monotonic() - started
    after_whole = ladle.feed_stats(socket)
    consumer.close()
    feed.stop()
    assert got == left and whole == n, (got, left, whole, n)
    decoded = after_resume["published"]
    return {
        "f": f,
        "samples": n,
        "left": left,
        "decoded_for_the_remainder": decoded,
        "holes": after_resume["holes"],
        "decoded_per_sample_left": decoded / left,
        "resume_s": resumed_s,
        "whole_epoch_s": whole_s,
        "decoded_for_the_whole_epoch": after_whole["published"] - decoded,
        "resume_s_over_f_whole_epoch_s": resumed_s / (f * whole_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--make-photos", metavar="SRC", type=Path,
                        help="first build --dataset from the colour photographs in SRC")
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--fractions", default="0.1,0.5")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--ring-mib", type=int, default=64)
    parser.add_argument("--ladle", default=str(REPO / "target/release/ladle"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.make_photos and not Path(args.dataset).exists():
        make_photos(args.make_photos, Path(args.dataset), args.count)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ladle-resume-") as tmp:
        for f in (float(x) for x in args.fractions.split(",")):
            row = one(args, f, Path(tmp))
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("| f | left | decoded for it | decoded / left | rest of the epoch, s | a whole epoch "
          "after, s | rest ÷ (f × whole) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['f']} | {r['left']} | {r['decoded_for_the_remainder']} | "
              f"{r['decoded_per_sample_left']:.3f} | {r['resume_s']:.2f} | "
              f"{r['whole_epoch_s']:.2f} | {r['resume_s_over_f_whole_epoch_s']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
