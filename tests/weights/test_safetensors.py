"""Reading safetensors with numpy: every dtype the converter meets, and damaged files refused."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from opod.weights import WeightsError
from opod.weights.safetensors import read_safetensors


def write(path: Path, tensors: dict[str, tuple[str, list[int], bytes]], cut: int = 0) -> Path:
    header, blob, offset = {"__metadata__": {"format": "pt"}}, b"", 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blob += raw
        offset += len(raw)
    text = json.dumps(header).encode()
    data = struct.pack("<Q", len(text)) + text + blob
    path.write_bytes(data[: len(data) - cut])
    return path


def test_f32_f16_bf16_and_i64_read_back_with_their_shapes(tmp_path: Path) -> None:
    f32 = np.arange(6, dtype="<f4").reshape(2, 3)
    f16 = np.array([1.5, -2.0], dtype="<f2")
    bf16 = (np.array([3.0, -0.5], dtype="<f4").view("<u4") >> 16).astype("<u2")
    ids = np.array([[0, 1, 2]], dtype="<i8")
    path = write(
        tmp_path / "m.safetensors",
        {
            "a": ("F32", [2, 3], f32.tobytes()),
            "b": ("F16", [2], f16.tobytes()),
            "c": ("BF16", [2], bf16.tobytes()),
            "d": ("I64", [1, 3], ids.tobytes()),
        },
    )
    tensors = read_safetensors(path)
    assert set(tensors) == {"a", "b", "c", "d"}
    np.testing.assert_array_equal(tensors["a"], f32)
    np.testing.assert_array_equal(tensors["b"], f16)
    np.testing.assert_array_equal(tensors["c"], np.array([3.0, -0.5], dtype=np.float32))
    np.testing.assert_array_equal(tensors["d"], ids)


def test_a_truncated_file_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    path = write(tmp_path / "m.safetensors", {"weights": ("F32", [4], np.zeros(4, "<f4").tobytes())}, cut=3)
    with pytest.raises(WeightsError, match="tensor 'weights' lies outside the file"):
        read_safetensors(path)


def test_a_file_that_is_not_safetensors_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 32)
    with pytest.raises(WeightsError, match="not a safetensors file"):
        read_safetensors(tmp_path / "x")
