"""Peak memory of a feed over a folder holding hostile files, against the same folder without
them (issue 41, item 1). See benches/README.md, "Hostile files".

Three folders, each served by `ladle serve` and read for two epochs by `ladle consume`:

- `clean`: real photos, hard-linked into classes;
- `hostile`: the same, plus in one class a FIFO, a link to /dev/zero, a 2 GiB sparse file and
  four PNGs of 33 KB that declare 16384x16384 pixels, all named like images;
- `giant`: the same as clean, plus one 12000x12000 PNG (144 megapixels, under the pixel
  budget, so it is decoded): what one huge legitimate image costs, and whether its buffers
  are given back (RSS at the end against clean's).

The producer's peak RSS (VmHWM) and final RSS (VmRSS) are read from /proc just before it is
stopped. Usage:

    python3 benches/python/hostile_rss.py --ladle target/release/ladle --photos DIR [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path


def png_bomb(side: int) -> bytes:
    """A 1-bit grey PNG of side x side zeros."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\0" * (1 + (side + 7) // 8)
    compress = zlib.compressobj(9)
    data = b"".join(compress.compress(row) for _ in range(side)) + compress.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def photo_folder(photos: Path, out: Path, classes: int) -> int:
    files = sorted(p for p in photos.iterdir() if p.suffix.lower() in {".jpg", ".jpeg", ".png"})
    for c in range(classes):
        folder = out / f"c{c:02d}"
        folder.mkdir(parents=True)
        for f in files:
            os.link(f, folder / f"{f.stem}_{c}{f.suffix}")
    return len(files) * classes


def status(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            fields[key] = int(value.split()[0])
    return fields


def measure(ladle: str, dataset: Path, threads: int, epochs: int) -> dict:
    sock = dataset.parent / f"{dataset.name}.sock"
    serve = subprocess.Popen(
        [ladle, "serve", "--dataset", str(dataset), "--socket", str(sock),
         "--threads", str(threads), "--image-size", "224", "--ring-mib", "64"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not sock.exists():
            if serve.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"ladle serve did not start: {serve.stderr.read()}")
            time.sleep(0.05)
        started = time.monotonic()
        out = subprocess.run(
            [ladle, "consume", "--socket", str(sock), "--epochs", str(epochs),
             "--batch-size", "32", "--json"],
            capture_output=True, text=True, timeout=1800, check=True,
        )
        seconds = time.monotonic() - started
        memory = status(serve.pid)
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
            raise SystemExit("ladle serve ignored SIGTERM")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "peak_rss_kib": memory["VmHWM"],
        "final_rss_kib": memory["VmRSS"],
        "seconds": round(seconds, 2),
        "samples": summary.get("samples"),
        "bad": summary["bad_samples"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ladle", default="target/release/ladle")
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--classes", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ladle-hostile-"))
    try:
        folders = {}
        for name in ("clean", "hostile", "giant"):
            folders[name] = root / name
            photo_folder(args.photos, folders[name], args.classes)
        bad = folders["hostile"] / "c00"
        os.mkfifo(bad / "zz.jpg")
        os.symlink("/dev/zero", bad / "zy.jpg")
        with open(bad / "zx.jpg", "wb") as sparse:
            sparse.truncate(2 << 30)
        bomb = png_bomb(16384)
        for k in range(4):
            (bad / f"zw{k}.png").write_bytes(bomb)
        (folders["giant"] / "c00" / "zv.png").write_bytes(png_bomb(12000))
        results = {"bomb_png_bytes": len(bomb), "threads": args.threads, "epochs": args.epochs}
        # clean twice, at both ends, for the noise between two runs of one folder.
        for name in ("clean", "hostile", "giant", "clean"):
            key = name if name not in results else "clean_again"
            results[key] = measure(args.ladle, folders[name], args.threads, args.epochs)
            print(key, results[key], file=sys.stderr)
        clean = min(results["clean"]["peak_rss_kib"], results["clean_again"]["peak_rss_kib"])
        results["hostile_peak_over_clean"] = round(results["hostile"]["peak_rss_kib"] / clean, 3)
        results["giant_final_over_clean"] = round(
            results["giant"]["final_rss_kib"] / results["clean"]["final_rss_kib"], 3)
        print(json.dumps(results, indent=1))
        if args.json:
            args.json.write_text(json.dumps(results, indent=1) + "\n")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
