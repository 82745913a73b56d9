"""Crop-aware decode: ladle's whole-image and crop-aware paths against Pillow, per core.

Real camera photos (scikit-image's bundled ones), cut into 4:3 windows and resized to
500x375 (ImageNet-like), saved by Pillow as baseline 4:2:0 JPEGs at quality 90. Per sample:
decode + RandomResizedCrop(224) + RandomHorizontalFlip, single thread, files in memory.

- pillow: torchvision's PIL path: ``Image.open(...).convert("RGB")`` (ImageFolder's loader),
  ``img.crop(box).resize((224, 224), BILINEAR)`` (``F.resized_crop``), ``transpose`` for the
  flip, ``np.asarray`` (``PILToTensor``'s copy).
- ladle whole / crop-aware: ``benches/src/bin/crop_decode.rs`` (which first checks that both
  give identical bytes).

Rounds alternate Pillow and ladle in one invocation; CPU time of the measuring thread.

    pip install pillow numpy scikit-image
    cargo build --release -p ladle-benches --bin crop_decode
    python benches/python/crop_decode.py --rounds 3
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
PHOTOS = ["astronaut", "chelsea", "coffee", "rocket", "retina", "hubble_deep_field",
          "immunohistochemistry"]
WINDOWS = [(1.0, 0.5, 0.5), (0.9, 0, 0), (0.9, 1, 1), (0.8, 0.2, 0.7), (0.8, 0.8, 0.3),
           (0.7, 0.5, 0.5)]


def make_set(out: Path) -> None:
    import skimage.data

    out.mkdir(parents=True, exist_ok=True)
    for name in PHOTOS:
        im = Image.fromarray(getattr(skimage.data, name)()[..., :3])
        w, h = im.size
        for k, (s, fx, fy) in enumerate(WINDOWS):
            cw = min(w, h * 4 / 3) * s
            ch = cw * 3 / 4
            x, y = (w - cw) * fx, (h - ch) * fy
            r = im.crop((int(x), int(y), int(x + cw), int(y + ch))).resize((500, 375), Image.LANCZOS)
            if k % 2:
                r = r.transpose(Image.FLIP_LEFT_RIGHT)
            r.save(out / f"{name}_{k}.jpg", quality=90)


def rrc_params(rng: random.Random, width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params (scale 0.08-1, ratio 3/4-4/3)."""
    area = width * height
    lo, hi = math.log(3 / 4), math.log(4 / 3)
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(lo, hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    return 0, 0, height, width


def pillow_us(files: list[bytes], passes: int) -> float:
    rng = random.Random(0)
    start = time.thread_time()
    for _ in range(passes):
        for data in files:
            img = Image.open(io.BytesIO(data)).convert("RGB")
            top, left, h, w = rrc_params(rng, *img.size)
            img = img.crop((left, top, left + w, top + h)).resize((224, 224), Image.BILINEAR)
            if rng.random() < 0.5:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
            np.asarray(img)
    return (time.thread_time() - start) * 1e6 / (passes * len(files))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ladle-crop-photos"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=20)
    args = ap.parse_args()
    if not any(args.dir.glob("*.jpg")):
        make_set(args.dir)
    files = [p.read_bytes() for p in sorted(args.dir.glob("*.jpg"))]
    probe = ROOT / "target" / "release" / "crop_decode"
    rows = []
    for r in range(args.rounds):
        pil = pillow_us(files, args.passes)
        out = subprocess.run([str(probe), str(args.dir), "--rounds", "1", "--passes",
                              str(args.passes)], check=True, capture_output=True, text=True)
        if r == 0:
            print(out.stderr.strip(), file=sys.stderr)
        lad = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append((pil, lad))
        print(f"round {r}: pillow {pil:.0f} us, ladle whole {lad['us_whole_rrc_flip']:.0f} us "
              f"(decode {lad['us_decode_whole']:.0f}), crop-aware "
              f"{lad['us_crop_aware_rrc_flip']:.0f} us (decode {lad['us_decode_rows']:.0f}); "
              f"pillow/whole {pil / lad['us_whole_rrc_flip']:.2f}, "
              f"pillow/crop-aware {pil / lad['us_crop_aware_rrc_flip']:.2f}")
    med = statistics.median
    print(json.dumps({
        "files": len(files),
        "mean_kb": sum(map(len, files)) / len(files) / 1e3,
        "pillow_us": med(p for p, _ in rows),
        "ladle_whole_us": med(l["us_whole_rrc_flip"] for _, l in rows),
        "ladle_crop_aware_us": med(l["us_crop_aware_rrc_flip"] for _, l in rows),
        "decode_whole_us": med(l["us_decode_whole"] for _, l in rows),
        "decode_rows_us": med(l["us_decode_rows"] for _, l in rows),
        "pillow_over_whole": med(p / l["us_whole_rrc_flip"] for p, l in rows),
        "pillow_over_crop_aware": med(p / l["us_crop_aware_rrc_flip"] for p, l in rows),
    }, indent=1))


if __name__ == "__main__":
    main()
