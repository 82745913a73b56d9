"""``Batch.to_torch``: uint8 HWC ring memory to normalised float NCHW tensors.

torch is imported only when this is called: the package needs numpy alone.

On CPU the conversion reads the ring in place (DLPack, no copy) and writes one float tensor.
On CUDA the consumer's image mapping is registered once per process as pinned, read-only
host memory (``cudaHostRegister``), the uint8 batch is copied to the device asynchronously
on the current stream (a quarter of the bytes of a float copy), and conversion and
normalisation run on the device. The batch stays held until the copy has completed: an event
recorded after the copy is polled before the batch is let go.

This is the same GPU path as the Rust SDK's ``cuda`` feature (``ladle_consumer::cuda``), done
with torch's own calls: ``cudaHostRegister`` with these flags is ``cuMemHostRegister``
(read-only, portable), the copy is ``cudaMemcpyAsync`` from the registered ring, and the
release rule is the same event. The Rust path is not wired in here on purpose: the default
``pip install`` stays free of CUDA at build time, and in a PyTorch process the output must be
torch memory on torch's current stream anyway. The conversion is one ``torch.addcmul`` over
the permuted uint8 view: one kernel reading 1 byte and writing 4 per element, the same
traffic as the Rust SDK's fused kernel. Measured on an H100 (``benches/gpu/to_torch_check.py``,
figures in ``benches/README.md``): the whole call is about 1.0 ms of GPU time for a
256×224×224 batch, the conversion alone 0.19 ms, under 1% of one ResNet-18 training step at
that batch size, so the Rust kernel would buy nothing here.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ._native import Batch

#: ImageNet's per-channel mean and standard deviation, on the 0–1 scale.
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

# cudaHostRegister flags: portable (all contexts) | read-only (the ring is mapped read-only).
_CUDA_HOST_REGISTER_PORTABLE = 0x01
_CUDA_HOST_REGISTER_READ_ONLY = 0x08

#: Image mappings registered with CUDA in this process, by address.
_registered: dict[int, int] = {}
#: (event, host tensor) pairs whose copies may still be running; the host tensor keeps its
#: batch held until the event completes.
_in_flight: deque[tuple[Any, Any]] = deque()
#: (device, dtype, mean, std) -> (scale, shift) tensors, so each call allocates only its result.
_constants: dict[tuple[Any, ...], tuple[Any, Any]] = {}


def _normalisation(torch_mod, device, normalize) -> tuple[Any, Any]:
    """Per-channel ``scale`` and ``shift`` with ``x / 255 normalised = x * scale + shift``."""
    if normalize is None:
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    else:
        try:
            mean, std = normalize
            mean = tuple(float(m) for m in mean)
            std = tuple(float(s) for s in std)
        except (TypeError, ValueError):
            raise ValueError(
                f"normalize must be (mean, std), each three numbers, got {normalize!r}"
            ) from None
        if len(mean) != 3 or len(std) != 3 or any(s == 0.0 for s in std):
            raise ValueError(
                f"normalize must be (mean, std) with three values each and no zero std, "
                f"got {normalize!r}"
            )
    key = (str(device), mean, std)
    cached = _constants.get(key)
    if cached is None:
        scale = torch_mod.tensor([1.0 / (255.0 * s) for s in std], device=device)
        shift = torch_mod.tensor([-m / s for m, s in zip(mean, std)], device=device)
        cached = (scale.view(1, 3, 1, 1), shift.view(1, 3, 1, 1))
        _constants[key] = cached
    return cached


def _register(torch_mod, batch: Batch) -> None:
    """Pins the consumer's image mapping for CUDA copies, once per mapping."""
    address, length = batch._images_region()
    if address in _registered:
        return
    flags = _CUDA_HOST_REGISTER_PORTABLE | _CUDA_HOST_REGISTER_READ_ONLY
    status = torch_mod.cuda.cudart().cudaHostRegister(address, length, flags)
    code = int(getattr(status, "value", status))
    if code != 0:
        raise RuntimeError(
            f"cudaHostRegister of the ladle ring ({length} bytes at {address:#x}) failed "
            f"with CUDA error {code}; copies would not be asynchronous"
        )
    _registered[address] = length


def _retire_finished() -> None:
    """Lets go of batches whose copies to the device have completed."""
    while _in_flight and _in_flight[0][0].query():
        _in_flight.popleft()


def to_torch(
    batch: Batch,
    device: str | torch.device | None = None,
    normalize: tuple[Sequence[float], Sequence[float]] | None = None,
    channels_last: bool = False,
    non_blocking: bool = True,
) -> tuple[torch.Tensor, torch.Tensor] | dict[str, torch.Tensor]:
    """An image feed's batch (fields ``image: u8[H, W, 3]`` and ``label: i64``) becomes
    ``(images, labels)``: float32 ``[B, 3, H, W]`` images scaled to 0–1 and normalised with
    ``normalize=(mean, std)`` (per channel, on the 0–1 scale; e.g. ``ladle.IMAGENET``), and
    int64 ``[B]`` labels, both on ``device`` (default ``"cpu"``).

    Any other feed's batch becomes a dict of every field, ``{name: [B, ...] tensor}`` on
    ``device`` in the field's own dtype, except an ``image: u8[H, W, 3]`` field, which is
    converted as above.

    ``channels_last=True`` gives the same shape in channels-last memory order (faster for
    convolutions on recent GPUs). On CUDA the image copy is asynchronous from pinned memory
    when ``non_blocking`` (the default); the results are ordered on the current stream. The
    returned tensors are new memory: they do not hold the batch.
    """
    import torch

    device = torch.device("cpu" if device is None else device)
    keys = batch.keys()
    has_images = "image" in keys and _is_image(batch)
    if has_images and keys == ["image", "label"]:
        return (
            _images(torch, batch, device, normalize, channels_last, non_blocking),
            _field(torch, batch["label"], device),
        )
    out = {}
    for name in keys:
        if name == "image" and has_images:
            out[name] = _images(torch, batch, device, normalize, channels_last, non_blocking)
        else:
            out[name] = _field(torch, batch[name], device)
    return out


def _is_image(batch: Batch) -> bool:
    try:
        batch.images
    except AttributeError:
        return False
    return True


def _field(torch_mod, view, device) -> torch.Tensor:
    """A copy of one field on ``device`` (never a view of the ring: it must not hold it)."""
    tensor = torch_mod.from_dlpack(view)
    return tensor.clone() if device.type == "cpu" else tensor.to(device)


def _images(torch, batch, device, normalize, channels_last, non_blocking) -> torch.Tensor:
    """The image field as normalised float NCHW on ``device``."""
    images = torch.from_dlpack(batch.images)  # [B, H, W, 3] uint8, the ring itself
    if device.type == "cuda":
        _retire_finished()
        if non_blocking:
            _register(torch, batch)
        images = images.to(device, non_blocking=non_blocking)
        if non_blocking:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            # The copy reads the ring after this call returns: keep the batch until it is done.
            _in_flight.append((event, batch))
    elif device.type != "cpu":
        images = images.to(device)
    b, h, w, _ = images.shape
    out = torch.empty(
        (b, 3, h, w),
        dtype=torch.float32,
        device=device,
        memory_format=torch.channels_last if channels_last else torch.contiguous_format,
    )
    scale, shift = _normalisation(torch, device, normalize)
    # shift + u8 * scale, HWC -> CHW, in one pass: read 1 byte, write 4 per element (the three
    # passes copy_/mul_/add_ moved 21; measured on an H100 by benches/gpu/to_torch_check.py).
    torch.addcmul(shift, images.permute(0, 3, 1, 2), scale, out=out)
    return out
