"""Sample schemas on the Python side: inferring one from a sample, and turning a sample's
values into arrays that fit it.

A schema is a list of ``(name, dtype, shape)``: ``dtype`` a NumPy dtype name (``"uint8"``,
``"float32"``, ``"bfloat16"``, ``"bool"``, ...), ``shape`` a tuple per sample. Its text form,
the one ladle uses everywhere, is ``"wave: f32[16000], label: i64"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# ladle's dtype names by NumPy's.
_LADLE = {
    "uint8": "u8",
    "int8": "i8",
    "uint16": "u16",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float64": "f64",
    "bool": "bool",
}

Field = tuple[str, str, tuple[int, ...]]


def sample_items(sample: Any) -> list[tuple[str, Any]]:
    """``(name, value)`` pairs of a sample: a mapping's items, or a tuple's elements named
    ``image`` and ``label`` for a pair (torchvision's ``(image, label)``) and ``"0"``,
    ``"1"``, ... otherwise."""
    if isinstance(sample, Mapping):
        return [(str(k), v) for k, v in sample.items()]
    if isinstance(sample, Sequence) and not isinstance(sample, (str, bytes)):
        names = ["image", "label"] if len(sample) == 2 else [str(k) for k in range(len(sample))]
        return list(zip(names, sample))
    raise TypeError(
        f"a sample must be a dict of field name -> array-like (or a tuple), not {type(sample).__name__}"
    )


def as_array(value: Any) -> tuple[np.ndarray, str]:
    """A NumPy view or copy of ``value`` and its dtype name (``"bfloat16"`` for a torch
    bfloat16 tensor, whose bits are returned as uint16)."""
    if hasattr(value, "detach") and hasattr(value, "dtype"):  # a torch tensor
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            import torch

            return value.view(torch.int16).numpy().view(np.uint16), "bfloat16"
        return np.asarray(value.numpy()), str(value.numpy().dtype)
    array = np.asarray(value)
    return array, array.dtype.name


def infer(sample: Any) -> list[Field]:
    """The schema of one sample: each field's dtype and shape as NumPy sees its value."""
    fields = []
    for name, value in sample_items(sample):
        array, dtype = as_array(value)
        if dtype not in _LADLE:
            raise TypeError(
                f"field {name!r}: dtype {dtype} is not one ladle serves "
                f"({', '.join(_LADLE)}); convert it in __getitem__ or pass schema="
            )
        fields.append((name, dtype, tuple(int(d) for d in array.shape)))
    return fields


def to_text(fields: Sequence[Field]) -> str:
    """The text form: ``"wave: f32[16000], label: i64"``."""
    parts = []
    for name, dtype, shape in fields:
        ladle = _LADLE.get(np.dtype(dtype).name if dtype != "bfloat16" else dtype)
        if ladle is None:
            raise TypeError(f"field {name!r}: dtype {dtype} is not one ladle serves")
        dims = f"[{', '.join(str(int(d)) for d in shape)}]" if len(shape) else ""
        parts.append(f"{name}: {ladle}{dims}")
    return ", ".join(parts)


def normalize(schema: Any) -> list[Field]:
    """A schema given by the user: a list of ``(name, dtype, shape)``, or a dict
    ``{name: (dtype, shape)}``."""
    if isinstance(schema, Mapping):
        schema = [(name, dtype, shape) for name, (dtype, shape) in schema.items()]
    out = []
    for name, dtype, shape in schema:
        dtype = "bfloat16" if str(dtype) in ("bfloat16", "torch.bfloat16") else np.dtype(dtype).name
        out.append((str(name), dtype, tuple(int(d) for d in shape)))
    return out
