"""Shapes no array can have are SerializationErrors in every reader (issue 14, item 7).

Crafted headers with huge dimensions in a zero-element tensor (``[0, 2**62, 2**62]``), a dimension
past 2**63, or more than 64 axes used to escape as NumPy's raw ValueError ("array is too big",
"maximum supported dimension") from safetensors, GGUF and ``.rlx`` reads, or crashed a backend's
compile. Each is now refused naming the file, the tensor and the field.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from rlx_core.dtypes import DType
from rlx_core.errors import SerializationError
from rlx_core.formats.gguf import read_gguf
from rlx_core.formats.safetensors import read_safetensors, write_safetensors
from rlx_core.formats.shapes import shape_problem
from rlx_core.ir.builder import GraphBuilder
from rlx_core.ir.serialize import load, save

BAD_SHAPES = {
    "empty but huge": [0, 2**62, 2**62],
    "empty, one dim past 2**63": [0, 2**64],
    "empty, 2**63 - 1 wide": [0, 2**63 - 1],
    "70 axes of zeros": [0] * 70,
    "65 axes": [1] * 65,
}


def test_shape_problem_follows_numpy() -> None:
    for shape, itemsize, dtype in (([0, 2**61], 4, np.float32), ([0, 2**61 - 1], 4, np.float32),
                                   ([0, 2**63 - 1], 1, np.uint8), ([2**40, 0, 2**23], 1, np.uint8),
                                   ([1] * 64, 4, np.float32), ([1] * 65, 4, np.float32)):
        try:
            np.empty(shape, dtype)
            numpy_ok = True
        except ValueError:
            numpy_ok = False
        assert (shape_problem(shape, itemsize) is None) == numpy_ok, shape


def safetensors_file(path: Path, shape: list[int]) -> Path:
    header = json.dumps({"t": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    return path


@pytest.mark.parametrize("label", BAD_SHAPES)
@pytest.mark.parametrize("mmap", [True, False])
def test_safetensors(tmp_path: Path, label: str, mmap: bool) -> None:
    path = safetensors_file(tmp_path / "t.safetensors", BAD_SHAPES[label])
    with pytest.raises(SerializationError) as ei:
        read_safetensors(path, mmap=mmap)
    assert "'t'" in ei.value.where and "shape" in ei.value.where and ei.value.fix


def gguf_file(path: Path, dims: list[int], type_id: int = 0) -> Path:
    """A GGUF v3 file with no metadata and one F32 tensor (ggml order dims) with no data."""
    name = b"t"
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 1, 0))
    out += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
    out += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", type_id, 0)
    out += b"\0" * (-len(out) % 32)
    path.write_bytes(bytes(out))
    return path


@pytest.mark.parametrize("dims", [[2**62, 2**62, 0], [2**63, 0], [0, 2**63 - 1]])
def test_gguf_zero_element_tensors_with_huge_dims(tmp_path: Path, dims: list[int]) -> None:
    path = gguf_file(tmp_path / "t.gguf", dims)
    with pytest.raises(SerializationError) as ei:
        read_gguf(path).arrays()
    assert "'t'" in str(ei.value) and "dims" in str(ei.value) and ei.value.fix


def test_gguf_small_empty_tensor_is_fine(tmp_path: Path) -> None:
    assert read_gguf(gguf_file(tmp_path / "t.gguf", [0, 3])).arrays()["t"].shape == (3, 0)


def rlx_variant(tmp_path: Path, edit) -> Path:
    g = GraphBuilder("m")
    x = g.input("x", DType.F32, (1,))
    g.output(g.op("add", x, g.param("w", np.ones(1, np.float32), DType.F32)), "y")
    save(g.build(), tmp_path / "m.rlx")
    tensors, meta = read_safetensors(tmp_path / "m.rlx", mmap=False)
    structure = json.loads(meta["graph"])
    edit(structure)
    write_safetensors(tmp_path / "bad.rlx", tensors, {**meta, "graph": json.dumps(structure)})
    return tmp_path / "bad.rlx"


@pytest.mark.parametrize("label", BAD_SHAPES)
def test_rlx_graph_input_shapes(tmp_path: Path, label: str) -> None:
    path = rlx_variant(tmp_path, lambda s: s["inputs"][0].__setitem__("shape", BAD_SHAPES[label]))
    with pytest.raises(SerializationError) as ei:
        load(path)
    assert "graph input 0 'x'" in ei.value.what and "shape" in ei.value.what


@pytest.mark.parametrize("shape", [[1] * 70, [0, 2**62, 2**62]])
def test_rlx_node_results(tmp_path: Path, shape: list[int]) -> None:
    # A reshape/expand attribute can ask for a result no array can be, from a valid input.
    def edit(s: dict) -> None:
        op = "reshape" if len(shape) > 3 else "expand"
        s["nodes"].append({"name": "big", "op": op, "inputs": ["y"], "outputs": ["big"],
                           "attrs": {"shape": shape}})
        s["outputs"] = ["big"]  # expand: the (1,) result broadcasts to 0 on the last axis

    path = rlx_variant(tmp_path, edit)
    with pytest.raises(SerializationError) as ei:
        load(path)
    assert "'big'" in ei.value.what, ei.value.what
