#!/usr/bin/env python3
"""Plots the collocated-training figures of a ``run_all.sh`` JSON (needs matplotlib).

Usage: python3 benches/gpu/plot.py benches/results/gpu.json benches/results/gpu-colocate.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    data = json.load(open(src))
    col = data["sections"]["colocate"]["result"]
    configs = [c for c in col["configs"] if not c.get("error")]
    names = [c["name"] for c in configs]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 5))
    bottoms = [0.0] * len(configs)
    sizes = sorted({r["batch_size"] for c in configs for r in c["runs"]})
    for b in sizes:
        vals = [next((r["images_per_s"] or 0 for r in c["runs"] if r["batch_size"] == b), 0)
                for c in configs]
        ax1.bar(names, vals, bottom=bottoms, label=f"batch {b}")
        bottoms = [x + y for x, y in zip(bottoms, vals)]
    ax1.set_ylabel("images/s (stacked per run)")
    ax1.set_title("training throughput")
    ax1.legend(fontsize=8)
    ax2.bar(names, [c["cpu_seconds_per_1000_images"] for c in configs], color="tab:red")
    ax2.set_ylabel("CPU-seconds per 1000 images")
    ax2.set_title("CPU cost (whole configuration)")
    ax3.bar(names, [(c.get("gpu") or {}).get("sm_activity_mean") or 0 for c in configs],
            color="tab:green")
    ax3.set_ylabel("SM activity, % (NVML GPM, mean over the window)")
    ax3.set_title("GPU use")
    for ax in (ax1, ax2, ax3):
        ax.tick_params(axis="x", rotation=35, labelsize=8)
    fig.suptitle(f"ResNet-18 under MPS on {data.get('device')}: one ladle feed vs "
                 f"PyTorch DataLoaders ({data.get('cores')} cores, and taskset 4 cores)")
    fig.tight_layout()
    fig.savefig(dst, dpi=100)


if __name__ == "__main__":
    main()
