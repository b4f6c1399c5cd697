"""Reading a ``.safetensors`` file with numpy alone.

The format: an 8-byte little-endian header length, a JSON header mapping each
tensor name to its dtype, shape and byte range (relative to the end of the
header), then the raw little-endian tensor bytes. Arrays are memory-mapped
views, so reading a large file costs no copy until a tensor is used.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from opod.weights.errors import WeightsError

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_MAX_HEADER = 100 * 1024 * 1024


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header and the offset where tensor data starts."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise WeightsError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (length,) = struct.unpack("<Q", raw)
        if length > _MAX_HEADER:
            raise WeightsError(f"{path}: not a safetensors file (header length {length} is implausible)")
        try:
            header = json.loads(f.read(length))
        except ValueError as err:
            raise WeightsError(f"{path}: not a safetensors file (header is not JSON: {err})") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: not a safetensors file (header is not a JSON object)")
    return header, 8 + length


def read_safetensors(path: Path | str) -> dict[str, np.ndarray]:
    """Every tensor of the file by name, as read-only numpy arrays (BF16 widened to F32)."""
    path = Path(path)
    header, base = read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    tensors: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            kind, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise WeightsError(f"{path}: tensor {name!r} has a malformed header entry {info!r}") from None
        if not 0 <= start <= end or base + end > data.size:
            raise WeightsError(f"{path}: tensor {name!r} lies outside the file (truncated download?)")
        raw = data[base + start : base + end]
        if kind == "BF16":
            # bfloat16 is the top half of a float32: shift it back into place.
            array = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        elif kind in _DTYPES:
            array = raw.view(_DTYPES[kind])
        else:
            raise WeightsError(f"{path}: tensor {name!r} has dtype {kind}, which opod cannot read")
        count = int(np.prod(shape)) if shape else 1
        if array.size != count:
            raise WeightsError(f"{path}: tensor {name!r} holds {array.size} values, its shape {shape} needs {count}")
        tensors[name] = array.reshape(shape)
    return tensors
