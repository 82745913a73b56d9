#!/usr/bin/env python3
"""Train torchvision's ResNet-18 for a few hundred steps from a ladle producer, or (with
``--dataloader``) from a plain ``torch.utils.data.DataLoader`` over the same files.

One feed, several collocated training runs admitted by the scheduler (a hyper-parameter
sweep; each run finds the feed in ``$LADLE_SOCKET``)::

    ladle sweep --dataset ~/.cache/ladle/demo-imagefolder-v2-1000 -- \
        python examples/train_resnet18.py --lr '{0.1,0.05,0.02,0.01}' --batch-size 64

The same runs, each decoding the images itself::

    for lr in 0.1 0.05 0.02 0.01; do
        python examples/train_resnet18.py --dataloader ~/.cache/ladle/demo-imagefolder-v2-1000 \\
            --lr $lr --batch-size 64 --workers 1 &
    done; wait

``examples/sweep.sh`` runs the first. Each run prints one JSON line at the
end: steps, samples/s, its loss curve's ends, and the process's CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import torch
import torchvision

import ladle


def ladle_batches(args, device):
    consumer = ladle.Consumer(args.socket, args.batch_size, drop_last=True,
                              name=f"resnet18-lr{args.lr}")
    num_classes = max(len(consumer.class_names), 1)
    def batches():
        while True:
            for batch in consumer:  # one epoch
                # u8 HWC ring memory -> normalised f32 NCHW on the device; the batch is
                # released once the copy has completed.
                yield batch.to_torch(device, normalize=ladle.IMAGENET,
                                     channels_last=device.type == "cuda")
    return batches(), num_classes


def dataloader_batches(args, device):
    from torchvision import datasets, transforms

    transform = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(*ladle.IMAGENET),
    ])
    data = datasets.ImageFolder(args.dataloader, transform=transform)
    loader = torch.utils.data.DataLoader(
        data, batch_size=args.batch_size, shuffle=True, drop_last=True,
        num_workers=args.workers, pin_memory=device.type == "cuda",
        persistent_workers=args.workers > 0,
    )
    def batches():
        while True:
            for images, labels in loader:
                yield (images.to(device, non_blocking=True),
                       labels.to(device, non_blocking=True))
    return batches(), len(data.classes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--socket", default=os.environ.get("LADLE_SOCKET"),
                        help="a `ladle serve` control socket (default: $LADLE_SOCKET, which "
                             "`ladle sweep` sets)")
    source.add_argument("--dataloader", metavar="DIR",
                        help="an ImageFolder directory read with torch's DataLoader instead")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if not (args.socket or args.dataloader):
        parser.error("give --socket, --dataloader, or run under `ladle sweep` ($LADLE_SOCKET)")
    device = torch.device(args.device)

    batches, num_classes = (ladle_batches if args.socket else dataloader_batches)(args, device)
    model = torchvision.models.resnet18(num_classes=num_classes).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    loss_fn = torch.nn.CrossEntropyLoss()

    losses = []
    start = None
    for step, (images, labels) in zip(range(args.steps), batches):
        if step == 1:
            start = time.monotonic()  # step 0 includes start-up and warm-up
        loss = loss_fn(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            losses.append(round(loss.item(), 4))
    elapsed = time.monotonic() - start if start else float("nan")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({
        "source": "ladle" if args.socket else "dataloader",
        "lr": args.lr,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "samples_per_s": (args.steps - 1) * args.batch_size / elapsed,
        "loss_first_last": [losses[0], losses[-1]],
        "cpu_seconds": usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime,
    }), flush=True)


if __name__ == "__main__":
    main()
