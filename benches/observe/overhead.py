#!/usr/bin/env python3
"""What watching a feed costs: the same fan-out with and without observers, interleaved.

Each round runs `ladle serve` and 4 `ladle consume` processes (batch sizes 32, 64, 128, 256)
for --seconds, twice, in alternating order:
  plain     no observer;
  observed  `serve --metrics 127.0.0.1:PORT --record DIR`, a scraper reading /metrics once a
            second (Prometheus's own rate is once per 15 s), and a Stats request on the feed's
            socket 10 times a second (ten `ladle top`s).
It prints, per mode, aggregate consumer samples/s and CPU-seconds (all processes, from
getrusage of the children) per 1000 samples, and the ratios observed/plain per round and in
the median. Usage:
  python3 benches/observe/overhead.py --ladle target/release/ladle --rounds 3 --seconds 15
"""

import argparse
import json
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

BATCHES = [32, 64, 128, 256]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stats_request(path):
    """One Stats request on the feed's control socket (length-prefixed JSON)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        s.connect(path)
        body = json.dumps({"type": "Stats"}).encode()
        s.sendall(struct.pack("<I", len(body)) + body)
        head = s.recv(4, socket.MSG_WAITALL)
        (n,) = struct.unpack("<I", head)
        data = b""
        while len(data) < n:
            chunk = s.recv(n - len(data))
            if not chunk:
                break
            data += chunk
        return json.loads(data)


def children_cpu():
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def run_mode(ladle, dataset, seconds, observed, work):
    sock = os.path.join(work, f"feed-{observed}.sock")
    serve = [ladle, "serve", "--dataset", dataset, "--socket", sock,
             "--image-size", "112", "--threads", "1"]
    port = None
    if observed:
        port = free_port()
        serve += ["--metrics", f"127.0.0.1:{port}", "--record",
                  os.path.join(work, f"rec-{time.time_ns()}")]
    cpu0 = children_cpu()
    producer = subprocess.Popen(serve, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not os.path.exists(sock):
        if time.time() > deadline or producer.poll() is not None:
            sys.exit(f"ladle serve did not come up ({' '.join(serve)})")
        time.sleep(0.02)
    stop = threading.Event()
    watchers = []
    looks = {"scrapes": 0, "stats": 0}
    if observed:
        def scrape():
            while not stop.is_set():
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
                    looks["scrapes"] += 1
                except OSError:
                    pass
                stop.wait(1.0)

        def poll_stats():
            while not stop.is_set():
                try:
                    stats_request(sock)
                    looks["stats"] += 1
                except OSError:
                    pass
                stop.wait(0.1)

        watchers = [threading.Thread(target=scrape), threading.Thread(target=poll_stats)]
        for w in watchers:
            w.start()
    consumers = [
        subprocess.Popen([ladle, "consume", "--socket", sock, "--batch-size", str(b),
                          "--seconds", str(seconds), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for b in BATCHES
    ]
    rate = 0.0
    samples = 0
    for c in consumers:
        out, _ = c.communicate()
        summary = json.loads(out.strip().splitlines()[-1])
        rate += summary["samples_per_s"]
        samples += summary["samples"]
    stop.set()
    for w in watchers:
        w.join()
    producer.terminate()
    producer.wait()
    cpu = children_cpu() - cpu0
    return {"samples_per_s": rate, "cpu_per_1000": 1000 * cpu / max(samples, 1), **looks}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ladle", default="target/release/ladle")
    ap.add_argument("--dataset", help="default: a generated 500-image ImageFolder")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        dataset = args.dataset
        if dataset is None:
            dataset = os.path.join(work, "data")
            subprocess.run([args.ladle, "dataset", "generate", "--format", "imagefolder",
                            "--count", "500", "--width", "160", "--height", "120",
                            "--out", dataset], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        ratios = {"samples_per_s": [], "cpu_per_1000": []}
        for r in range(args.rounds):
            order = [False, True] if r % 2 == 0 else [True, False]
            got = {m: run_mode(args.ladle, dataset, args.seconds, m, work) for m in order}
            plain, observed = got[False], got[True]
            for k in ratios:
                ratios[k].append(observed[k] / plain[k])
            print(json.dumps({"round": r, "plain": plain, "observed": observed,
                              "ratio_samples_per_s": round(ratios["samples_per_s"][-1], 3),
                              "ratio_cpu_per_1000": round(ratios["cpu_per_1000"][-1], 3)}),
                  flush=True)
        print(json.dumps({"median_ratio_samples_per_s":
                          round(statistics.median(ratios["samples_per_s"]), 3),
                          "median_ratio_cpu_per_1000":
                          round(statistics.median(ratios["cpu_per_1000"]), 3)}))


if __name__ == "__main__":
    main()
