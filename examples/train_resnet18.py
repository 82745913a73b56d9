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

One DDP job over the feed (its ranks split each epoch: every rank the same number of
samples, together the whole epoch), checkpointed every 50 steps and resumable where it
stopped, mid-epoch included::

    torchrun --nproc_per_node 2 examples/train_resnet18.py --ddp --socket /tmp/ladle.sock \
        --checkpoint /tmp/resnet18.pt --checkpoint-every 50
    # killed? the same command continues from /tmp/resnet18.pt: model, optimizer, step and
    # each rank's place in the epoch (the samples it had trained on are not repeated)

The same job over several nodes (``examples/ddp_multinode.sbatch``): every rank names the
data with ``--feed DIR`` and joins its node's feed of it (the first rank of a node starts it);
each node's feed waits for that node's ranks (torchrun's ``$LOCAL_WORLD_SIZE``) and decodes
only their shares::

    srun torchrun --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d \
        --rdzv_endpoint "$HEAD:29500" --rdzv_id "$SLURM_JOB_ID" \
        examples/train_resnet18.py --ddp --feed /data/imagenet/train --group-timeout 900
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
    group = {}
    if args.ddp:
        # Every rank of this job is one member of the group; rank and world size come from
        # torchrun's RANK and WORLD_SIZE. The name must stay the same when the job restarts
        # from its checkpoint: each rank's share of an epoch is dealt from it.
        group = {"group": args.group or f"resnet18-lr{args.lr}-b{args.batch_size}"}
    # Named after its sweep run when a sweep runs it (`ladle cost` matches runs by name).
    name = os.environ.get("LADLE_RUN") or f"resnet18-lr{args.lr}"
    if args.ddp:
        group["group_timeout"] = args.group_timeout
    feed = {"dataset": args.feed, "image_size": args.image_size} if args.feed else {}
    consumer = ladle.Consumer(args.socket, args.batch_size, drop_last=True, name=name, **group,
                              **feed)
    num_classes = max(len(consumer.class_names), 1)
    args.consumer = consumer
    def batches():
        while True:
            for batch in consumer:  # one epoch
                # u8 HWC ring memory -> normalised f32 NCHW on the device; the batch is
                # released once the copy has completed.
                if args.record_indices:
                    with memoryview(batch.indices) as indices:
                        args.last_indices = indices.tolist()
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
    source.add_argument("--feed", metavar="DIR",
                        help="join this node's ladle feed of the dataset DIR, starting it if "
                             "none runs (it stops by itself after the last rank left)")
    source.add_argument("--dataloader", metavar="DIR",
                        help="an ImageFolder directory read with torch's DataLoader instead")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--ddp", action="store_true",
                        help="one rank of a DDP job started by torchrun (gloo on CPU, NCCL on "
                             "GPU); the ranks split each epoch of the feed")
    parser.add_argument("--group", metavar="NAME",
                        help="the feed's name for this DDP job (default resnet18-lr<LR>-b<B>); "
                             "keep it when the job restarts from its checkpoint")
    parser.add_argument("--group-timeout", type=float, default=600.0, metavar="S",
                        help="seconds a rank waits at the start for the other ranks of its "
                             "node (a multi-node job whose nodes start far apart needs more)")
    parser.add_argument("--image-size", type=int, default=224,
                        help="the feed's image size, with --feed")
    parser.add_argument("--checkpoint", metavar="PATH",
                        help="save model, optimizer, step and every rank's place in the feed "
                             "here, and continue from it when it exists")
    parser.add_argument("--checkpoint-every", type=int, default=50, metavar="STEPS")
    parser.add_argument("--record-indices", metavar="PATH",
                        help="append each step's sample indices to PATH.rank<R> (for checks)")
    args = parser.parse_args()
    if not (args.socket or args.feed or args.dataloader):
        parser.error("give --socket, --feed, --dataloader, or run under `ladle sweep` "
                     "($LADLE_SOCKET)")
    if (args.ddp or args.checkpoint or args.record_indices) and args.dataloader:
        parser.error("--ddp, --checkpoint and --record-indices need a ladle feed (--socket or "
                     "--feed)")
    rank, world = 0, 1
    if args.ddp:
        import torch.distributed as dist
        dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        if args.device.startswith("cuda"):
            args.device = f"cuda:{os.environ.get('LOCAL_RANK', 0)}"
    device = torch.device(args.device)

    batches, num_classes = (ladle_batches if args.socket or args.feed else dataloader_batches)(
        args, device)
    model = torchvision.models.resnet18(num_classes=num_classes).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    if args.ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    loss_fn = torch.nn.CrossEntropyLoss()

    first_step = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint, map_location=device, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        first_step = saved["step"]
        # Each rank continues its own place in the epoch; a DDP job given every rank's state
        # may restart on another number of ranks (requeued on fewer nodes, torchrun elastic):
        # the rest of the saved epoch is then dealt over the new ranks, each sample once.
        args.consumer.load_state_dict(saved["feed"] if args.ddp else saved["feed"][rank])
    record = open(f"{args.record_indices}.rank{rank}", "a") if args.record_indices else None

    losses = []
    start = None
    for step, (images, labels) in zip(range(first_step, args.steps), batches):
        if step == first_step + 1:
            start = time.monotonic()  # the first step includes start-up and warm-up
        loss = loss_fn(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if record:
            indices = " ".join(map(str, args.last_indices))
            record.write(f"{step} {indices}\n")
            record.flush()
        if (step - first_step) % 20 == 0 or step == args.steps - 1:
            losses.append(round(loss.item(), 4))
        if args.checkpoint and (step + 1) % args.checkpoint_every == 0:
            save_checkpoint(args, model, optimizer, step + 1, world)
    elapsed = time.monotonic() - start if start else float("nan")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({
        "source": "ladle" if args.socket or args.feed else "dataloader",
        "lr": args.lr,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "samples_per_s": (args.steps - 1) * args.batch_size / elapsed,
        "loss_first_last": [losses[0], losses[-1]] if losses else None,
        "rank": rank,
        "cpu_seconds": usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime,
    }), flush=True)


def save_checkpoint(args, model, optimizer, step, world):
    """Rank 0 writes model, optimizer, step and every rank's feed position (gathered), to a
    temporary file renamed over the checkpoint: a kill never leaves half a checkpoint."""
    feed = [args.consumer.state_dict()]
    if world > 1:
        import torch.distributed as dist
        feed = [None] * world
        dist.all_gather_object(feed, args.consumer.state_dict())
    if feed is not None and (world == 1 or torch.distributed.get_rank() == 0):
        tmp = args.checkpoint + ".tmp"
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "step": step, "feed": feed}, tmp)
        os.replace(tmp, args.checkpoint)
    if world > 1:
        torch.distributed.barrier()


if __name__ == "__main__":
    main()
