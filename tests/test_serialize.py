"""The .rlx model file and the safetensors container under it: exact round trips and strict validation."""

from __future__ import annotations

import copy
import json
import mmap
import os
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import rlx_core
from rlx_core.dtypes import DType
from rlx_core.errors import SerializationError
from rlx_core.formats.safetensors import read_safetensors, read_safetensors_header, write_safetensors
from rlx_core.ir import Graph, GraphBuilder
from rlx_core.ir.serialize import dumps_structure, graph_from_structure, load, save

# ---------------------------------------------------------------------------------------------
# Fixtures and helpers

def _weights_every_dtype() -> dict[str, np.ndarray]:
    """One deterministic array per RLX dtype, plus 0-d and size-0 arrays and awkward float bits."""
    rng = np.random.default_rng(0)
    out: dict[str, np.ndarray] = {}
    for dt in DType:
        if dt.is_lowp and dt not in (DType.F8E4M3FN, DType.F8E5M2):
            continue  # safetensors has codes for two low-precision types only (the rest are refused)
        if dt is DType.BOOL:
            a = rng.integers(0, 2, (3, 2)).astype(bool)
        elif dt.is_complex:
            a = (rng.standard_normal((2, 3)) + 1j * rng.standard_normal((2, 3))).astype(dt.np)
        elif dt.is_float:
            a = rng.standard_normal((2, 3)).astype(dt.np)
            # Bit patterns that a lossy path (a float64 detour, a NaN canonicalisation) would change.
            a.flat[:4] = np.array([-0.0, np.inf, -np.inf, np.nan]).astype(dt.np)
        else:
            info = np.iinfo(dt.np)
            a = rng.integers(info.min, info.max, (4,), endpoint=True, dtype=dt.np)
        out[f"p_{dt.value}"] = a
    out["scalar_f64"] = np.array(3.25, dtype=np.float64)
    out["empty_c64"] = np.zeros((0, 3), dtype=np.complex64)
    out["empty_bf16"] = np.zeros((2, 0), dtype=ml_dtypes.bfloat16)
    return out


def _build(weights: dict[str, np.ndarray] | None = None) -> Graph:
    g = GraphBuilder("serialize_test")
    x = g.input("x", "f32", ("batch", 4))
    g.input("mask", "bool", ("batch", "seq"))
    w = g.param("w", np.arange(12, dtype=np.float32).reshape(4, 3) / 7)
    for name, arr in (weights or {}).items():
        g.param(name, arr)
    y = x @ w
    p = g.pad(y, pads=(0, 1, 0, 1), value=float("-inf"))
    q = g.pad(y, pads=(0, 2, 0, 0), value=float("nan"))
    c = p.astype("bf16")
    s = c.sum()  # reduce_sum with axes=None
    t = p.transpose(1, 0)
    g.output(s, "total")
    g.output(t)
    g.output(q.max(axes=(1,), keepdims=True))
    return g.build()


@pytest.fixture()
def graph() -> Graph:
    return _build(_weights_every_dtype())


@pytest.fixture()
def saved(tmp_path: Path, graph: Graph) -> Path:
    path = tmp_path / "model.rlx"
    save(graph, path)
    return path


def _bits(a: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    return str(a.dtype), a.shape, np.ascontiguousarray(a).reshape(-1).view(np.uint8).tobytes()


def _raw_file(path: Path, header: Any, data: bytes = b"", length: int | None = None) -> Path:
    """A safetensors file written by hand, so tests can plant exactly one defect."""
    hb = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(hb) if length is None else length) + hb + data)
    return path


def _rlx_file(path: Path, structure: Any, tensors: dict[str, np.ndarray], **meta: str) -> Path:
    """An .rlx file with a hand-edited structure or metadata (written by the real container writer)."""
    metadata = {"format": "rlx", "schema_version": "1", "rlx_core_version": rlx_core.__version__,
                "graph": structure if isinstance(structure, str) else json.dumps(structure)}
    metadata.update(meta)
    write_safetensors(path, tensors, metadata)
    return path


def _small() -> Graph:
    return _build()


def _edit(graph: Graph, path: Path, change: Any) -> Path:
    """Save ``graph`` with ``change(structure)`` applied to its graph JSON."""
    structure = copy.deepcopy(graph.structure())
    change(structure)
    return _rlx_file(path, structure, dict(graph.weights))


def _node_index(structure: dict[str, Any], op: str) -> int:
    return next(i for i, n in enumerate(structure["nodes"]) if n["op"] == op)


# ---------------------------------------------------------------------------------------------
# Round trip

def test_round_trip_is_exact(graph: Graph, saved: Path) -> None:
    loaded = load(saved)
    assert loaded.structure() == graph.structure()
    assert dumps_structure(loaded) == dumps_structure(graph)
    assert str(loaded) == str(graph)
    assert dict(loaded.types) == dict(graph.types)
    assert loaded.symbols == {"batch", "seq"}
    assert set(loaded.weights) == set(graph.weights)
    for name, w in graph.weights.items():
        assert _bits(loaded.weights[name]) == _bits(w), name


def test_round_trip_decodes_attribute_types(saved: Path) -> None:
    loaded = load(saved)
    cast = next(n for n in loaded.nodes if n.op == "cast")
    assert cast.attrs["to"] is DType.BF16
    pads = [n for n in loaded.nodes if n.op == "pad"]
    assert pads[0].attrs["pads"] == (0, 1, 0, 1) and isinstance(pads[0].attrs["pads"], tuple)
    assert pads[0].attrs["value"] == float("-inf")
    assert np.isnan(pads[1].attrs["value"])
    assert next(n for n in loaded.nodes if n.op == "reduce_sum").attrs["axes"] is None
    assert next(n for n in loaded.nodes if n.op == "transpose").attrs["perm"] == (1, 0)


def test_fingerprint_survives_round_trip(tmp_path: Path) -> None:
    graph = _build({"i": np.arange(5, dtype=np.int64), "h": np.ones((2, 2), np.float16),
                    "c": np.full(3, 1 - 2j, np.complex64), "b": np.array([True, False])})
    save(graph, tmp_path / "m.rlx")
    assert load(tmp_path / "m.rlx").fingerprint == graph.fingerprint


def test_fingerprint_survives_round_trip_every_dtype(graph: Graph, saved: Path) -> None:
    assert load(saved).fingerprint == graph.fingerprint


def test_top_level_lazy_save_and_load(tmp_path: Path) -> None:
    graph = _small()
    rlx_core.save(graph, tmp_path / "m.rlx")
    assert rlx_core.load(tmp_path / "m.rlx").structure() == graph.structure()


def test_metadata_holds_graph_json(graph: Graph, saved: Path) -> None:
    header, meta = read_safetensors_header(saved)
    assert meta["format"] == "rlx" and meta["schema_version"] == "1"
    assert meta["rlx_core_version"] == rlx_core.__version__
    assert json.loads(meta["graph"]) == json.loads(json.dumps(graph.structure()))
    assert list(header) == sorted(header) == sorted(graph.weights)
    assert header["p_bf16"]["dtype"] == "BF16" and header["scalar_f64"]["shape"] == []


def test_save_is_deterministic(tmp_path: Path, graph: Graph) -> None:
    save(graph, tmp_path / "a.rlx")
    save(_build(_weights_every_dtype()), tmp_path / "b.rlx")
    assert (tmp_path / "a.rlx").read_bytes() == (tmp_path / "b.rlx").read_bytes()


def test_graph_from_structure_without_a_file(graph: Graph) -> None:
    rebuilt = graph_from_structure(json.loads(dumps_structure(graph)), dict(graph.weights))
    assert rebuilt.structure() == graph.structure()


# ---------------------------------------------------------------------------------------------
# Zero copy and atomic writes

def _mapped(a: np.ndarray) -> bool:
    base: Any = a
    while base is not None:
        if isinstance(base, (np.memmap, mmap.mmap)):
            return True
        base = getattr(base, "base", None)
    return False


def test_loaded_weights_are_read_only_memory_maps(saved: Path) -> None:
    loaded = load(saved)
    for name, w in loaded.weights.items():
        assert not w.flags.writeable, name
        assert _mapped(w), name
        assert w.flags.aligned, name  # the writer lays tensors out so every one is naturally aligned
    with pytest.raises(ValueError):
        loaded.weights["w"][0, 0] = 1.0


def test_read_without_mmap_gives_owned_writable_arrays(graph: Graph, saved: Path) -> None:
    tensors, _ = read_safetensors(saved, mmap=False)
    for name, w in graph.weights.items():
        assert _bits(tensors[name]) == _bits(w)
        assert tensors[name].flags.writeable and not _mapped(tensors[name])


def test_overwrite_while_mapped_is_safe_and_leaves_no_temp_files(tmp_path: Path, graph: Graph) -> None:
    path = tmp_path / "model.rlx"
    save(graph, path)
    old = load(path)
    expected = _bits(old.weights["p_f32"])
    save(_small(), path)  # replaces the file the old graph still maps
    assert _bits(old.weights["p_f32"]) == expected
    assert load(path).structure() == _small().structure()
    assert sorted(os.listdir(tmp_path)) == ["model.rlx"]


def test_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    write_safetensors(path, {"a": np.ones(2, np.float32)})
    before = path.read_bytes()
    with pytest.raises(SerializationError, match="not supported"):
        write_safetensors(path, {"a": np.ones(2, np.complex128)})
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["t.safetensors"]


# ---------------------------------------------------------------------------------------------
# The safetensors container

def test_writer_converts_big_endian_and_strided_arrays(tmp_path: Path) -> None:
    be = np.arange(6, dtype=">i4").reshape(2, 3)
    strided = np.arange(20, dtype=np.float64).reshape(4, 5)[::2, ::-2]
    write_safetensors(tmp_path / "t.st", {"be": be, "strided": strided}, {"note": "hi"})
    tensors, meta = read_safetensors(tmp_path / "t.st")
    assert meta == {"note": "hi"}
    assert tensors["be"].dtype == np.dtype("<i4") and np.array_equal(tensors["be"], be)
    assert np.array_equal(tensors["strided"], strided)


def test_header_padding_aligns_data_start(tmp_path: Path) -> None:
    for n in range(1, 9):  # names of every length mod 8
        path = tmp_path / f"{n}.st"
        write_safetensors(path, {"x" * n: np.ones(1, np.float64)})
        raw = path.read_bytes()
        (hlen,) = struct.unpack("<Q", raw[:8])
        assert (8 + hlen) % 8 == 0 and raw[8 + hlen - 1:8 + hlen] in (b" ", b"}")


def test_empty_file_of_tensors_round_trips(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "e.st", {})
    assert read_safetensors(tmp_path / "e.st") == ({}, {})


@pytest.mark.parametrize(("header", "data", "needle"), [
    ({"a": {"dtype": "F8_E8M0", "shape": [1], "data_offsets": [0, 1]}}, b"\0", "dtype 'F8_E8M0'"),
    ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "field 'shape'"),
    ({"a": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, b"\0" * 4, "field 'shape'"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, b"\0" * 8, "pair of integers"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "needs 8"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, b"\0" * 6, "overlap tensor 'a'"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "belong to no tensor"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8, "last 4 bytes"),
    ({"a": {"dtype": "F32", "shape": [1]}}, b"", "no 'data_offsets'"),
    ({"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4], "x": 1}}, b"\0" * 4, "unknown field 'x'"),
    ({"a": [1, 2]}, b"", "not an object"),
    ({"__metadata__": {"k": 1}}, b"", "not a string"),
    ({"__metadata__": []}, b"", "not an object"),
    ([1, 2], b"", "not an object"),
    (b'{"a": 1, "a": 2}', b"", "duplicate key 'a'"),
    (b'{"__metadata__": {"k": NaN}}', b"", "non-standard JSON token"),
    (b"\xff\xfe{}", b"", "not valid UTF-8"),
])
def test_container_validation(tmp_path: Path, header: Any, data: bytes, needle: str) -> None:
    path = _raw_file(tmp_path / "bad.st", header, data)
    for read in (read_safetensors, read_safetensors_header):
        with pytest.raises(SerializationError) as e:
            read(path)
        assert needle in str(e.value) and str(path) in str(e.value)
        if isinstance(header, dict) and "a" in header and needle != "last 4 bytes":
            assert "tensor 'a'" in str(e.value) or "tensor 'b'" in str(e.value)  # names the tensor


def test_bool_bytes_other_than_0_and_1_are_refused(tmp_path: Path) -> None:
    path = _raw_file(tmp_path / "bad.st", {"a": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}},
                     b"\0\7")
    read_safetensors_header(path)  # the header alone is fine: data is checked when it is read
    for use_mmap in (True, False):
        with pytest.raises(SerializationError, match="other than 0 and 1") as e:
            read_safetensors(path, mmap=use_mmap)
        assert "tensor 'a'" in str(e.value)


def test_writer_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(SerializationError, match="metadata"):
        write_safetensors(tmp_path / "t.st", {}, {"k": 1})  # type: ignore[dict-item]
    with pytest.raises(SerializationError, match="reserved"):
        write_safetensors(tmp_path / "t.st", {"__metadata__": np.ones(1)})
    with pytest.raises(SerializationError, match="directory"):
        write_safetensors(tmp_path / "no" / "such" / "t.st", {})
    assert not (tmp_path / "t.st").exists()


# ---------------------------------------------------------------------------------------------
# load() as the validator: one test per kind of damage

def _load_error(path: Path) -> str:
    with pytest.raises(SerializationError) as e:
        load(path)
    return str(e.value)


def test_truncated_file(saved: Path) -> None:
    raw = saved.read_bytes()
    saved.write_bytes(raw[:5])
    msg = _load_error(saved)
    assert "5 bytes long" in msg and str(saved) in msg
    saved.write_bytes(raw[:-3])  # header intact, data cut short
    msg = _load_error(saved)
    assert "outside the" in msg and "field 'data_offsets'" in msg and "tensor '" in msg


def test_bad_header_length(tmp_path: Path) -> None:
    msg = _load_error(_raw_file(tmp_path / "m.rlx", {}, length=10**12))
    assert "header length prefix says 1000000000000 bytes" in msg


def test_invalid_header_json(tmp_path: Path) -> None:
    msg = _load_error(_raw_file(tmp_path / "m.rlx", b'{"a": {"dtype": "F32",'))
    assert "not valid JSON" in msg and "line 1 column" in msg


def test_wrong_format(tmp_path: Path) -> None:
    path = tmp_path / "m.rlx"
    write_safetensors(path, {"w": np.ones(2, np.float32)}, {"format": "pt"})
    msg = _load_error(path)
    assert "'format' is 'pt'" in msg and "not an RLX model" in msg
    write_safetensors(path, {"w": np.ones(2, np.float32)})
    assert "plain safetensors file" in _load_error(path)


def test_future_schema_version(tmp_path: Path) -> None:
    g = _small()
    msg = _load_error(_rlx_file(tmp_path / "m.rlx", g.structure(), dict(g.weights), schema_version="2",
                                rlx_core_version="9.0.0"))
    assert "schema version 2" in msg and "9.0.0" in msg and "upgrade rlx-core" in msg
    for bad in ("v1", "0", "1" * 5000):  # 5000 digits: int() alone would raise a raw ValueError
        msg = _load_error(_rlx_file(tmp_path / "m.rlx", g.structure(), dict(g.weights), schema_version=bad))
        assert "'schema_version'" in msg


def test_invalid_graph_json(tmp_path: Path) -> None:
    g = _small()
    msg = _load_error(_rlx_file(tmp_path / "m.rlx", '{"name": "g", ', dict(g.weights)))
    assert "graph is not valid JSON" in msg and "metadata 'graph'" in msg


def test_missing_weight(tmp_path: Path) -> None:
    g = _small()
    msg = _load_error(_rlx_file(tmp_path / "m.rlx", g.structure(), {}))
    assert "parameter 0 'w'" in msg and "no tensor 'w'" in msg


def test_wrong_weight_dtype(tmp_path: Path) -> None:
    g = _small()
    tensors = {k: v.astype(np.float16) if k == "w" else v for k, v in g.weights.items()}
    msg = _load_error(_rlx_file(tmp_path / "m.rlx", g.structure(), tensors))
    assert "parameter 0 'w'" in msg and "F16" in msg and "field 'dtype' declares f32" in msg


def test_wrong_weight_shape_and_extra_tensor(tmp_path: Path) -> None:
    g = _small()
    tensors = {k: v.reshape(-1) if k == "w" else v for k, v in g.weights.items()}
    msg = _load_error(_rlx_file(tmp_path / "m.rlx", g.structure(), tensors))
    assert "parameter 0 'w'" in msg and "field 'shape'" in msg
    msg = _load_error(_rlx_file(tmp_path / "m.rlx", g.structure(), {**g.weights, "stray": np.ones(1)}))
    assert "tensor 'stray'" in msg and "no parameter declares it" in msg


def test_unknown_op(tmp_path: Path) -> None:
    g = _small()

    def change(s: dict[str, Any]) -> None:
        s["nodes"][0]["op"] = "matmull"

    msg = _load_error(_edit(g, tmp_path / "m.rlx", change))
    assert "node 0 'matmul_0': field 'op': unknown op 'matmull'" in msg and "did you mean matmul" in msg


def test_undefined_input(tmp_path: Path) -> None:
    g = _small()
    i = _node_index(g.structure(), "cast")

    def change(s: dict[str, Any]) -> None:
        s["nodes"][i]["inputs"] = ["nope"]

    msg = _load_error(_edit(g, tmp_path / "m.rlx", change))
    assert f"node {i} 'cast_0': field 'inputs'[0] names 'nope'" in msg


def test_inputs_not_a_list_of_strings(tmp_path: Path) -> None:
    g = _small()

    def change(s: dict[str, Any]) -> None:
        s["nodes"][0]["inputs"] = "x"

    msg = _load_error(_edit(g, tmp_path / "m.rlx", change))
    assert "node 0 'matmul_0': field 'inputs' must be a list of strings" in msg


@pytest.mark.parametrize(("op", "attr", "value", "needle"), [
    ("transpose", "perm", "abc", "attribute 'perm' = 'abc' is not a valid ints"),
    ("pad", "value", {"float": "1.5"}, "field 'attrs'.value: {'float': '1.5'} is not a non-finite float"),
    ("cast", "to", {"dtype": "f128"}, "field 'attrs'.to: 'f128' is not a dtype"),
    ("pad", "pads", [0, {"weird": 1}, 0, 1], "field 'attrs'.pads[1]: object {'weird': 1}"),
    ("reduce_sum", "bogus", 1, "has no attribute 'bogus'"),
])
def test_bad_attribute(tmp_path: Path, op: str, attr: str, value: Any, needle: str) -> None:
    g = _small()
    i = _node_index(g.structure(), op)
    name = g.structure()["nodes"][i]["name"]

    def change(s: dict[str, Any]) -> None:
        s["nodes"][i]["attrs"][attr] = value

    msg = _load_error(_edit(g, tmp_path / "m.rlx", change))
    assert f"node {i} {name!r}" in msg and needle in msg


def test_type_error_found_by_inference_names_the_node_index(tmp_path: Path) -> None:
    g = _small()

    def change(s: dict[str, Any]) -> None:
        s["nodes"][0]["inputs"] = ["w", "x"]  # f32[4,3] @ f32[batch,4] does not type-check

    msg = _load_error(_edit(g, tmp_path / "m.rlx", change))
    assert "node 0 'matmul_0' (op matmul)" in msg and str(tmp_path / "m.rlx") in msg


@pytest.mark.parametrize(("change", "needle"), [
    (lambda s: s.pop("nodes"), "graph: field 'nodes' is missing"),
    (lambda s: s.update(extra=1), "graph: unknown field 'extra'"),
    (lambda s: s.update(outputs=["ghost"]), "field 'outputs'[0] names 'ghost'"),
    (lambda s: s["inputs"][0].update(shape=["batch", -4]), "graph input 0 'x': field 'shape'"),
    (lambda s: s["inputs"][1].update(dtype="float32"), "graph input 1 'mask': field 'dtype'"),
    (lambda s: s["params"][0].update(shape=["n", 3]), "parameter 0 'w': field 'shape'"),
    (lambda s: s["nodes"][1].update(name="matmul_0"), "node 1 'matmul_0': field 'name'"),
    (lambda s: s["nodes"][1].update(outputs=["x"]), "field 'outputs'[0] defines 'x', already defined"),
    (lambda s: s["nodes"][1].update(attrs=[]), "field 'attrs' must be a JSON object"),
    (lambda s: s["nodes"].__setitem__(1, 7), "node 1: must be a JSON object, got number"),
])
def test_structure_validation(tmp_path: Path, change: Any, needle: str) -> None:
    assert needle in _load_error(_edit(_small(), tmp_path / "m.rlx", change))


def test_random_damage_never_escapes_as_a_raw_exception(saved: Path) -> None:
    """Deterministic fuzz: flipped header bytes and truncations give SerializationError or a valid graph."""
    raw = saved.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    rng = np.random.default_rng(1234)
    for k in range(300):
        damaged = bytearray(raw)
        if k % 3 == 0:
            damaged = damaged[: int(rng.integers(0, len(raw)))]
        else:
            for pos in rng.integers(0, 8 + hlen, size=int(rng.integers(1, 4))):
                damaged[pos] = int(rng.integers(0, 256))
        saved.write_bytes(bytes(damaged))
        try:
            load(saved)
        except SerializationError:
            pass
