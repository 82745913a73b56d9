"""Prints torchvision ImageFolder's classes and samples of a root, for
`imagefolder_torchvision.rs` to compare with ladle's index.

Usage: python3 torchvision_order.py ROOT

Output, one per line: `class HEX` in label order, then `sample LABEL HEX` in index order,
HEX being the bytes of the name or path as the file system has them (`os.fsencode`).

`find_classes`, `has_file_allowed_extension`, `make_dataset` and `IMG_EXTENSIONS` below are
the lines of torchvision/datasets/folder.py (pytorch/vision, BSD-3-Clause) that decide the
order, copied with only the argument checks, the `is_valid_file` hook and the refusal of
empty classes (ladle keeps such a class, with a warning) left out. Where torchvision itself is
installed, its own functions run as well and must agree.
"""

import os
import sys

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def find_classes(directory):
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    class_to_idx = {cls_name: i for i, cls_name in enumerate(classes)}
    return classes, class_to_idx


def has_file_allowed_extension(filename, extensions):
    return filename.lower().endswith(extensions if isinstance(extensions, str) else tuple(extensions))


def make_dataset(directory, class_to_idx, extensions):
    directory = os.path.expanduser(directory)
    instances = []
    for target_class in sorted(class_to_idx.keys()):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(directory, target_class)
        if not os.path.isdir(target_dir):
            continue
        for root, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(root, fname)
                if has_file_allowed_extension(path, extensions):
                    item = path, class_index
                    instances.append(item)
    return instances


def main():
    root = sys.argv[1]
    classes, class_to_idx = find_classes(root)
    samples = make_dataset(root, class_to_idx, IMG_EXTENSIONS)
    try:
        from torchvision.datasets import folder
    except ImportError:
        folder = None
    if folder is not None:
        theirs = folder.find_classes(root)[0]
        assert theirs == classes, (theirs, classes)
        theirs = folder.make_dataset(root, class_to_idx, folder.IMG_EXTENSIONS, allow_empty=True)
        assert theirs == samples, (theirs, samples)
        print("checked against torchvision", file=sys.stderr)
    for name in classes:
        print("class", os.fsencode(name).hex())
    for path, label in samples:
        print("sample", label, os.fsencode(path).hex())


if __name__ == "__main__":
    main()
