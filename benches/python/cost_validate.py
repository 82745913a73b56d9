"""`ladle cost`'s model against measured sweeps at other CPU budgets (issue 30, item 3).

One workload, run on this machine pinned to 1 core and to 2 cores (`taskset`), repeated:

- **ladle**: `ladle sweep --gpu sim` of four `ladle consume` runs (batch 32 and 64, a training
  step emulated as 50 or 100 ms of holding each batch: four different GPU-bound rates), one
  feed, recorded (`--record`);
- **private pipelines**: the same four runs, each a Python process with its own torchvision
  `ImageFolder` + `DataLoader` (RandomResizedCrop(224) + flip, one worker) sleeping the same
  step per batch, started together once all have imported torch.

`ladle bench baseline` measures the private pipeline's CPU per sample once, and is written into
every recording. Then each recording predicts both budgets with `ladle cost` (shapes of 1 and 2
vCPUs and one 80 GiB GPU) and the predictions are set against the measured walls: mean and
standard deviation over the repetitions, and the error of the mean prediction.

    python benches/python/cost_validate.py --dataset /tmp/photorep \
        --python /work/torchenv/bin/python --reps 3 --out benches/results/cost_validation.json

What the model does not see: the scheduler admits the runs one telemetry window apart (0.6 s
at the `--tick-ms 20` used here; 30 s at the default 1 s tick), the feed and the runs start up
and stop (in the ladle walls), and Python imports torch (excluded from the private walls,
which start when every run has imported it). The private runs' own CPU per sample, measured in
place, is printed beside the baseline's.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCHES = (32, 64)

PRIVATE_RUN = r"""
import json, os, resource, sys, time
root, bs, step_ms, epochs, workers, go = sys.argv[1:7]
bs, step_ms, epochs, workers = int(bs), float(step_ms), int(epochs), int(workers)
import torch
from torchvision import datasets, transforms
t = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                        transforms.PILToTensor()])
loader = torch.utils.data.DataLoader(datasets.ImageFolder(root, transform=t), batch_size=bs,
                                     shuffle=True, num_workers=workers)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.005)
def cpu():
    return sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF,
               resource.RUSAGE_CHILDREN) for f in ("ru_utime", "ru_stime"))
start, cpu0, n = time.monotonic(), cpu(), 0
for _ in range(epochs):
    for _, labels in loader:
        time.sleep(step_ms / 1000)
        n += len(labels)
# Each epoch's workers were joined at its end: their CPU is in RUSAGE_CHILDREN.
print(json.dumps({"samples": n, "seconds": time.monotonic() - start, "cpu_seconds": cpu() - cpu0}),
      flush=True)
"""


def grid(values):
    return "{" + ",".join(str(v) for v in values) + "}"


def runs_of(args):
    """The grid's runs, in its order (the last option varies fastest)."""
    return [(b, s) for b in BATCHES for s in args.steps]


def cpus(budget):
    return ",".join(str(c) for c in range(budget))


def ladle_sweep(args, budget, work):
    out, rec = work / f"out-{budget}", work / f"rec-{budget}"
    cmd = [
        "taskset", "-c", cpus(budget), args.ladle, "sweep", "--dataset", args.dataset,
        "--threads", str(budget), "--gpu", "sim", "--sim-gpus", "1", "--gpu-mem", "2GiB",
        "--private-scheduler", "--settle-s", "0", "--tick-ms", "20", "--measure-s", "0.2",
        "--out", str(out), "--record", str(rec), "--json", "--",
        args.ladle, "consume", "--batch-size", grid(BATCHES), "--step-ms", grid(args.steps),
        "--epochs", str(args.epochs),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"sweep failed ({done.returncode}):\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout)
    return rec, report


def private_sweep(args, budget, work):
    go = work / f"go-{budget}"
    procs = []
    for batch, step in runs_of(args):
        procs.append(
            subprocess.Popen(
                ["taskset", "-c", cpus(budget), args.python, "-c", PRIVATE_RUN, args.dataset,
                 str(batch), str(step), str(args.epochs), "1", str(go)],
                stdout=subprocess.PIPE, text=True,
            )
        )
    for p in procs:
        line = p.stdout.readline()
        if line.strip() != "ready":
            sys.exit(f"a private run did not start: {line!r}")
    go.touch()
    runs = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            sys.exit(f"a private run failed ({p.returncode})")
        runs.append(json.loads(out.strip().splitlines()[-1]))
    return max(r["seconds"] for r in runs), runs


def predict(args, rec, shapes):
    done = subprocess.run(
        [args.ladle, "cost", str(rec), "--instances", str(shapes), "--json"],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        sys.exit(f"ladle cost failed:\n{done.stderr}")
    v = json.loads(done.stdout)
    return {
        s["name"]: {"ladle": s["ladle"]["wall_seconds"], "private": s["private"]["wall_seconds"]}
        for s in v["shapes"]
    }, v["workload"]


def summary(xs):
    return {
        "mean": statistics.fmean(xs),
        "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "values": xs,
    }


def table(rows):
    print("\n| loading | cores | measured wall (s) | recorded at | predicted wall (s) | error |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        m, p = r["measured_wall_s"], r["predicted_wall_s"]
        print(f"| {r['way']} | {r['target_cores']} | {m['mean']:.1f} ± {m['sd']:.1f} | "
              f"{r['recorded_at_cores']} core(s) | {p['mean']:.1f} ± {p['sd']:.1f} | "
              f"{100 * r['error']:+.0f}% |")


def repredict(args):
    path = Path(args.repredict)
    results = json.loads(path.read_text())
    work = Path(results["work"])
    shapes = work / "shapes.csv"
    for row in results["rows"]:
        source, target, way = row["recorded_at_cores"], row["target_cores"], row["way"]
        values = []
        for rep in range(results["reps"]):
            walls, _ = predict(args, work / f"rep{rep}" / f"rec-{source}", shapes)
            values.append(walls[str(target)][way])
        row["predicted_wall_s"] = summary(values)
        row["error"] = row["predicted_wall_s"]["mean"] / row["measured_wall_s"]["mean"] - 1.0
    table(results["rows"])
    path.write_text(json.dumps(results, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", required=True, help="an ImageFolder of real photos")
    ap.add_argument("--ladle", default=str(Path(__file__).resolve().parents[2] / "target/release/ladle"))
    ap.add_argument("--python", default=sys.executable, help="a Python with torch and torchvision")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--budgets", default="1,2", help="core counts, pinned with taskset")
    ap.add_argument("--steps", default="50,100",
                    help="the emulated training steps, ms per batch (a grid with batch 32 and 64)")
    ap.add_argument("--ways", default="ladle,private",
                    help="what to measure: ladle, private, or both (the default)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--repredict", metavar="RESULTS.json",
                    help="predict again from the recordings a previous run kept (its `work` "
                         "directory) with this `ladle`, keeping its measurements; rewrites it")
    args = ap.parse_args()
    if args.repredict:
        return repredict(args)
    budgets = [int(b) for b in args.budgets.split(",")]
    args.steps = [int(s) for s in args.steps.split(",")]
    ways = [w for w in ("ladle", "private") if w in args.ways.split(",")]
    work = Path(tempfile.mkdtemp(prefix="ladle-cost-validate-"))
    shapes = work / "shapes.csv"
    shapes.write_text(
        "name,vcpus,gpus,gpu_model,gpu_mem_gib,usd_per_hour\n"
        + "".join(f"{b},{b},1,sim,80,1.0\n" for b in budgets)
    )
    print(f"measuring the private pipeline's CPU per sample ({work})", file=sys.stderr)
    baseline = work / "baseline.json"
    done = subprocess.run(
        ["taskset", "-c", cpus(max(budgets)), args.ladle, "bench", "baseline", "--dataset",
         args.dataset, "--python", args.python, "--workers", "1", "--seconds", "20", "--json"],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        sys.exit(done.stderr)
    measured_baseline = json.loads(done.stdout)
    baseline.write_text(json.dumps(measured_baseline))
    print(f"  {measured_baseline['cpu_ms_per_sample']:.3f} ms per sample", file=sys.stderr)
    measured = {b: {"ladle": [], "private": []} for b in budgets}
    private_cpu_ms = {b: [] for b in budgets}
    # predicted[from][to][way]: lists over repetitions
    predicted = {f: {t: {"ladle": [], "private": []} for t in budgets} for f in budgets}
    workloads = {b: [] for b in budgets}
    for rep in range(args.reps):
        for budget in budgets:
            t0 = time.monotonic()
            rec, report = ladle_sweep(args, budget, work / f"rep{rep}")
            (rec / "baseline.json").write_text(baseline.read_text())
            measured[budget]["ladle"].append(report["wall_seconds"])
            priv_wall = float("nan")
            if "private" in ways:
                priv_wall, priv_runs = private_sweep(args, budget, work / f"rep{rep}")
                measured[budget]["private"].append(priv_wall)
                private_cpu_ms[budget].append(
                    1e3 * sum(r["cpu_seconds"] for r in priv_runs)
                    / sum(r["samples"] for r in priv_runs)
                )
            walls, workload = predict(args, rec, shapes)
            workloads[budget].append(workload)
            for target in budgets:
                for way in ("ladle", "private"):
                    predicted[budget][target][way].append(walls[str(target)][way])
            print(
                f"rep {rep} {budget} core(s): ladle {report['wall_seconds']:.1f} s, private "
                f"{priv_wall:.1f} s; predicted from here: "
                + ", ".join(f"{t}c ladle {walls[str(t)]['ladle']:.1f} private "
                            f"{walls[str(t)]['private']:.1f}" for t in budgets)
                + f" ({time.monotonic() - t0:.0f} s)",
                file=sys.stderr,
            )
    rows = []
    for target in budgets:
        for way in ways:
            m = summary(measured[target][way])
            for source in budgets:
                p = summary(predicted[source][target][way])
                rows.append({
                    "target_cores": target, "way": way, "recorded_at_cores": source,
                    "measured_wall_s": m, "predicted_wall_s": p,
                    "error": p["mean"] / m["mean"] - 1.0,
                })
    table(rows)
    for b, v in private_cpu_ms.items():
        if not v:
            continue
        m = summary(v)
        print(f"\nprivate runs at {b} core(s): {m['mean']:.3f} ± {m['sd']:.3f} ms CPU per sample "
              f"(the baseline measured alone: {measured_baseline['cpu_ms_per_sample']:.3f})")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "dataset": args.dataset, "epochs": args.epochs, "reps": args.reps,
            "steps_ms": args.steps, "work": str(work),
            "runs": [{"batch_size": b, "step_ms": s} for b, s in runs_of(args)],
            "baseline": measured_baseline, "rows": rows, "workloads": workloads,
            "private_runs_cpu_ms_per_sample": {
                b: summary(v) for b, v in private_cpu_ms.items() if v
            },
            "cores_online": os.cpu_count(),
        }, indent=1) + "\n")


if __name__ == "__main__":
    main()
