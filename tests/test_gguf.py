"""The GGUF reader: metadata, shapes and tensors against gguf-py (writer and reader as oracles),
dequantization bit-exact against gguf.quants, and strict validation of damaged files."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from gguf.constants import GGML_QUANT_SIZES

from rlx_core.errors import SerializationError
from rlx_core.formats.gguf import DEQUANTIZABLE, GGML_TYPES, GGUFFile, read_gguf

# ---------------------------------------------------------------------------------------------
# Helpers

def _write(path: Path, kvs: Sequence[tuple[str, Any, V, V | None]] = (),
           tensors: Sequence[tuple[str, np.ndarray, Q | None]] = (), alignment: int | None = None) -> Path:
    """A GGUF file written by gguf-py's GGUFWriter."""
    w = gguf.GGUFWriter(path, "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, value, vtype, sub in kvs:
        w.add_key_value(key, value, vtype, sub)
    for name, arr, qtype in tensors:
        w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


_FMT = {V.UINT8: "B", V.INT8: "b", V.UINT16: "H", V.INT16: "h", V.UINT32: "I", V.INT32: "i",
        V.FLOAT32: "f", V.BOOL: "B", V.UINT64: "Q", V.INT64: "q", V.FLOAT64: "d"}


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _val(vtype: int, v: Any) -> bytes:
    if vtype == V.STRING:
        return _str(v)
    if vtype == V.ARRAY:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(_val(etype, i) for i in items)
    return struct.pack("<" + _FMT.get(vtype, "B"), v)  # an invalid type: one byte of payload


def _build(kvs: Sequence[tuple[str | bytes, int, Any]] = (),
           tensors: Sequence[tuple[Any, ...]] = (), *, version: int = 3, alignment: int = 32,
           magic: bytes = b"GGUF") -> tuple[bytes, dict[Any, int]]:
    """A GGUF file built byte by byte, so a test can plant exactly one defect.

    ``kvs``: (key, value type, value), an array value being (element type, items). ``tensors``: (name,
    dims in ggml order, type id, data bytes[, offset]). Returns the bytes and the position of each field.
    """
    out = bytearray(magic + struct.pack("<IQQ", version, len(tensors), len(kvs)))
    pos: dict[Any, int] = {}
    for key, vtype, v in kvs:
        pos["kv", key] = len(out)
        out += _str(key) + struct.pack("<I", vtype) + _val(vtype, v)
    offsets, cur = [], 0
    for t in tensors:
        off = t[4] if len(t) > 4 else cur
        offsets.append(off)
        cur = -(-(off + len(t[3])) // alignment) * alignment
    for (name, dims, tid, _data, *_), off in zip(tensors, offsets):
        pos["name", name] = len(out)
        out += _str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        pos["type", name] = len(out)
        out += struct.pack("<I", tid)
        pos["offset", name] = len(out)
        out += struct.pack("<Q", off)
    out += b"\0" * (-len(out) % alignment)
    pos["data"] = len(out)
    data = bytearray(max([o + len(t[3]) for t, o in zip(tensors, offsets)], default=0))
    for t, o in zip(tensors, offsets):
        data[o:o + len(t[3])] = t[3]
    return bytes(out + data), pos


def _put(tmp_path: Path, data: bytes, name: str = "t.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


def _fails(path: Path, *fragments: str) -> SerializationError:
    with pytest.raises(SerializationError) as ei:
        read_gguf(path)
    msg = str(ei.value)
    assert str(path) in msg and "fix:" in msg, msg
    for frag in fragments:
        assert frag in msg, msg
    return ei.value


# ---------------------------------------------------------------------------------------------
# Metadata

_SCALARS: list[tuple[str, Any, V]] = [
    ("u8", 255, V.UINT8), ("i8", -128, V.INT8), ("u16", 65535, V.UINT16), ("i16", -32768, V.INT16),
    ("u32", 2**32 - 1, V.UINT32), ("i32", -(2**31), V.INT32), ("f32", 0.1, V.FLOAT32),
    ("b_true", True, V.BOOL), ("b_false", False, V.BOOL), ("u64", 2**64 - 1, V.UINT64),
    ("i64", -(2**63), V.INT64), ("f64", math.pi, V.FLOAT64), ("f32_inf", -math.inf, V.FLOAT32),
    ("s", "héllo, 世界 🦙", V.STRING), ("s_empty", "", V.STRING),
]
_ARRAYS: list[tuple[str, list[Any], V]] = [
    ("a_u8", [0, 1, 255], V.UINT8), ("a_i8", [-128, 0, 127], V.INT8), ("a_u16", [0, 65535], V.UINT16),
    ("a_i16", [-32768, 32767], V.INT16), ("a_u32", [0, 2**32 - 1], V.UINT32),
    ("a_i32", [-(2**31), 2**31 - 1], V.INT32), ("a_f32", [0.5, -1.25, 3e38], V.FLOAT32),
    ("a_bool", [True, False, True], V.BOOL), ("a_u64", [0, 2**64 - 1], V.UINT64),
    ("a_i64", [-(2**63), 2**63 - 1], V.INT64), ("a_f64", [math.e, -0.0], V.FLOAT64),
    ("a_str", ["", "a", "<s>", "▁the", "日本"], V.STRING),
]
_NP = {V.UINT8: np.uint8, V.INT8: np.int8, V.UINT16: np.uint16, V.INT16: np.int16, V.UINT32: np.uint32,
       V.INT32: np.int32, V.FLOAT32: np.float32, V.BOOL: np.bool_, V.UINT64: np.uint64, V.INT64: np.int64,
       V.FLOAT64: np.float64}


def test_metadata_of_every_type_matches_gguf_reader(tmp_path: Path) -> None:
    kvs = [(k, v, t, None) for k, v, t in _SCALARS]
    kvs += [(k, v, V.ARRAY, t) for k, v, t in _ARRAYS]
    kvs.append(("nested", [[1, 2, 3], [4]], V.ARRAY, None))
    path = _write(tmp_path / "m.gguf", kvs)
    f = read_gguf(path)
    oracle = gguf.GGUFReader(path)

    assert f.version == 3 and f.alignment == 32 and f.tensors == {}
    assert list(f.metadata) == ["general.architecture"] + [k for k, *_ in kvs]
    assert f.metadata["general.architecture"] == "llama"
    for key, value, vtype in _SCALARS:
        got = f.metadata[key]
        expect = float(np.float32(value)) if vtype == V.FLOAT32 else value
        assert got == expect and type(got) is type(expect), key
        assert f.metadata_types[key] == vtype.name.lower()
        assert got == oracle.fields[key].contents(), key
    for key, values, vtype in _ARRAYS:
        got = f.metadata[key]
        assert f.metadata_types[key] == f"array[{vtype.name.lower()}]"
        if vtype == V.STRING:
            assert got == values
        else:
            assert isinstance(got, np.ndarray) and got.dtype == _NP[vtype]
            np.testing.assert_array_equal(got, np.array(values, _NP[vtype]))
            assert got.flags.writeable  # a copy, not a view pinning the map
        assert list(got) == oracle.fields[key].contents(), key
    nested = f.metadata["nested"]
    assert f.metadata_types["nested"] == "array[array[int32]]"
    assert [a.tolist() for a in nested] == [[1, 2, 3], [4]]


def test_hand_built_v2_file_with_empty_arrays(tmp_path: Path) -> None:
    kvs = [("empty_u8", V.ARRAY, (V.UINT8, [])), ("empty_str", V.ARRAY, (V.STRING, [])),
           ("empty_nested", V.ARRAY, (V.ARRAY, [])),
           ("deep", V.ARRAY, (V.ARRAY, [(V.ARRAY, [(V.INT8, [-1])])])), ("general.alignment", V.UINT32, 8)]
    data = np.arange(6, dtype=np.float32)
    raw, _ = _build(kvs, [("t", (3, 2), 0, data.tobytes()), ("scalar", (), 0, np.float32(7).tobytes())],
                    version=2, alignment=8)
    f = read_gguf(_put(tmp_path, raw))
    assert f.version == 2 and f.alignment == 8
    assert f.metadata["empty_u8"].shape == (0,) and f.metadata["empty_u8"].dtype == np.uint8
    assert f.metadata["empty_str"] == [] and f.metadata["empty_nested"] == []
    assert f.metadata_types["deep"] == "array[array[array[int8]]]"
    assert f.metadata["deep"][0][0].tolist() == [-1]
    np.testing.assert_array_equal(f.tensor("t"), data.reshape(2, 3))
    assert f.tensors["t"].dims == (3, 2) and f.tensors["t"].shape == (2, 3)
    assert f.tensor("scalar").shape == () and f.tensor("scalar") == 7


# ---------------------------------------------------------------------------------------------
# Plain tensors

def _plain_tensors() -> dict[str, tuple[np.ndarray, Q | None]]:
    rng = np.random.default_rng(0)
    out: dict[str, tuple[np.ndarray, Q | None]] = {}
    shapes = [(7,), (3, 5), (2, 3, 4), (2, 1, 3, 2)]
    for i, dt in enumerate([np.float32, np.float16, np.float64]):
        a = rng.standard_normal(shapes[i % 4]).astype(dt)
        a.flat[:4] = np.array([-0.0, np.inf, -np.inf, np.nan]).astype(dt)  # bits a lossy path would change
        out[f"float.{np.dtype(dt).name}"] = (a, None)
    bf = rng.standard_normal((4, 3)).astype(ml_dtypes.bfloat16)
    out["float.bf16"] = (bf.view(np.uint16), Q.BF16)
    for i, dt in enumerate([np.int8, np.int16, np.int32, np.int64]):
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, shapes[i], dtype=dt, endpoint=True)
        a.flat[:2] = [info.min, info.max]
        out[f"int.{np.dtype(dt).name}"] = (a, None)
    return out


def test_plain_tensors_of_every_dtype_are_exact_zero_copy_views(tmp_path: Path) -> None:
    tensors = _plain_tensors()
    path = _write(tmp_path / "p.gguf", tensors=[(n, a, q) for n, (a, q) in tensors.items()])
    f = read_gguf(path)
    oracle = {t.name: t for t in gguf.GGUFReader(path).tensors}
    assert list(f.tensors) == list(tensors)
    for name, (arr, qtype) in tensors.items():
        info, ref = f.tensors[name], oracle[name]
        got = f.tensor(name)
        expect = arr.view(ml_dtypes.bfloat16) if qtype == Q.BF16 else arr
        assert got.dtype == expect.dtype and got.shape == expect.shape, name
        assert got.tobytes() == expect.tobytes(), name
        assert not got.flags.writeable and np.shares_memory(got, f.raw(name)), name
        assert f.tensor(name, dequantize=False).tobytes() == got.tobytes()
        # The same layout as gguf-py reads it.
        assert info.dims == tuple(ref.shape.tolist()) and info.shape == arr.shape
        assert info.ggml_type == int(ref.tensor_type) and info.type_name == ref.tensor_type.name
        assert info.nbytes == ref.n_bytes and info.file_offset == ref.data_offset
        assert info.file_offset == f.data_offset + info.offset and info.offset % 32 == 0
        assert f.raw(name).tobytes() == ref.data.tobytes()
        assert info.n_elements == ref.n_elements and not info.quantized


def test_custom_alignment_is_honoured(tmp_path: Path) -> None:
    tensors = [(f"t{i}", np.full(i + 1, i, np.float32), None) for i in range(5)]
    f = read_gguf(_write(tmp_path / "a.gguf", tensors=tensors, alignment=256))
    assert f.alignment == 256 and f.data_offset % 256 == 0
    for name, arr, _ in tensors:
        assert f.tensors[name].offset % 256 == 0
        np.testing.assert_array_equal(f.tensor(name), arr)


# ---------------------------------------------------------------------------------------------
# Quantized tensors

_CAN_QUANTIZE = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.MXFP4]
# Types gguf-py only dequantizes: random blocks whose f16 scale fields (at these offsets) are finite.
_RANDOM_BLOCKS = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,),
                  Q.IQ4_NL: (0,), Q.IQ4_XS: (0,)}


def _random_blocks(rng: np.random.Generator, qtype: Q, rows: int, cols: int) -> np.ndarray:
    bs, ts = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows * cols // bs, ts), dtype=np.uint8)
    for o in _RANDOM_BLOCKS[qtype]:
        scale = (rng.standard_normal((len(blocks), 1)) * 0.1).astype(np.float16)
        blocks[:, o:o + 2] = scale.view(np.uint8)
    return blocks.reshape(rows, cols // bs * ts)


def test_dequantizable_types_are_the_ones_tested() -> None:
    assert sorted(DEQUANTIZABLE) == sorted(q.name for q in _CAN_QUANTIZE + list(_RANDOM_BLOCKS))


def test_type_table_matches_gguf_py() -> None:
    for t in GGML_TYPES.values():
        assert Q(t.id).name == t.name
        if t.name != "Q8_1":  # gguf-py lists 40 bytes; ggml's block_q8_1 (two f16 + 32 int8) is 36
            assert GGML_QUANT_SIZES[Q(t.id)] == (t.block_size, t.type_size), t.name
    assert {q.value for q in Q} == set(GGML_TYPES)


@pytest.mark.parametrize("qtype", _CAN_QUANTIZE + list(_RANDOM_BLOCKS), ids=lambda q: q.name)
def test_dequantization_is_bit_exact_against_gguf_py(tmp_path: Path, qtype: Q) -> None:
    rng = np.random.default_rng(int(qtype))
    bs, ts = GGML_QUANT_SIZES[qtype]
    if qtype in _CAN_QUANTIZE:
        x = (rng.standard_normal((3, 4, 512)) * rng.uniform(0.01, 10, (3, 4, 1))).astype(np.float32)
        x[0, 0, :bs] = 0  # an all-zero block: scale 0
        blocks = gguf.quants.quantize(x, qtype)
    else:
        blocks = _random_blocks(rng, qtype, 6, 512).reshape(2, 3, -1)
    path = _write(tmp_path / "q.gguf", tensors=[("w", blocks, qtype)])
    f = read_gguf(path)
    info = f.tensors["w"]
    ref = gguf.GGUFReader(path).tensors[0]
    expect = gguf.quants.dequantize(blocks, qtype)

    got = f.tensor("w")
    assert got.dtype == np.float32 and got.shape == expect.shape == blocks.shape[:-1] + (512,)
    assert np.array_equal(_bits(got), _bits(expect))  # 0 ulp, signed zeros included
    assert info.quantized and info.type_name == qtype.name and info.dims == tuple(ref.shape.tolist())
    assert info.nbytes == blocks.nbytes == ref.n_bytes and info.file_offset == ref.data_offset
    raw = f.tensor("w", dequantize=False)
    assert raw.shape == ref.data.shape == blocks.shape and np.array_equal(raw, blocks)
    assert np.shares_memory(raw, f.raw("w")) and not raw.flags.writeable


@pytest.mark.parametrize("qtype", sorted(_RANDOM_BLOCKS, key=int) + [Q.Q4_0, Q.Q8_0], ids=lambda q: q.name)
def test_dequantizing_garbage_scales_propagates_nan_and_inf_like_gguf_py(tmp_path: Path, qtype: Q) -> None:
    rng = np.random.default_rng(100 + int(qtype))
    bs, ts = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (4, 2048 // bs * ts), dtype=np.uint8)
    blocks[:, :2] = 0x7C  # f16 +inf wherever a scale sits at byte 0; NaN/huge values elsewhere at random
    f = read_gguf(_write(tmp_path / "g.gguf", tensors=[("w", blocks, qtype)]))
    with np.errstate(all="ignore"):
        expect = gguf.quants.dequantize(blocks, qtype)
    with np.errstate(all="raise"):  # our dequantizer must not warn (or raise) on such data
        got = f.tensor("w")
    np.testing.assert_array_equal(got, expect)


def test_large_tensor_is_dequantized_in_chunks_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    blocks = _random_blocks(rng, Q.Q4_K, 5, 256 * 1000)  # 1.28 M elements, more than one chunk
    f = read_gguf(_write(tmp_path / "big.gguf", tensors=[("w", blocks, Q.Q4_K)]))
    assert np.array_equal(_bits(f.tensor("w")), _bits(gguf.quants.dequantize(blocks, Q.Q4_K)))


def test_types_without_a_dequantizer_are_readable_raw_and_refused_clearly(tmp_path: Path) -> None:
    bs, ts = GGML_QUANT_SIZES[Q.IQ2_XXS]
    blocks = np.random.default_rng(1).integers(0, 256, (2, 2 * ts), dtype=np.uint8)
    f = read_gguf(_write(tmp_path / "iq.gguf", tensors=[("blk.0.ffn_up.weight", blocks, Q.IQ2_XXS)]))
    assert f.tensors["blk.0.ffn_up.weight"].shape == (2, 2 * bs)
    assert np.array_equal(f.tensor("blk.0.ffn_up.weight", dequantize=False), blocks)
    with pytest.raises(SerializationError, match=r"(?s)IQ2_XXS \(id 16\).*blk\.0\.ffn_up\.weight.*Q4_K"):
        f.tensor("blk.0.ffn_up.weight")
    with pytest.raises(SerializationError, match="no tensor named 'nope'"):
        f.tensor("nope")


# ---------------------------------------------------------------------------------------------
# Damaged files: always a SerializationError, never another exception

def _reference_file(tmp_path: Path) -> tuple[bytes, GGUFFile]:
    rng = np.random.default_rng(3)
    kvs = [("tokenizer.ggml.tokens", [f"tok{i}" for i in range(40)], V.ARRAY, None),
           ("tokenizer.ggml.scores", [float(i) for i in range(40)], V.ARRAY, None),
           ("llama.context_length", 4096, V.UINT32, None), ("general.name", "tiny", V.STRING, None)]
    tensors = [("token_embd.weight", rng.standard_normal((8, 32)).astype(np.float16), None),
               ("blk.0.attn_q.weight", gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32),
                                                            Q.Q8_0), Q.Q8_0),
               ("blk.0.ffn_down.weight", _random_blocks(rng, Q.Q4_K, 2, 256), Q.Q4_K),
               ("output_norm.weight", rng.standard_normal(32).astype(np.float32), None)]
    path = _write(tmp_path / "ref.gguf", kvs, tensors)
    return path.read_bytes(), read_gguf(path)


def _read_everything(path: Path) -> None:
    f = read_gguf(path)
    for name in f.tensors:
        f.tensor(name)
        f.tensor(name, dequantize=False)


def test_every_sampled_truncation_is_refused(tmp_path: Path) -> None:
    data, ref = _reference_file(tmp_path)
    need = max(i.file_offset + i.nbytes for i in ref.tensors.values())
    rng = np.random.default_rng(42)
    header_end = ref.data_offset
    cuts = sorted(set(range(0, 40)) | set(rng.integers(40, header_end, 120).tolist())
                  | set(rng.integers(header_end, len(data), 60).tolist()) | {need - 1, need, len(data) - 1})
    assert len(cuts) >= 200
    path = tmp_path / "cut.gguf"
    for cut in cuts:
        path.write_bytes(data[:cut])
        if cut < need:
            with pytest.raises(SerializationError) as ei:
                _read_everything(path)
            assert str(path) in str(ei.value) and "fix:" in str(ei.value)
        else:  # only alignment padding after the last tensor is missing: still a complete file
            _read_everything(path)


def test_random_corruption_never_escapes_as_another_exception(tmp_path: Path) -> None:
    data, ref = _reference_file(tmp_path)
    rng = np.random.default_rng(1234)
    path = tmp_path / "bad.gguf"
    outcomes = {"ok": 0, "refused": 0}
    for trial in range(400):
        buf = bytearray(data)
        if trial % 3 == 0:  # a random byte anywhere in the header
            buf[int(rng.integers(0, ref.data_offset))] = int(rng.integers(0, 256))
        elif trial % 3 == 1:  # a 4- or 8-byte field forced to an extreme
            at = int(rng.integers(0, ref.data_offset - 8))
            n = int(rng.choice([4, 8]))
            buf[at:at + n] = bytes([int(rng.choice([0x00, 0xFF, 0x7F, 0x80]))]) * n
        else:  # several random bytes, header and data
            for at in rng.integers(0, len(buf), 5):
                buf[int(at)] = int(rng.integers(0, 256))
        path.write_bytes(bytes(buf))
        try:
            _read_everything(path)
            outcomes["ok"] += 1
        except SerializationError:
            outcomes["refused"] += 1
    assert outcomes["ok"] > 0 and outcomes["refused"] > 0


def test_bad_magic_legacy_magic_and_empty_file(tmp_path: Path) -> None:
    raw, _ = _build()
    _fails(_put(tmp_path, b"GGUX" + raw[4:]), "b'GGUX'", "not the GGUF magic", "byte 0")
    _fails(_put(tmp_path, b"tjgg" + raw[4:]), "legacy GGJT")
    _fails(_put(tmp_path, b""), "the file is empty")
    _fails(_put(tmp_path, b"GG"), "inside the 4-byte magic")
    _fails(tmp_path / "missing.gguf", "cannot open the file")
    _fails(tmp_path, "cannot open the file")  # a directory


@pytest.mark.parametrize(("version", "fragment"), [
    (1, "GGUF version 1"), (4, "GGUF version 4 is not supported"), (0, "GGUF version 0"),
    (0x03000000, "big-endian GGUF v3"),
])
def test_unsupported_versions(tmp_path: Path, version: int, fragment: str) -> None:
    raw, _ = _build(version=version)
    _fails(_put(tmp_path, raw), fragment, "field 'version'")


def test_unknown_and_removed_ggml_types_name_the_type_and_tensor(tmp_path: Path) -> None:
    raw, pos = _build(tensors=[("blk.0.attn_q.weight", (4,), 0, bytes(16))])
    at = pos["type", "blk.0.attn_q.weight"]
    bad = raw[:at] + struct.pack("<I", 99) + raw[at + 4:]
    _fails(_put(tmp_path, bad), "ggml type id 99", "not a known ggml type", "tensor 'blk.0.attn_q.weight'",
           f"byte {at}")
    bad = raw[:at] + struct.pack("<I", 31) + raw[at + 4:]
    _fails(_put(tmp_path, bad), "type id 31 (Q4_0_4_4)", "removed")


def test_tensor_data_beyond_the_end_of_the_file(tmp_path: Path) -> None:
    raw, pos = _build(tensors=[("a", (8,), 0, bytes(32)), ("blk.0.attn_q.weight", (64,), 0, bytes(256))])
    end = len(raw)
    e = _fails(_put(tmp_path, raw[:-10]), f"tensor 'blk.0.attn_q.weight' ends at byte {end} but the file has "
               f"{end - 10} bytes", "truncated")
    assert e.where is not None and "field 'offset'" in e.where
    at = pos["offset", "a"]
    bad = raw[:at] + struct.pack("<Q", 2**64 - 32) + raw[at + 8:]
    _fails(_put(tmp_path, bad), "tensor 'a' ends at byte")


def test_misaligned_and_overlapping_offsets(tmp_path: Path) -> None:
    raw, _ = _build(tensors=[("a", (8,), 0, bytes(32)), ("b", (8,), 0, bytes(32), 4)])
    _fails(_put(tmp_path, raw), "data offset 4 is not a multiple of the alignment 32", "tensor 'b'")
    raw, _ = _build(tensors=[("a", (16,), 0, bytes(64)), ("b", (8,), 0, bytes(32), 32)])
    _fails(_put(tmp_path, raw), "overlap tensor 'a'", "tensor 'b'")


@pytest.mark.parametrize(("value", "vtype", "fragment"), [
    (0, V.UINT32, "not a uint32 power of two"), (48, V.UINT32, "not a uint32 power of two"),
    (32, V.UINT64, "(uint64)"), ("32", V.STRING, "(string)"),
])
def test_bad_alignment(tmp_path: Path, value: Any, vtype: V, fragment: str) -> None:
    raw, _ = _build([("general.alignment", vtype, value)], [("a", (8,), 0, bytes(32))])
    _fails(_put(tmp_path, raw), fragment, "metadata key 'general.alignment'")


def test_malformed_metadata(tmp_path: Path) -> None:
    ok = ("general.name", V.STRING, "x")
    cases: list[tuple[list[Any], tuple[str, ...]]] = [
        ([ok, ok], ("repeats an earlier key", "metadata key 'general.name'")),
        ([(b"bad\xffkey", V.UINT8, 1)], ("metadata key #0 is not valid UTF-8",)),
        ([("k", 13, 0)], ("the value type is 13", "metadata key 'k'")),
        ([("k", V.BOOL, 2)], ("a bool holds the byte 2",)),
        ([("k", V.ARRAY, (V.BOOL, [1, 0, 7]))], ("a bool holds the byte 7",)),
        ([("k", V.ARRAY, (V.STRING, ["ok", b"\xc3("]))], ("string #1 of the array is not valid UTF-8",)),
        ([("k", V.ARRAY, (42, []))], ("the array element type is 42",)),
    ]
    deep: Any = (V.INT8, [1])
    for _ in range(9):
        deep = (V.ARRAY, [deep])
    cases.append(([("k", V.ARRAY, deep)], ("nested more than 8 deep",)))
    for kvs, fragments in cases:
        raw, _ = _build(kvs)
        _fails(_put(tmp_path, raw), *fragments)


def test_huge_counts_are_refused_before_any_loop(tmp_path: Path) -> None:
    raw, _ = _build([("k", V.ARRAY, (V.UINT8, [1, 2]))])
    for at, fragment in [(16, "the metadata count is"), (8, "the tensor count is")]:
        bad = raw[:at] + struct.pack("<Q", 2**64 - 1) + raw[at + 8:]
        _fails(_put(tmp_path, bad), fragment, "can hold at most")
    at = raw.index(b"k") + 1 + 4 + 4  # after the key, the value type and the element type
    bad = raw[:at] + struct.pack("<Q", 2**62) + raw[at + 8:]
    _fails(_put(tmp_path, bad), "the array length is 4611686018427387904")
    raw, _ = _build([("k", V.STRING, "abc")])
    at = raw.index(b"k") + 1 + 4
    bad = raw[:at] + struct.pack("<Q", 2**63) + raw[at + 8:]
    _fails(_put(tmp_path, bad), "inside the string value")


def test_malformed_tensor_infos(tmp_path: Path) -> None:
    cases: list[tuple[list[Any], tuple[str, ...]]] = [
        ([("a", (8,), 0, bytes(32)), ("a", (8,), 0, bytes(32))], ("repeats the name", "tensor 'a'")),
        ([("a", (1, 1, 1, 1, 8), 0, bytes(32))], ("5 dimensions; ggml allows at most 4",)),
        ([("q", (48,), int(Q.Q4_0), bytes(27))], ("dimension 0 is 48, not a multiple of the Q4_0 block",)),
        ([("big", (2**32, 2**32, 2**31), 0, b"")], ("more than ggml's int64 limit",)),
        ([(b"\xff", (8,), 0, bytes(32))], ("the name of tensor #0 is not valid UTF-8",)),
    ]
    for tensors, fragments in cases:
        raw, _ = _build(tensors=tensors)
        _fails(_put(tmp_path, raw), *fragments)
