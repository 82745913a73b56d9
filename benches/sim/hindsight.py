#!/usr/bin/env python3
"""How much could a better queue order gain? An instrument for issue 13's makespan target.

For each seed of the generated CARMA-like trace, replays CARMA's four rules (arrival order)
and `ladle` with its queue in several fixed orders (`ladle sim --order`):

- `fifo`: arrival order (what `ladle` does);
- oracle orders from the trace's true durations, which no scheduler is told:
  `lpt` (longest first), `spt` (shortest first), `lwork` (most GPU-seconds first);
- `wide`: two-GPU jobs first, else arrival order (a scheduler knows this much);
- `lpt~`: longest first by durations known only roughly, each true duration times
  `exp(N(0, --noise))` (default 0.3: typically within ±35%, as a user's declared run time
  might be), the mean over 5 draws;
- `hindsight-wide` and `hindsight-all`: a random local search (hill climbing, seeded by the
  seed) over the order of the two-GPU jobs only, or of every job, keeping any move that does
  not lengthen the makespan. The order it finds is tailored to one trace after the fact.

It prints `ladle`'s makespan ÷ the best CARMA rule of the seed for each order, and the
means. Standard library only; it runs the release binary (`cargo build --release -p ladle`).

    python3 benches/sim/hindsight.py --seeds 1-10 --iterations 300
"""

import argparse
import concurrent.futures
import csv
import json
import math
import os
import random
import subprocess
import sys
import tempfile

CARMA = ["carma-most-free", "carma-least-util", "carma-first-fit", "carma-best-fit"]


def parse_seeds(text):
    seeds = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            seeds.extend(range(int(a), int(b) + 1))
        else:
            seeds.append(int(part))
    return seeds


class Seed:
    def __init__(self, args, seed, workdir):
        self.args, self.seed = args, seed
        self.trace = os.path.join(workdir, f"trace-{seed}.csv")
        self.order_file = os.path.join(workdir, f"order-{seed}.txt")
        subprocess.run(
            [args.ladle, "sim", "generate", "--jobs", str(args.jobs), "--seed", str(seed),
             "--out", self.trace],
            check=True, capture_output=True)
        with open(self.trace, newline="") as f:
            self.jobs = list(csv.DictReader(f))

    def sim(self, policies, ranks=None):
        cmd = [self.args.ladle, "sim", "--trace", self.trace, "--gpus", str(self.args.gpus),
               "--gpu-mem", self.args.gpu_mem, "--json", "--policy", ",".join(policies)]
        if ranks is not None:
            ids = [j["job_id"] for _, j in sorted(zip(ranks, self.jobs), key=lambda p: p[0])]
            with open(self.order_file, "w") as f:
                f.write("\n".join(ids) + "\n")
            cmd += ["--order", self.order_file]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return json.loads(out)["policies"]

    def ladle(self, ranks):
        return self.sim(["ladle"], ranks)["ladle"]["makespan_s"]

    def search(self, movable, iterations):
        rng = random.Random(self.seed)
        n = len(self.jobs)
        ranks = [float(i) for i in range(n)]
        best = self.ladle(ranks)
        for _ in range(iterations):
            candidate = list(ranks)
            for _ in range(rng.choice([1, 1, 2, 3])):
                candidate[rng.choice(movable)] = rng.uniform(-1.0, float(n))
            makespan = self.ladle(candidate)
            if makespan <= best:
                ranks, best = candidate, makespan
        return best


def run_seed(args, seed, workdir):
    s = Seed(args, seed, workdir)
    carma = s.sim(CARMA)
    best_rule = min(CARMA, key=lambda p: carma[p]["makespan_s"])
    best = carma[best_rule]["makespan_s"]
    dur = [float(j["duration_s"]) for j in s.jobs]
    gpus = [int(j["gpus"]) for j in s.jobs]
    n = len(s.jobs)

    def rank_by(key):
        order = sorted(range(n), key=key)
        ranks = [0] * n
        for r, i in enumerate(order):
            ranks[i] = r
        return ranks

    result = {"seed": seed, "best_carma": best_rule, "best_carma_makespan_s": best}
    orders = {
        "fifo": list(range(n)),
        "lpt": rank_by(lambda i: (-dur[i], i)),
        "spt": rank_by(lambda i: (dur[i], i)),
        "lwork": rank_by(lambda i: (-dur[i] * gpus[i], i)),
        "wide": rank_by(lambda i: (-gpus[i], i)),
    }
    for name, ranks in orders.items():
        result[name] = s.ladle(ranks) / best
    noisy = []
    for draw in range(5):
        rng = random.Random(seed * 1000 + draw)
        guess = [d * math.exp(rng.gauss(0.0, args.noise)) for d in dur]
        noisy.append(s.ladle(rank_by(lambda i: (-guess[i], i))) / best)
    result["lpt~"] = sum(noisy) / len(noisy)
    wide = [i for i in range(n) if gpus[i] > 1]
    result["hindsight-wide"] = s.search(wide, args.iterations) / best if wide else result["fifo"]
    result["hindsight-all"] = s.search(list(range(n)), args.iterations) / best
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1-10")
    p.add_argument("--iterations", type=int, default=300,
                   help="search steps per seed and search (default 300)")
    p.add_argument("--noise", type=float, default=0.3,
                   help="log-normal sigma of the rough durations of `lpt~` (default 0.3)")
    p.add_argument("--jobs", type=int, default=60)
    p.add_argument("--gpus", type=int, default=3)
    p.add_argument("--gpu-mem", default="40GiB")
    p.add_argument("--ladle", default="target/release/ladle")
    p.add_argument("--parallel", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args()
    if not os.path.exists(args.ladle):
        sys.exit(f"{args.ladle} not found: run `cargo build --release -p ladle` first")
    columns = ["fifo", "lpt", "lpt~", "spt", "lwork", "wide", "hindsight-wide", "hindsight-all"]
    with tempfile.TemporaryDirectory() as workdir:
        with concurrent.futures.ProcessPoolExecutor(args.parallel) as pool:
            results = list(pool.map(run_seed, [args] * len(parse_seeds(args.seeds)),
                                    parse_seeds(args.seeds),
                                    [workdir] * len(parse_seeds(args.seeds))))
    print("ladle's makespan ÷ the best CARMA rule of each seed, by queue order")
    print("| seed | best CARMA | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 2) + "|")
    for r in results:
        print(f"| {r['seed']} | {r['best_carma']} | "
              + " | ".join(f"{r[c]:.3f}" for c in columns) + " |")
    means = {c: sum(r[c] for r in results) / len(results) for c in columns}
    worse = {c: sum(r[c] > 1.0 for r in results) for c in columns}
    print("| mean | | " + " | ".join(f"{means[c]:.3f}" for c in columns) + " |")
    print("| seeds worse | | " + " | ".join(str(worse[c]) for c in columns) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "means": means}, f, indent=1)


if __name__ == "__main__":
    main()
