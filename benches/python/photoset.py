"""The real-photo set of the benchmarks that need ImageNet-like samples (cache_cost.py,
remote_cost.py): scikit-image's colour photographs (astronaut, chelsea, coffee, rocket,
retina, hubble_deep_field, ihc, the two motorcycles), each cut into crop_decode.py's six 4:3
windows resized to 500x375, each window encoded as JPEG four ways (baseline 4:2:0, 4:2:2, 4:4:4
and progressive 4:2:0, quality 90), then hard-linked into ``count`` files over 10 classes
(``c0`` … ``c9``). Needs Pillow (and scikit-image for the default source).
"""

from __future__ import annotations

from pathlib import Path

ENCODINGS = (
    ("b420", {"subsampling": 2}),
    ("b422", {"subsampling": 1}),
    ("b444", {"subsampling": 0}),
    ("p420", {"subsampling": 2, "progressive": True}),
)
# scikit-image's colour photographs (its drawings, charts and synthetic images left out).
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "retina", "hubble_deep_field", "ihc",
          "immunohistochemistry", "motorcycle_left", "motorcycle_right")
# crop_decode.py's windows: (share of the largest 4:3 window, x, y); odd ones mirrored.
WINDOWS = ((1.0, 0.5, 0.5), (0.9, 0, 0), (0.9, 1, 1), (0.8, 0.2, 0.7), (0.8, 0.8, 0.3),
           (0.7, 0.5, 0.5))


def default_source() -> Path | None:
    try:
        import skimage.data
    except ImportError:
        return None
    return Path(skimage.data.__file__).parent


def make_photos(src: Path, out: Path, count: int) -> None:
    from PIL import Image

    encoded = out.parent / f".{out.name}-encoded"
    encoded.mkdir(parents=True, exist_ok=True)
    files = []
    for photo in sorted(src.iterdir()):
        if photo.stem not in PHOTOS or photo.suffix.lower() not in (".png", ".jpg", ".jpeg"):
            continue
        im = Image.open(photo).convert("RGB")
        w, h = im.size
        for k, (s, fx, fy) in enumerate(WINDOWS):
            cw = min(w, h * 4 / 3) * s
            ch = cw * 3 / 4
            x, y = (w - cw) * fx, (h - ch) * fy
            window = im.crop((int(x), int(y), int(x + cw), int(y + ch)))
            window = window.resize((500, 375), Image.LANCZOS)
            if k % 2:
                window = window.transpose(Image.FLIP_LEFT_RIGHT)
            for name, options in ENCODINGS:
                path = encoded / f"{photo.stem}_{k}_{name}.jpg"
                window.save(path, "JPEG", quality=90, **options)
                files.append(path)
    if not files:
        raise SystemExit(f"{src}: none of the photographs {PHOTOS}")
    out.mkdir(parents=True)
    for k in range(count):
        klass = out / f"c{k % 10}"
        klass.mkdir(exist_ok=True)
        (klass / f"{k:06d}.jpg").hardlink_to(files[k % len(files)])


def samples(photos: Path) -> list[Path]:
    return sorted(photos.glob("c*/*.jpg"))
