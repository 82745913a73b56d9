"""A `ladle cost` recording made from the committed H100 colocation figures (issue 30).

`benches/results/gpu.json` holds `colocate.py`'s measurements on an H100: four ResNet-18
runs (batch 32/64/128/256) fed by one ladle feed, and by four DataLoaders, pinned to 16 and to
4 cores, each over a 30 s window. This script writes the 16-core ladle configuration as the
recording a `ladle sweep --record` of it would have left (report.json, consumers.csv,
jobs.csv, gpus.csv, meta.json, and baseline.json from the 16-core DataLoader configuration), so that
`ladle cost` prices it and predicts the other core counts, and then sets those predictions
against what was measured at 4 cores (twice: `colocate` and `colocate_repeat`).

    python benches/gpu/cost_recording.py --out /tmp/h100-rec [--ladle target/release/ladle]

What is converted, and how:
- Runs: one consumer row at the window's start (0 samples) and one at its end (the images the
  run trained in the window). Before pacing (issue 28) the runs went in lockstep at the
  slowest run's pace; the batch-32 run waited for data 2.5% of the window and the others
  waited for it (55-86%), not for the CPU. Each run's wait is therefore taken as the pacing
  run's: their GPU-bound rates are the measured collocated rates (about 2740 images/s each),
  not the rates each reached while the others held it back, which the GPU could not have given
  all four at once (86% SM activity at 10957 images/s). GPU memory peaks: NVML's per process.
- CPU: the window's CPU-seconds of every process (`cpu_seconds_window`) split between the
  feed and the runs as their CPU over their whole lives was; decoded = the largest run's images
  (lockstep: each decoded image served all four).
- Private pipelines (`baseline.json`): the 16-core DataLoader configuration's window CPU per
  image, less the runs' own CPU per image with ladle (the training loop's share).
"""

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def config(section, name):
    return next(c for c in section["result"]["configs"] if c["name"] == name)


def window_cpu_split(c):
    """(feed, [runs]) CPU-seconds in the window, split as over the processes' lives."""
    runs_life = [r["cpu_seconds_wait4"] for r in c["runs"]]
    life = c.get("producer_cpu_seconds", 0.0) + sum(runs_life)
    scale = c["cpu_seconds_window"] / life
    return c.get("producer_cpu_seconds", 0.0) * scale, [x * scale for x in runs_life]


def write_recording(gpu, out):
    colocate = gpu["sections"]["colocate"]
    c = config(colocate, "ladle-16c")
    t0 = c["t0"]
    w0, w1 = c["window_s"]
    feed_cpu, runs_cpu = window_cpu_split(c)
    pace_wait = min(r["data_wait_s_window"] for r in c["runs"])
    out.mkdir(parents=True, exist_ok=True)
    names = [f"run-{k:02d}" for k in range(len(c["runs"]))]
    with open(out / "consumers.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["time", "feed", "id", "name", "pid", "batch_size", "released", "epochs",
                       "samples_per_s", "lag", "attached", "held_back_s", "waited_s",
                       "holding_back", "rejoins", "skimming"])
        for k, (name, r) in enumerate(zip(names, c["runs"])):
            n = r["dataset_len"]
            for t, released, waited in ((w0, 0, 0.0), (w1, r["images"], pace_wait)):
                rows.writerow([t0 + t, "h100", k, name, r["pid"], r["batch_size"], released,
                               released / n, r["images_per_s"], 0, "true", 0.0, waited,
                               "false", 0, "false"])
    with open(out / "jobs.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["time", "id", "name", "state", "gpus", "feed", "estimate_mib", "peak_mib",
                       "attempts", "oom_retries"])
        for k, (name, r) in enumerate(zip(names, c["runs"])):
            rows.writerow([t0 + w1, k + 1, name, "running", "0", "h100", int(r["nvml_memory_mib"]),
                           int(r["nvml_memory_mib"]), 1, 0])
    with open(out / "gpus.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["time", "gpu", "name", "memory_used_mib", "memory_total_mib", "utilization",
                       "sm_activity", "sm_activity_risk", "jobs"])
        g = c["gpu"]
        rows.writerow([t0 + w1, 0, colocate["result"]["device"], int(g["memory_used_mib_max"]),
                       81559, g["util_mean"], g["sm_activity_mean"], 0.0, len(c["runs"])])
    decoded = max(r["images"] for r in c["runs"])
    consumed = c["images_window"]
    private_cpu = feed_cpu / decoded * consumed + sum(runs_cpu)
    report = {
        "runs": [
            {"name": name, "args": ["train_resnet18.py", "--batch-size", str(r["batch_size"])],
             "state": "succeeded", "exit_code": 0, "reason": None, "log": None,
             "stderr_log": None, "seconds": w1 - w0, "gpu": [0], "last_lines": [],
             "cpu_seconds": cpu}
            for name, r, cpu in zip(names, c["runs"], runs_cpu)
        ],
        "feed": {"socket": "", "reused": False, "samples_published": decoded,
                 "samples_consumed": consumed, "bad_samples": 0, "cpu_seconds": feed_cpu},
        "wall_seconds": w1 - w0,
        "cpu_seconds": c["cpu_seconds_window"],
        "cost": {"cpu_seconds": c["cpu_seconds_window"],
                 "gpu_hours": len(names) * (w1 - w0) / 3600, "dollars": None,
                 "private_pipelines_cpu_seconds": private_cpu, "private_pipelines_dollars": None},
    }
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "meta.json").write_text(json.dumps({
        "command": ["benches/gpu/cost_recording.py", "(from benches/results/gpu.json, "
                    "colocate ladle-16c)"],
        "start_time": t0 + w0, "version": "0.1.0"}) + "\n")
    d = config(colocate, "dataloader-16c")
    runs_own = sum(runs_cpu) / consumed
    baseline = {
        "dataset": "the H100 run's 1000 JPEGs (colocate dataloader-16c)",
        "samples": d["images_window"],
        "seconds": w1 - w0,
        "cpu_seconds": d["cpu_seconds_window"] - runs_own * d["images_window"],
        "workers": d["dataloader_workers_per_run"], "batch_size": 128, "image_size": 224,
        "python": colocate["result"].get("python", ""),
        "torch": gpu.get("torch", ""), "torchvision": colocate["result"].get("torchvision", ""),
    }
    (out / "baseline.json").write_text(json.dumps(baseline, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=str(ROOT / "benches/results/gpu.json"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--ladle", default=str(ROOT / "target/release/ladle"))
    args = ap.parse_args()
    gpu = json.loads(Path(args.results).read_text())
    out = Path(args.out)
    write_recording(gpu, out)
    shapes = out / "shapes.csv"
    shapes.write_text("name,vcpus,gpus,gpu_model,gpu_mem_gib,usd_per_hour\n"
                      "16 cores,16,1,H100,80,1\n4 cores,4,1,H100,80,1\n")
    done = subprocess.run([args.ladle, "cost", str(out), "--instances", str(shapes), "--json"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(done.stderr)
    predicted = {s["name"]: s for s in json.loads(done.stdout)["shapes"]}
    shapes.unlink()
    print("| loading | cores | predicted images/s | measured (colocate) | measured (repeat) |")
    print("|---|---|---|---|---|")
    for way, kind in (("ladle", "ladle"), ("private", "dataloader")):
        for cores in (16, 4):
            p = predicted[f"{cores} cores"][way]["samples_per_s"]
            m = [config(gpu["sections"][s], f"{kind}-{cores}c")["aggregate_images_per_s"]
                 for s in ("colocate", "colocate_repeat")]
            print(f"| {way} | {cores} | {p:.0f} ({predicted[f'{cores} cores'][way]['bound']}) | "
                  f"{m[0]:.0f} ({100 * (p / m[0] - 1):+.0f}%) | {m[1]:.0f} "
                  f"({100 * (p / m[1] - 1):+.0f}%) |")


if __name__ == "__main__":
    main()
