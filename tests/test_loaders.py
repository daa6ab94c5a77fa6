"""load_weights: one entry for safetensors (.rlx included) and GGUF, by content then suffix."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from rlx_core.errors import SerializationError
from rlx_core.formats.loaders import detect_format, load_weights
from rlx_core.formats.safetensors import write_safetensors


def _gguf(path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal((3, 4)).astype(np.float32)
    f16 = rng.standard_normal(8).astype(np.float16)
    bf16 = rng.standard_normal((2, 2)).astype(ml_dtypes.bfloat16)
    i32 = np.arange(6, dtype=np.int32).reshape(2, 3)
    q8 = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), Q.Q8_0)
    q4k = rng.integers(0, 256, (2, 144), dtype=np.uint8)
    q4k[:, :4] = np.full(2, 0.01, np.float16).view(np.uint8)  # finite d and dmin
    w = gguf.GGUFWriter(path, "llama")
    for name, arr, qtype in [("f32", f32, None), ("f16", f16, None), ("bf16", bf16.view(np.uint16), Q.BF16),
                             ("i32", i32, None), ("q8", q8, Q.Q8_0), ("q4k", q4k, Q.Q4_K)]:
        w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    expect = {"f32": f32, "f16": f16, "bf16": bf16, "i32": i32,
              "q8": gguf.quants.dequantize(q8, Q.Q8_0), "q4k": gguf.quants.dequantize(q4k, Q.Q4_K)}
    return path, expect


def test_safetensors_loads_zero_copy_with_dtypes_kept(tmp_path: Path) -> None:
    tensors = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "h": np.ones(5, np.float16),
               "b": np.ones(3, ml_dtypes.bfloat16), "i": np.arange(4, dtype=np.int64)}
    for name in ("m.safetensors", "m.rlx", "no_suffix"):
        path = tmp_path / name
        write_safetensors(path, tensors, {"k": "v"})
        assert detect_format(path) == "safetensors"
        got = load_weights(path)
        assert sorted(got) == sorted(tensors)
        for k, v in tensors.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape and got[k].tobytes() == v.tobytes()
            assert not got[k].flags.writeable  # a view of the memory map


def test_gguf_loads_floats_zero_copy_and_dequantizes_quantized(tmp_path: Path) -> None:
    path, expect = _gguf(tmp_path / "m.gguf")
    misnamed = tmp_path / "weights.bin"
    misnamed.write_bytes(path.read_bytes())
    for p in (path, misnamed):  # content wins over the suffix
        assert detect_format(p) == "gguf"
        got = load_weights(p)
        assert list(got) == list(expect)
        for k, v in expect.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            assert got[k].tobytes() == v.tobytes(), k
        for k in ("f32", "f16", "bf16", "i32"):
            assert not got[k].flags.writeable, k  # zero-copy views
        assert got["q8"].dtype == np.float32 and got["q8"].flags.writeable


def test_forced_format(tmp_path: Path) -> None:
    path, _ = _gguf(tmp_path / "m.gguf")
    assert sorted(load_weights(path, format="gguf")) == ["bf16", "f16", "f32", "i32", "q4k", "q8"]
    with pytest.raises(SerializationError, match="not a safetensors file"):
        load_weights(path, format="safetensors")  # the safetensors reader refuses it, clearly
    with pytest.raises(SerializationError, match="format 'onnx' is not one RLX reads"):
        load_weights(path, format="onnx")


@pytest.mark.parametrize(("content", "fragment"), [
    (b"PK\x03\x04" + bytes(40), "zip archive"),
    (b"\x93NUMPY\x01\x00" + bytes(40), "NumPy .npy"),
    (b"\x80\x04\x95" + bytes(40), "pickle"),
    (b"\x89HDF\r\n\x1a\n" + bytes(40), "HDF5"),
    (b"tjgg" + bytes(40), "legacy GGJT"),
    (b"hello, world, this is text", "not recognised"),
    (b"", "empty"),
    (struct.pack("<Q", 10**9) + b"{}", "not recognised"),  # a length prefix that overshoots the file
])
def test_unknown_formats_are_refused_clearly(tmp_path: Path, content: bytes, fragment: str) -> None:
    path = tmp_path / "weights.dat"
    path.write_bytes(content)
    with pytest.raises(SerializationError, match=fragment) as ei:
        load_weights(path)
    assert str(path) in str(ei.value) and "fix:" in str(ei.value)


def test_damaged_files_with_a_known_suffix_get_their_readers_error(tmp_path: Path) -> None:
    bad = tmp_path / "m.gguf"
    bad.write_bytes(b"GGUX" + bytes(40))
    with pytest.raises(SerializationError, match="not the GGUF magic"):
        load_weights(bad)
    bad = tmp_path / "m.safetensors"
    bad.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(SerializationError, match="header length prefix"):
        load_weights(bad)
    with pytest.raises(SerializationError, match="cannot open the file"):
        load_weights(tmp_path / "missing.safetensors")
