"""A fast consumer's rate beside a slow one that keeps a zero-copy batch, against the same pair
where the slow one keeps nothing (issue 41, item 6). See benches/README.md, "Kept batches".

Each round serves one dataset with `ladle serve` and runs, one arm after the other:

- `plain`: a slow `ladle consume` (batches of 4, 100 ms a step: 40 samples/s) and a fast one
  (batches of 32, no step) for `--seconds`;
- `kept`: the same, the slow one with `--keep-first` (it keeps each epoch's first batch, an
  example for logging, while it reads on).

The fast consumer's samples/s (its own summary) is the figure; the ratio kept / plain is what
the issue asks to stay at 0.9 or more. The stall timeout is set past the run, so that only
skimming can free the feed. Arms alternate within each round, so drift hits both.

    python3 benches/python/kept_batch.py --ladle target/release/ladle [--photos DIR]
        [--rounds 3] [--seconds 20] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def photo_folder(photos: Path, out: Path, classes: int) -> None:
    files = sorted(p for p in photos.iterdir() if p.suffix.lower() in {".jpg", ".jpeg", ".png"})
    if not files:
        sys.exit(f"no .jpg/.jpeg/.png in {photos}")
    for c in range(classes):
        folder = out / f"c{c:02d}"
        folder.mkdir(parents=True)
        for f in files:
            os.link(f, folder / f"{f.stem}_{c}{f.suffix}")


def wait_for(path: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"{path} never appeared")
        time.sleep(0.05)


def summary(out: str) -> dict:
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [line for line in lines if "epochs" in line][-1]


def arm(ladle: str, data: Path, work: Path, seconds: float, keep: bool) -> dict:
    sock = work / f"{'kept' if keep else 'plain'}-{time.monotonic_ns()}.sock"
    serve = subprocess.Popen(
        [ladle, "serve", "--dataset", data, "--socket", sock, "--image-size", "64",
         "--ring-mib", "4", "--threads", "2", "--stall-timeout", str(seconds * 10)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(sock, 60)
        slow_args = [ladle, "consume", "--socket", sock, "--batch-size", "4", "--step-ms",
                     "100", "--seconds", str(seconds + 2), "--json", "--check-held",
                     "--name", "slow"]  # fmt: skip
        slow = subprocess.Popen(
            slow_args + (["--keep-first"] if keep else []),
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        time.sleep(0.5)  # the slow one holds its first batch before the fast one comes
        fast = subprocess.run(
            [ladle, "consume", "--socket", sock, "--batch-size", "32", "--seconds",
             str(seconds), "--json", "--name", "fast"],
            capture_output=True, text=True, timeout=seconds * 5,
        )  # fmt: skip
        slow_out, _ = slow.communicate(timeout=seconds * 5)
        f, s = summary(fast.stdout), summary(slow_out)
        return {
            "fast_samples_per_s": f["samples_per_s"],
            "slow_samples_per_s": s["samples_per_s"],
            "slow_skims": s["skims"],
            "slow_overwritten_batches": s["overwritten_batches"],
            "slow_corrupted_batches": s["corrupted_batches"],
        }
    finally:
        serve.terminate()
        serve.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ladle", required=True)
    ap.add_argument("--photos", type=Path, help="real photos (else 2000 synthetic images)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ladle-kept-"))
    data = work / "data"
    if args.photos:
        photo_folder(args.photos, data, 16)
        source = f"real photos from {args.photos}, 16 classes"
    else:
        subprocess.run(
            [args.ladle, "dataset", "generate", "--format", "imagefolder", "--count", "2000",
             "--width", "96", "--height", "80", "--out", data],
            check=True, capture_output=True,
        )  # fmt: skip
        source = "2000 synthetic 96x80 JPEGs"
    rounds = []
    for r in range(args.rounds):
        order = [False, True] if r % 2 == 0 else [True, False]
        result = {("kept" if keep else "plain"): arm(args.ladle, data, work, args.seconds, keep)
                  for keep in order}  # fmt: skip
        result["ratio"] = result["kept"]["fast_samples_per_s"] / result["plain"]["fast_samples_per_s"]
        print(json.dumps(result), flush=True)
        rounds.append(result)
    report = {
        "dataset": source,
        "seconds": args.seconds,
        "rounds": rounds,
        "ratio_median": statistics.median(r["ratio"] for r in rounds),
        "command": " ".join(sys.argv),
    }
    print(json.dumps({"ratio_median": report["ratio_median"]}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
