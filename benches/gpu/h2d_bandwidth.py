#!/usr/bin/env python3
"""Host-to-device bandwidth from the registered ladle ring, against ``cudaMallocHost`` memory
and pageable memory, in one run (issue 7's target: ring ≥ 0.90 × cudaMallocHost).

Starts ``ladle serve`` on an ImageFolder dataset (generated if ``--dataset`` is not given),
connects one ``ladle.Consumer`` and registers its image mapping with ``cudaHostRegister``
(``PORTABLE | READ_ONLY``, as ``Batch.to_torch`` does). Then, round after round, the same
number of bytes (one batch of ``[B, 224, 224, 3]`` uint8) is copied to a preallocated device
tensor from each source, interleaved so that drift hits all three alike:

  ring        the batch itself, in place in the shared ring (``torch.from_dlpack``)
  pinned      ``torch.empty(..., pin_memory=True)`` (PyTorch's cudaMallocHost-backed allocator)
  pageable    ``torch.empty(...)``

Each copy is ``dst.copy_(src, non_blocking=True)`` on the current stream, timed with CUDA
events (GPU time of the copy alone, not the wait for the producer); the batch is released
only after its copy's end event completed. Reports the median and best GB/s per source, the
ratios to ``pinned``, and whether torch saw the ring as pinned memory. JSON on stdout (and
in ``--json``).

Usage (repository root, a GPU machine)::

    cargo build --release -p ladle
    pip install ./python torch
    python benches/gpu/h2d_bandwidth.py --batch-size 256 --rounds 30 --json h2d.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import ladle
from _common import serving

# cudaHostRegister flags: portable (all contexts) | read-only (the ring is mapped read-only).
PORTABLE, READ_ONLY = 0x01, 0x08


def register(torch, batch) -> dict:
    address, length = batch._images_region()
    status = torch.cuda.cudart().cudaHostRegister(address, length, PORTABLE | READ_ONLY)
    code = int(getattr(status, "value", status))
    if code != 0:
        raise SystemExit(f"cudaHostRegister of the ring ({length} bytes) failed: CUDA error {code}")
    return {"address": address, "bytes": length}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--ring-mib", type=int, default=1024)
    parser.add_argument("--dataset", help="an ImageFolder; generated (1000 images) if omitted")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible to torch")
    device = torch.device(args.device)
    torch.cuda.set_device(device)
    with serving(args.dataset, args.ring_mib) as sock:
        consumer = ladle.Consumer(sock, args.batch_size, max_batches_held=2)
        results = run(torch, device, consumer, args)
    out = json.dumps(results, indent=2)
    print(out)
    if args.json:
        Path(args.json).write_text(out + "\n")


def run(torch, device, consumer, args) -> dict:
    stream = torch.cuda.current_stream(device)
    epoch = iter(consumer)

    def next_batch():
        nonlocal epoch
        try:
            return next(epoch)
        except StopIteration:
            epoch = iter(consumer)
            return next(epoch)

    first = next_batch()
    registration = register(torch, first)
    shape = tuple(torch.from_dlpack(first.images).shape)
    nbytes = 1
    for d in shape:
        nbytes *= d
    del first
    dst = torch.empty(shape, dtype=torch.uint8, device=device)
    pinned = torch.empty(shape, dtype=torch.uint8, pin_memory=True).fill_(1)
    pageable = torch.empty(shape, dtype=torch.uint8).fill_(1)

    def timed_copy(src) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        dst.copy_(src, non_blocking=True)
        end.record(stream)
        end.synchronize()  # the source (a ring batch) may be released only now
        return start.elapsed_time(end) / 1000.0  # seconds

    times: dict[str, list[float]] = {"ring": [], "pinned": [], "pageable": []}
    ring_seen_pinned = None
    correct = True
    for r in range(args.rounds + 1):  # round 0 warms up
        batch = next_batch()
        ring = torch.from_dlpack(batch.images)
        if tuple(ring.shape) != shape:  # an epoch's partial last batch: skip it
            del ring, batch
            batch = next_batch()
            ring = torch.from_dlpack(batch.images)
        ring_seen_pinned = bool(ring.is_pinned())
        t = {"ring": timed_copy(ring)}
        if r == 1:
            correct = bool(torch.equal(dst.cpu(), ring))
        del ring, batch
        t["pinned"] = timed_copy(pinned)
        t["pageable"] = timed_copy(pageable)
        if r > 0:
            for k, v in t.items():
                times[k].append(v)

    def summary(ts: list[float]) -> dict:
        return {
            "median_gbps": nbytes / statistics.median(ts) / 1e9,
            "best_gbps": nbytes / min(ts) / 1e9,
            "n": len(ts),
        }

    sources = {k: summary(v) for k, v in times.items()}
    base = sources["pinned"]["median_gbps"]
    return {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "batch_shape": list(shape),
        "batch_bytes": nbytes,
        "ring_registration_bytes": registration["bytes"],
        "torch_sees_ring_as_pinned": ring_seen_pinned,
        "ring_copy_matches_ring": correct,
        "sources": sources,
        "ring_over_pinned": sources["ring"]["median_gbps"] / base,
        "pageable_over_pinned": sources["pageable"]["median_gbps"] / base,
        "target_ring_over_pinned": 0.90,
        "python": sys.version.split()[0],
    }


if __name__ == "__main__":
    main()
