# `ladle bench baseline`'s measurement, run by the Python the user trains with: torchvision's
# ImageFolder with the transform ladle's feed applies by default (RandomResizedCrop + flip,
# uint8 CHW tensors), in a PyTorch DataLoader with shuffling and worker processes, as a
# training job without ladle loads its data. It prints one JSON line: the CPU seconds the
# loading took (this process and its workers, which are joined before the count is read)
# per sample delivered.
#
# argv: ROOT IMAGE_SIZE BATCH_SIZE WORKERS SECONDS
import json
import resource
import sys
import time


def cpu_seconds():
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main():
    root, image_size, batch_size, workers, seconds = sys.argv[1:6]
    image_size, batch_size, workers, seconds = (
        int(image_size),
        int(batch_size),
        int(workers),
        float(seconds),
    )
    try:
        import torch
        import torchvision
        from torchvision import datasets, transforms
    except ImportError as e:
        print(json.dumps({"error": f"cannot import torch and torchvision ({e})"}))
        return 3
    transform = transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size),
            transforms.RandomHorizontalFlip(),
            transforms.PILToTensor(),
        ]
    )
    dataset = datasets.ImageFolder(root, transform=transform)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, num_workers=workers
    )
    start_cpu, start = cpu_seconds(), time.monotonic()
    samples = epochs = 0
    while time.monotonic() - start < seconds:
        batches = iter(loader)
        for _, labels in batches:
            samples += len(labels)
            if time.monotonic() - start >= seconds:
                break
        else:
            epochs += 1
        # Shuts the workers down and joins them: their CPU time is counted from here on.
        del batches
    wall = time.monotonic() - start
    cpu = cpu_seconds() - start_cpu
    print(
        json.dumps(
            {
                "samples": samples,
                "epochs_completed": epochs,
                "seconds": wall,
                "cpu_seconds": cpu,
                "torch": torch.__version__,
                "torchvision": torchvision.__version__,
                "python": sys.executable,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
