#!/usr/bin/env python3
"""ladle's transforms against torchvision's, on real photographs, with the same random draws.

For each case, the probe binary (``benches/src/bin/transform_probe.rs``) runs a ladle pipeline
on a photo for several sample indices, writes each output and prints what every transform
drew (crop box, padding, flip, jitter factors and order, TrivialAugmentWide's operation and
magnitude). This file replays those parameters with ``torchvision.transforms.functional``
on the same photo and compares pixel by pixel, against both of torchvision's paths: the
uint8 tensor path (``F.*`` on a ``[3, H, W]`` uint8 tensor) and the PIL path.

Resampling is bilinear with antialiasing on both sides (ladle has no other mode; the
replay passes ``InterpolationMode.BILINEAR, antialias=True``); TrivialAugmentWide's
geometric operations use nearest, as torchvision's default for it.

Run as a test (skips where torch/torchvision, scikit-image or the probe are missing)::

    cargo build --release -p ladle-benches --bin transform_probe
    python -m pytest benches/python/test_transforms_parity.py -v

or as a script, to print the table of ``benches/README.md``::

    python benches/python/test_transforms_parity.py
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: parity test skipped")
pytest.importorskip("torchvision", reason="torchvision is not installed: parity test skipped")
np = pytest.importorskip("numpy")
Image = pytest.importorskip("PIL.Image")

import torchvision.transforms.functional as F  # noqa: E402
from torchvision.transforms import InterpolationMode  # noqa: E402
from torchvision.transforms.autoaugment import _apply_op  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PHOTOS = ("chelsea", "coffee")  # 451×300 and 600×400: not square, so a swapped axis shows
SEED = 7

# (case, ladle spec, indices per photo). Per-pixel transforms run after an exact
# CenterCrop(256) because a pipeline must end in a fixed square size.
CASES = [
    ("RandomResizedCrop(224)", "RandomResizedCrop(224)", 12),
    ("RandomResizedCrop(96, scale=(0.5, 1))", "RandomResizedCrop(96, scale=(0.5, 1.0))", 12),
    ("RandomCrop(256, padding=16) constant", "RandomCrop(256, padding=16)", 12),
    ("RandomCrop edge", "RandomCrop(256, padding=(16, 8, 4, 2), padding_mode='edge')", 12),
    ("RandomCrop reflect", "RandomCrop(256, padding=16, padding_mode='reflect')", 12),
    ("RandomCrop symmetric", "RandomCrop(256, padding=16, padding_mode='symmetric')", 12),
    ("RandomCrop(480, pad_if_needed) constant", "RandomCrop(480, pad_if_needed=True)", 8),
    ("RandomCrop(480, pad_if_needed) reflect",
     "RandomCrop(480, pad_if_needed=True, padding_mode='reflect')", 8),
    ("Resize((224, 224))", "Resize((224, 224))", 1),
    ("Resize(256), CenterCrop(224) (fused)", "Resize(256), CenterCrop(224)", 1),
    ("CenterCrop(224)", "CenterCrop(224)", 1),
    ("CenterCrop(320) (pads)", "CenterCrop(320)", 1),
    ("RandomHorizontalFlip", "CenterCrop(256), RandomHorizontalFlip()", 8),
    ("RandomVerticalFlip", "CenterCrop(256), RandomVerticalFlip()", 8),
    ("ColorJitter(brightness=0.8)", "CenterCrop(256), ColorJitter(brightness=0.8)", 12),
    ("ColorJitter(contrast=0.8)", "CenterCrop(256), ColorJitter(contrast=0.8)", 12),
    ("ColorJitter(saturation=0.8)", "CenterCrop(256), ColorJitter(saturation=0.8)", 12),
    ("ColorJitter(hue=0.5)", "CenterCrop(256), ColorJitter(hue=0.5)", 12),
    ("ColorJitter(0.4, 0.4, 0.4, 0.1)", "CenterCrop(256), ColorJitter(0.4, 0.4, 0.4, 0.1)", 12),
    ("RandomGrayscale(p=0.5)", "CenterCrop(256), RandomGrayscale(p=0.5)", 8),
    ("TrivialAugmentWide", "CenterCrop(256), TrivialAugmentWide()", 160),
]

# Tolerances on the tensor path, per sample: (largest mean |diff|, largest |diff|).
# Copies (crops, padding, flips) and most of TrivialAugmentWide must be exact. Resampling
# differs by rounding (ladle's fast_image_resize against torch's antialiased bilinear: at
# most 1 level where measured). Colour ops that use a grayscale image differ by one level:
# ladle's grayscale is PIL's (0.299/0.587/0.114, rounded) where the tensor path truncates
# 0.2989/0.587/0.114; chained in ColorJitter the contrast factor amplifies that level.
# For scale: a crop box off by one pixel gives a mean difference of several levels on these
# photos, a flip on the wrong axis tens of levels.
EXACT = (0.0, 0)
RESAMPLED = (0.3, 2)
GRAY_ROUNDING = (0.75, 1)
TOLERANCE = {
    "RandomResizedCrop(224)": RESAMPLED,
    "RandomResizedCrop(96, scale=(0.5, 1))": RESAMPLED,
    "Resize((224, 224))": RESAMPLED,
    "Resize(256), CenterCrop(224) (fused)": RESAMPLED,
    "ColorJitter(contrast=0.8)": GRAY_ROUNDING,
    "ColorJitter(saturation=0.8)": GRAY_ROUNDING,
    "ColorJitter(0.4, 0.4, 0.4, 0.1)": (0.5, 8),
    "RandomGrayscale(p=0.5)": GRAY_ROUNDING,
}
# TrivialAugmentWide, per operation, on the tensor path.
TA_TOLERANCE = {
    "Color": GRAY_ROUNDING,
    "Contrast": GRAY_ROUNDING,
    "Sharpness": (0.1, 1),
}


def probe_binary() -> Path:
    for profile in ("release", "debug"):
        path = REPO / "target" / profile / "transform_probe"
        if path.exists():
            return path
    pytest.skip("no probe binary: run `cargo build --release -p ladle-benches "
                "--bin transform_probe` first")


@functools.lru_cache(maxsize=None)
def photo(name: str) -> np.ndarray:
    data = pytest.importorskip("skimage.data", reason="scikit-image gives the real photos")
    return np.ascontiguousarray(getattr(data, name)()[..., :3])


def run_probe(spec: str, photo_name: str, indices: int, tmp: Path) -> list[dict]:
    src = tmp / f"{photo_name}.png"
    if not src.exists():
        Image.fromarray(photo(photo_name)).save(src)
    out_dir = tmp / f"out-{abs(hash((spec, photo_name)))}"
    result = subprocess.run(
        [probe_binary(), "--transform", spec, "--input", src, "--out-dir", out_dir,
         "--indices", str(indices), "--seed", str(SEED)],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"transform_probe failed on {spec!r}: {result.stderr}")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    for line in lines:
        line["pixels"] = np.asarray(Image.open(line["output"]).convert("RGB"))
    return lines


def replay(img, drawn: list[dict], side: int):
    """torchvision with ladle's parameters; ``img`` is a uint8 CHW tensor or a PIL image."""
    bilinear = InterpolationMode.BILINEAR
    for d in drawn:
        t = d["transform"]
        if t == "RandomResizedCrop":
            img = F.resized_crop(img, d["top"], d["left"], d["height"], d["width"],
                                 [side, side], interpolation=bilinear, antialias=True)
        elif t == "RandomCrop":
            mode = d["mode"]
            if any(d["padding"]):
                img = F.pad(img, d["padding"], fill=0, padding_mode=mode)
            px, py = d["pad_if_needed"]
            if px:
                img = F.pad(img, [px, 0], fill=0, padding_mode=mode)
            if py:
                img = F.pad(img, [0, py], fill=0, padding_mode=mode)
            img = F.crop(img, d["top"], d["left"], side, side)
        elif t == "Resize":
            img = F.resize(img, [d["height"], d["width"]], interpolation=bilinear,
                           antialias=True)
        elif t == "CenterCrop":
            img = F.center_crop(img, [d["height"], d["width"]])
        elif t == "RandomHorizontalFlip":
            img = F.hflip(img) if d["flipped"] else img
        elif t == "RandomVerticalFlip":
            img = F.vflip(img) if d["flipped"] else img
        elif t == "RandomGrayscale":
            img = F.rgb_to_grayscale(img, num_output_channels=3) if d["applied"] else img
        elif t == "ColorJitter":
            adjust = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
            names = ["brightness", "contrast", "saturation", "hue"]
            for k in d["order"]:
                if d[names[k]] is not None:
                    img = adjust[k](img, d[names[k]])
        elif t == "TrivialAugmentWide":
            img = _apply_op(img, d["op"], d["magnitude"] or 0.0,
                            interpolation=InterpolationMode.NEAREST, fill=None)
        else:
            raise AssertionError(f"unknown drawn transform {t}")
    return img


def as_hwc(img) -> np.ndarray:
    if isinstance(img, torch.Tensor):
        return img.permute(1, 2, 0).contiguous().numpy()
    return np.asarray(img.convert("RGB"))


def padding_mode_of(spec: str) -> str:
    for mode in ("edge", "reflect", "symmetric"):
        if f"'{mode}'" in spec:
            return mode
    return "constant"


@functools.lru_cache(maxsize=None)
def measure(case: str) -> dict:
    """Per-sample diffs of one case against both torchvision paths, over both photos."""
    spec, indices = next((s, n) for c, s, n in CASES if c == case)
    samples = []
    with tempfile.TemporaryDirectory(prefix="ladle-parity-") as tmp:
        for name in PHOTOS:
            rgb = photo(name)
            tensor = torch.from_numpy(rgb).permute(2, 0, 1).contiguous()
            pil = Image.fromarray(rgb)
            for line in run_probe(spec, name, indices, Path(tmp)):
                ours = line["pixels"].astype(np.int16)
                side = ours.shape[0]
                for d in line["drawn"]:
                    if d["transform"] == "RandomCrop":
                        d["mode"] = padding_mode_of(spec)
                sample = {"photo": name, "index": line["index"], "drawn": line["drawn"]}
                for path, img in (("tensor", tensor), ("pil", pil)):
                    theirs = as_hwc(replay(img, line["drawn"], side)).astype(np.int16)
                    assert theirs.shape == ours.shape, (case, path, theirs.shape, ours.shape)
                    diff = np.abs(ours - theirs)
                    sample[path] = (float(diff.mean()), int(diff.max()))
                samples.append(sample)
    return {"case": case, "spec": spec, "samples": samples}


def summary(samples: list[dict], path: str) -> tuple[float, float, int]:
    """(mean of the per-sample mean |diff|, largest per-sample mean, largest |diff|)."""
    means = [s[path][0] for s in samples]
    return sum(means) / len(means), max(means), max(s[path][1] for s in samples)


def check(label: str, samples: list[dict], tolerance: tuple) -> None:
    worst_mean, worst_max = tolerance
    if worst_mean is None:
        return
    _, largest_mean, largest = summary(samples, "tensor")
    bad = [s for s in samples if s["tensor"][0] > worst_mean or s["tensor"][1] > worst_max]
    assert not bad, (
        f"{label}: ladle differs from torchvision (tensor path) beyond "
        f"mean {worst_mean} / max {worst_max}: worst sample mean {largest_mean:.3f}, "
        f"max {largest}; first bad sample {bad[0]['photo']} #{bad[0]['index']} "
        f"drew {bad[0]['drawn']}"
    )


@pytest.mark.parametrize("case", [c for c, _, _ in CASES if c != "TrivialAugmentWide"])
def test_ladle_matches_torchvision_with_the_same_parameters(case: str) -> None:
    result = measure(case)
    check(case, result["samples"], TOLERANCE.get(case, EXACT))


def by_op(samples: list[dict]) -> dict[str, list[dict]]:
    ops: dict[str, list[dict]] = {}
    for s in samples:
        op = next(d["op"] for d in s["drawn"] if d["transform"] == "TrivialAugmentWide")
        ops.setdefault(op, []).append(s)
    return dict(sorted(ops.items()))


def test_every_trivial_augment_wide_operation_matches_torchvision() -> None:
    ops = by_op(measure("TrivialAugmentWide")["samples"])
    assert len(ops) == 14, f"only {sorted(ops)} were drawn; raise the number of indices"
    for op, samples in ops.items():
        check(f"TrivialAugmentWide {op}", samples, TA_TOLERANCE.get(op, EXACT))


def test_the_drawn_parameters_vary_with_the_index() -> None:
    """A probe that reported the same draw for every index would make the replay vacuous."""
    samples = measure("RandomResizedCrop(224)")["samples"]
    boxes = {json.dumps(s["drawn"]) for s in samples}
    assert len(boxes) > len(samples) // 2
    flips = [s["drawn"][1]["flipped"] for s in measure("RandomHorizontalFlip")["samples"]]
    assert any(flips) and not all(flips)


def table() -> str:
    rows = ["| transform (ladle spec) | samples | tensor: mean abs diff | tensor: max abs diff "
            "| PIL: mean abs diff | PIL: max abs diff |",
            "|---|---|---|---|---|---|"]

    def row(label: str, samples: list[dict]) -> str:
        t_mean, _, t_max = summary(samples, "tensor")
        p_mean, _, p_max = summary(samples, "pil")
        return (f"| {label} | {len(samples)} | {t_mean:.3f} | {t_max} | "
                f"{p_mean:.3f} | {p_max} |")

    for case, spec, _ in CASES:
        samples = measure(case)["samples"]
        if case == "TrivialAugmentWide":
            for op, op_samples in by_op(samples).items():
                rows.append(row(f"TrivialAugmentWide: {op}", op_samples))
        else:
            rows.append(row(f"`{spec}`", samples))
    return "\n".join(rows)


if __name__ == "__main__":
    print(f"torch {torch.__version__}, torchvision "
          f"{__import__('torchvision').__version__}, photos {PHOTOS}, seed {SEED}",
          file=sys.stderr)
    print(table())
