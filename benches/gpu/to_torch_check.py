#!/usr/bin/env python3
"""``Batch.to_torch(device="cuda")`` on a GPU: correct against the CPU path, its throughput,
and whether the conversion is worth the fused kernel.

Starts ``ladle serve`` on an ImageFolder (``--dataset``), connects one ``ladle.Consumer`` and:

1. **Correctness.** For several batches and every variant (``normalize`` None and ImageNet,
   ``channels_last`` off and on), converts the same batch on the CPU and on the GPU and
   compares them (max absolute difference; float32 on both sides, so the only differences
   are the order of the multiply-add: expected ≤ 1e-5). Labels must be equal. A poisoned
   (NaN-filled) comparison buffer is never used: both results are fresh tensors, and a NaN
   anywhere fails the check.
2. **Throughput.** ``to_torch("cuda", normalize=IMAGENET, channels_last=True)`` on full
   batches: GPU time of the whole call (events around it: H2D copy plus conversion), the
   host time of the call (what the training loop's thread spends), and images/s of the GPU
   part. Batches come from the producer; the wait for the next batch is not timed.
3. **Is the conversion worth a fused kernel?** On a device-resident ``[B, H, W, 3]`` uint8
   tensor: torch's conversion as ``to_torch`` does it (one ``addcmul`` of the permuted uint8
   view: 5 bytes of memory traffic per element), as it did before (``copy_``, ``mul_``,
   ``add_``: about 21 bytes per element), and the floor of a fused kernel (5 bytes per element
   at the device-to-device copy bandwidth measured in the same run), next to one ResNet-18
   training step at the same batch size (bf16 autocast, channels-last), which is what the
   conversion competes with.

Prints one JSON object (and writes it to ``--json``). Exits 1 when a correctness check fails.

Usage (repository root, a GPU machine, ``ladle`` built and the Python package installed)::

    python3 benches/gpu/to_torch_check.py --dataset /tmp/data --batch-size 256 --json t.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import ladle
from _common import serving



def median_ms(times: list[float]) -> float:
    return statistics.median(times)


def event_time(torch, stream, work, repeats: int) -> list[float]:
    """Milliseconds of ``work()`` on ``stream`` per repeat, timed with CUDA events."""
    out = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        work()
        end.record(stream)
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, help="an ImageFolder directory")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=40, help="timed batches")
    parser.add_argument("--ring-mib", type=int, default=1024)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible to torch")
    device = torch.device("cuda:0")
    torch.cuda.set_device(device)
    with serving(args.dataset, args.ring_mib) as sock:
        consumer = ladle.Consumer(sock, args.batch_size, max_batches_held=4)
        results = run(torch, device, consumer, args)
    out = json.dumps(results, indent=2)
    print(out)
    if args.json:
        Path(args.json).write_text(out + "\n")
    sys.exit(0 if results["correct"] else 1)


def batches(consumer):
    """Full batches forever, across epochs (an epoch's short last batch is skipped)."""
    while True:
        for batch in consumer:
            if len(batch) == consumer.batch_size:
                yield batch


def run(torch, device, consumer, args) -> dict:
    stream = torch.cuda.current_stream(device)
    source = batches(consumer)

    # 1. Correctness: the same batch on the CPU and on the GPU, every variant.
    variants = [(n, cl) for n in (None, ladle.IMAGENET) for cl in (False, True)]
    checks = []
    for k in range(3):
        batch = next(source)
        for normalize, channels_last in variants:
            cpu_x, cpu_y = batch.to_torch("cpu", normalize=normalize, channels_last=channels_last)
            gpu_x, gpu_y = batch.to_torch(device, normalize=normalize, channels_last=channels_last)
            torch.cuda.synchronize()
            got = gpu_x.cpu()
            finite = bool(torch.isfinite(got).all()) and bool(torch.isfinite(cpu_x).all())
            diff = float((got - cpu_x).abs().max())
            checks.append({
                "batch": k,
                "normalize": "imagenet" if normalize else None,
                "channels_last": channels_last,
                "shape": list(got.shape),
                "gpu_is_channels_last": bool(
                    gpu_x.is_contiguous(memory_format=torch.channels_last)) if channels_last
                else bool(gpu_x.is_contiguous()),
                "max_abs_diff": diff,
                "labels_equal": bool(torch.equal(gpu_y.cpu(), cpu_y)),
                "finite": finite,
                "ok": finite and diff <= 1e-5 and bool(torch.equal(gpu_y.cpu(), cpu_y)),
            })
        del batch
    correct = all(c["ok"] for c in checks)

    # 2. Throughput of to_torch("cuda"): GPU time (events) and host time of the call.
    gpu_ms, host_ms = [], []
    for r in range(args.rounds + 3):
        batch = next(source)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        t0 = time.perf_counter()
        x, y = batch.to_torch(device, normalize=ladle.IMAGENET, channels_last=True)
        t1 = time.perf_counter()
        end.record(stream)
        del batch
        end.synchronize()
        if r >= 3:  # warm-up rounds
            gpu_ms.append(start.elapsed_time(end))
            host_ms.append((t1 - t0) * 1000)
    b = args.batch_size
    h, w = x.shape[2], x.shape[3]
    elements = b * h * w * 3

    # 3. Conversion alone, on device-resident uint8, against a fused kernel's floor and a step.
    u8 = torch.randint(0, 256, (b, h, w, 3), dtype=torch.uint8, device=device)
    out = torch.empty((b, 3, h, w), dtype=torch.float32, device=device,
                      memory_format=torch.channels_last)
    scale = torch.rand(1, 3, 1, 1, device=device) + 0.5
    shift = torch.rand(1, 3, 1, 1, device=device)

    def three_passes():  # what to_torch did before it was measured here
        out.copy_(u8.permute(0, 3, 1, 2))
        out.mul_(scale).add_(shift)

    def one_pass():  # what to_torch does: shift + u8 * scale in one kernel, 5 bytes/element
        torch.addcmul(shift, u8.permute(0, 3, 1, 2), scale, out=out)

    src = torch.empty(64 << 20, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    copy_ms = median_ms(event_time(torch, stream, lambda: dst.copy_(src), 20))
    d2d_gbps = 2 * src.numel() * 4 / (copy_ms / 1000) / 1e9  # read + write
    three_ms = median_ms(event_time(torch, stream, three_passes, 30))
    convert_ms = median_ms(event_time(torch, stream, one_pass, 30))
    fused_floor_ms = 5 * elements / (d2d_gbps * 1e9) * 1000

    step_ms = None
    try:
        import torchvision

        model = torchvision.models.resnet18(num_classes=1000).to(
            device, memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        labels = torch.randint(0, 1000, (b,), device=device)

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(out), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        event_time(torch, stream, step, 5)  # warm-up (cuDNN autotuning)
        step_ms = median_ms(event_time(torch, stream, step, 10))
    except Exception as e:  # noqa: BLE001 — recorded, not fatal
        step_ms = f"error: {e!r}"

    gpu_med = median_ms(gpu_ms)
    return {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "batch_shape": [b, h, w, 3],
        "correct": correct,
        "checks": checks,
        "to_torch_cuda": {
            "gpu_ms_median": gpu_med,
            "gpu_ms_best": min(gpu_ms),
            "host_ms_median": median_ms(host_ms),
            "images_per_s_gpu": b / (gpu_med / 1000),
            "rounds": len(gpu_ms),
        },
        "conversion": {
            "torch_copy_mul_add_ms": three_ms,
            "torch_addcmul_ms": convert_ms,
            "fused_kernel_floor_ms": fused_floor_ms,
            "d2d_copy_gbps": d2d_gbps,
            "resnet18_step_ms": step_ms,
            "conversion_share_of_step": (convert_ms / step_ms
                                         if isinstance(step_ms, float) else None),
            "fused_saving_share_of_step": ((convert_ms - fused_floor_ms) / step_ms
                                           if isinstance(step_ms, float) else None),
        },
        "python": sys.version.split()[0],
    }


if __name__ == "__main__":
    main()
