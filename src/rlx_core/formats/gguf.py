"""A dependency-free reader of GGUF files (the llama.cpp / ggml model format), versions 2 and 3.

Layout of a file (all integers little-endian)::

    b"GGUF" | u32 version | u64 tensor_count | u64 kv_count
    kv_count x  (string key | u32 value_type | value)
    tensor_count x  (string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type | u64 offset)
    padding to the alignment | tensor data

A string is ``u64 length | UTF-8 bytes``; an array value is ``u32 element_type | u64 count | elements``.
``dims`` are in ggml order (``dims[0]`` varies fastest), the reverse of a NumPy shape. ``offset`` is
relative to the data section, which starts at the end of the tensor infos rounded up to the alignment
(the metadata key ``general.alignment``, 32 by default); every offset is a multiple of it.

:func:`read_gguf` validates the whole header and every tensor's byte range before any tensor data is
touched; every problem is raised as a :class:`~rlx_core.errors.SerializationError` that names the file, the
metadata key or tensor and the byte offset. Tensor data is memory-mapped: plain types (F32, F16, BF16,
F64, I8, I16, I32, I64) come back as read-only zero-copy views; block-quantized types are dequantized to
float32 with vectorised NumPy that reproduces ggml's reference ``dequantize_row_*`` bit for bit
(see :data:`DEQUANTIZABLE`).
"""

from __future__ import annotations

import math
import os
import struct
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import SerializationError
from .shapes import shape_problem

PathLike = str | os.PathLike[str]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"
#: ggml's GGML_MAX_DIMS: llama.cpp refuses tensors with more dimensions, and so do we.
MAX_DIMS = 4
#: Arrays of arrays may nest at most this deep (the format allows nesting; real files use none).
MAX_ARRAY_DEPTH = 8

_LITTLE = sys.byteorder == "little"
_REWRITE = "the file is damaged or was not written by a GGUF writer; download or convert it again"
_TRUNCATED = "the file is truncated (an interrupted download or copy?); download or convert it again"

# ---------------------------------------------------------------------------------------------
# Type tables

#: GGUF metadata value type id -> (name, little-endian NumPy dtype); STRING (8) and ARRAY (9) are special.
_SCALAR_TYPES: Mapping[int, tuple[str, str]] = {
    0: ("uint8", "u1"), 1: ("int8", "i1"), 2: ("uint16", "<u2"), 3: ("int16", "<i2"),
    4: ("uint32", "<u4"), 5: ("int32", "<i4"), 6: ("float32", "<f4"), 7: ("bool", "u1"),
    10: ("uint64", "<u8"), 11: ("int64", "<i8"), 12: ("float64", "<f8"),
}
_SCALAR_STRUCTS: Mapping[int, struct.Struct] = {t: struct.Struct("<" + c) for t, c in zip(
    (0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIifBQqd")}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_BOOL, _STRING, _ARRAY = 7, 8, 9
_VALUE_TYPE_NAMES = {**{k: v[0] for k, v in _SCALAR_TYPES.items()}, _STRING: "string", _ARRAY: "array"}


@dataclass(frozen=True)
class GGMLType:
    """One ggml tensor type: ``block_size`` elements are stored in ``type_size`` bytes."""

    id: int
    name: str
    block_size: int
    type_size: int

    @property
    def quantized(self) -> bool:
        return self.block_size > 1


#: Every ggml tensor type a GGUF file may hold (as of ggml/gguf-py 0.19), by type id.
GGML_TYPES: Mapping[int, GGMLType] = {t.id: t for t in (
    GGMLType(0, "F32", 1, 4), GGMLType(1, "F16", 1, 2), GGMLType(2, "Q4_0", 32, 18),
    GGMLType(3, "Q4_1", 32, 20), GGMLType(6, "Q5_0", 32, 22), GGMLType(7, "Q5_1", 32, 24),
    GGMLType(8, "Q8_0", 32, 34), GGMLType(9, "Q8_1", 32, 36), GGMLType(10, "Q2_K", 256, 84),
    GGMLType(11, "Q3_K", 256, 110), GGMLType(12, "Q4_K", 256, 144), GGMLType(13, "Q5_K", 256, 176),
    GGMLType(14, "Q6_K", 256, 210), GGMLType(15, "Q8_K", 256, 292), GGMLType(16, "IQ2_XXS", 256, 66),
    GGMLType(17, "IQ2_XS", 256, 74), GGMLType(18, "IQ3_XXS", 256, 98), GGMLType(19, "IQ1_S", 256, 50),
    GGMLType(20, "IQ4_NL", 32, 18), GGMLType(21, "IQ3_S", 256, 110), GGMLType(22, "IQ2_S", 256, 82),
    GGMLType(23, "IQ4_XS", 256, 136), GGMLType(24, "I8", 1, 1), GGMLType(25, "I16", 1, 2),
    GGMLType(26, "I32", 1, 4), GGMLType(27, "I64", 1, 8), GGMLType(28, "F64", 1, 8),
    GGMLType(29, "IQ1_M", 256, 56), GGMLType(30, "BF16", 1, 2), GGMLType(34, "TQ1_0", 256, 54),
    GGMLType(35, "TQ2_0", 256, 66), GGMLType(39, "MXFP4", 32, 17), GGMLType(40, "NVFP4", 64, 36),
    GGMLType(41, "Q1_0", 128, 18),
)}
GGML_TYPES_BY_NAME: Mapping[str, GGMLType] = {t.name: t for t in GGML_TYPES.values()}

# Type ids that ggml once had and removed; named in the error so the user knows what they hold.
_REMOVED_TYPES: Mapping[int, str] = {
    4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8",
    36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8",
}

#: Unquantized ggml types, read as zero-copy views of this RLX dtype.
PLAIN_TYPES: Mapping[str, DType] = {
    "F32": DType.F32, "F16": DType.F16, "BF16": DType.BF16, "F64": DType.F64,
    "I8": DType.I8, "I16": DType.I16, "I32": DType.I32, "I64": DType.I64,
}

# ---------------------------------------------------------------------------------------------
# Dequantization. Each function maps an array of structured blocks (n,) to float32 (n, block_size)
# and performs exactly the float32 operations, in the same order, as ggml's dequantize_row_*.

_F16 = "<f2"
_BLOCKS: dict[str, np.dtype] = {
    "Q4_0": np.dtype([("d", _F16), ("qs", "u1", 16)]),
    "Q4_1": np.dtype([("d", _F16), ("m", _F16), ("qs", "u1", 16)]),
    "Q5_0": np.dtype([("d", _F16), ("qh", "<u4"), ("qs", "u1", 16)]),
    "Q5_1": np.dtype([("d", _F16), ("m", _F16), ("qh", "<u4"), ("qs", "u1", 16)]),
    "Q8_0": np.dtype([("d", _F16), ("qs", "i1", 32)]),
    "Q2_K": np.dtype([("scales", "u1", 16), ("qs", "u1", 64), ("d", _F16), ("dmin", _F16)]),
    "Q3_K": np.dtype([("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12), ("d", _F16)]),
    "Q4_K": np.dtype([("d", _F16), ("dmin", _F16), ("scales", "u1", 12), ("qs", "u1", 128)]),
    "Q5_K": np.dtype([("d", _F16), ("dmin", _F16), ("scales", "u1", 12), ("qh", "u1", 32),
                      ("qs", "u1", 128)]),
    "Q6_K": np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", _F16)]),
    "IQ4_NL": np.dtype([("d", _F16), ("qs", "u1", 16)]),
    "IQ4_XS": np.dtype([("d", _F16), ("scales_h", "<u2"), ("scales_l", "u1", 4), ("qs", "u1", 128)]),
    "MXFP4": np.dtype([("e", "u1"), ("qs", "u1", 16)]),
}

_U8 = np.uint8
_NIBBLE_SHIFTS = np.array([0, 4], _U8)
_CRUMB_SHIFTS = np.array([0, 2, 4, 6], _U8)
_KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
_KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)  # e2m1, doubled


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)


def _col(a: np.ndarray) -> np.ndarray:
    """A per-block scalar field as float32 of shape (n, 1)."""
    return _f32(a)[:, None]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 2k): all low nibbles, then all high nibbles (ggml's 32-element layout)."""
    return np.concatenate([qs & _U8(0x0F), qs >> _U8(4)], axis=-1)


def _bits32(qh: np.ndarray) -> np.ndarray:
    """(n,) uint32 -> (n, 32) uint8 bits, bit j first."""
    return ((qh[:, None] >> np.arange(32, dtype=np.uint32)) & np.uint32(1)).astype(_U8)


def _q4_0(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b["qs"]).astype(np.int8) - np.int8(8)
    return _f32(q) * _col(b["d"])


def _q4_1(b: np.ndarray) -> np.ndarray:
    return _f32(_nibbles(b["qs"])) * _col(b["d"]) + _col(b["m"])


def _q5_0(b: np.ndarray) -> np.ndarray:
    q = (_nibbles(b["qs"]) | (_bits32(b["qh"]) << _U8(4))).astype(np.int8) - np.int8(16)
    return _f32(q) * _col(b["d"])


def _q5_1(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b["qs"]) | (_bits32(b["qh"]) << _U8(4))
    return _f32(q) * _col(b["d"]) + _col(b["m"])


def _q8_0(b: np.ndarray) -> np.ndarray:
    return _f32(b["qs"]) * _col(b["d"])


def _q2_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    # element 128*h + 32*j + l is bits 2j..2j+1 of qs[32*h + l]; scales[e // 16] holds its scale and min.
    q = (b["qs"].reshape(n, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1)) & _U8(3)
    dl = _col(b["d"]) * _f32(b["scales"] & _U8(0x0F))
    ml = _col(b["dmin"]) * _f32(b["scales"] >> _U8(4))
    return (dl[:, :, None] * _f32(q.reshape(n, 16, 16)) - ml[:, :, None]).reshape(n, 256)


def _scales_q3_k(s: np.ndarray) -> np.ndarray:
    """Twelve bytes -> sixteen 6-bit scales: the low 4 bits from bytes 0..7 (low then high nibbles),
    the high 2 bits from bytes 8..11 (scale 4g+k uses bits 2g..2g+1 of byte 8+k)."""
    n = len(s)
    low = _nibbles(s[:, :8])
    high = ((s[:, 8:12].reshape(n, 1, 4) >> _CRUMB_SHIFTS.reshape(1, 4, 1)) & _U8(3)).reshape(n, 16)
    return (low | (high << _U8(4))).astype(np.int8) - np.int8(32)


def _q3_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    low = (b["qs"].reshape(n, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1)) & _U8(3)
    # element 128*h + 32*j + l: hmask[l] bit 4h+j set means "no -4".
    high = (b["hmask"].reshape(n, 1, 1, 32) >> np.arange(8, dtype=_U8).reshape(1, 2, 4, 1)) & _U8(1)
    q = low.astype(np.int8) - ((high ^ _U8(1)) << _U8(2)).astype(np.int8)
    dl = _col(b["d"]) * _f32(_scales_q3_k(b["scales"]))
    return (dl[:, :, None] * _f32(q.reshape(n, 16, 16))).reshape(n, 256)


def _scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for all eight sub-blocks: 6-bit scales and mins packed into 12 bytes."""
    a, b, c = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([a & _U8(63), (c & _U8(0x0F)) | ((a >> _U8(6)) << _U8(4))], axis=-1)
    mn = np.concatenate([b & _U8(63), (c >> _U8(4)) | ((b >> _U8(6)) << _U8(4))], axis=-1)
    return sc, mn


def _k4_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 128) -> (n, 8, 32): sub-block 2c is the low nibbles of qs[32c:32c+32], 2c+1 the high ones."""
    n = len(qs)
    return ((qs.reshape(n, 4, 1, 32) >> _NIBBLE_SHIFTS.reshape(1, 1, 2, 1)) & _U8(0x0F)).reshape(n, 8, 32)


def _q4_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    sc, mn = _scale_min_k4(b["scales"])
    d = (_col(b["d"]) * _f32(sc))[:, :, None]
    m = (_col(b["dmin"]) * _f32(mn))[:, :, None]
    return (d * _f32(_k4_nibbles(b["qs"])) - m).reshape(n, 256)


def _q5_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    sc, mn = _scale_min_k4(b["scales"])
    d = (_col(b["d"]) * _f32(sc))[:, :, None]
    m = (_col(b["dmin"]) * _f32(mn))[:, :, None]
    high = (b["qh"].reshape(n, 1, 32) >> np.arange(8, dtype=_U8).reshape(1, 8, 1)) & _U8(1)
    q = _k4_nibbles(b["qs"]) | (high << _U8(4))
    return (d * _f32(q) - m).reshape(n, 256)


def _q6_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    # element 128*h + 32*j + l: low 4 bits from ql[64h + 32*(j%2) + l] (high nibble when j >= 2),
    # high 2 bits are bits 2j..2j+1 of qh[32h + l]; scales[e // 16] is its int8 scale.
    low = (b["ql"].reshape(n, 2, 1, 2, 32) >> _NIBBLE_SHIFTS.reshape(1, 1, 2, 1, 1)) & _U8(0x0F)
    high = (b["qh"].reshape(n, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1)) & _U8(3)
    q = (low.reshape(n, 2, 4, 32) | (high << _U8(4))).astype(np.int8) - np.int8(32)
    d = _col(b["d"]) * _f32(b["scales"])
    return (d[:, :, None] * _f32(q.reshape(n, 16, 16))).reshape(n, 256)


def _iq4_nl(b: np.ndarray) -> np.ndarray:
    return _f32(_KVALUES_IQ4NL[_nibbles(b["qs"])]) * _col(b["d"])


def _iq4_xs(b: np.ndarray) -> np.ndarray:
    n = len(b)
    low = (b["scales_l"].reshape(n, 4, 1) >> _NIBBLE_SHIFTS.reshape(1, 1, 2)).reshape(n, 8) & _U8(0x0F)
    high = ((b["scales_h"][:, None] >> np.arange(0, 16, 2, dtype=np.uint16)) & np.uint16(3)).astype(_U8)
    ls = (low | (high << _U8(4))).astype(np.int8) - np.int8(32)
    dl = (_col(b["d"]) * _f32(ls))[:, :, None]
    q = _nibbles(b["qs"].reshape(n, 8, 16))
    return (dl * _f32(_KVALUES_IQ4NL[q])).reshape(n, 256)


def _e8m0_half(e: np.ndarray) -> np.ndarray:
    """ggml_e8m0_to_fp32_half: 2**(e - 128) as float32 (subnormal for e < 2)."""
    e32 = e.astype(np.uint32)
    bits = np.where(e32 < 2, np.uint32(0x00200000) << e32, (e32 - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def _mxfp4(b: np.ndarray) -> np.ndarray:
    return _f32(_KVALUES_MXFP4[_nibbles(b["qs"])]) * _e8m0_half(b["e"])[:, None]


_DEQUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
    "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
    "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs, "MXFP4": _mxfp4,
}
#: Quantized ggml types that :meth:`GGUFFile.tensor` dequantizes to float32.
DEQUANTIZABLE: tuple[str, ...] = tuple(_DEQUANTIZERS)
# Dequantize this many output elements at a time, so temporaries stay a few MiB whatever the tensor.
_CHUNK_ELEMENTS = 1 << 20


def _dequantize(raw: np.ndarray, t: GGMLType) -> np.ndarray:
    """The bytes of whole ``t`` blocks (a contiguous 1-D uint8 array) as a flat float32 array."""
    fn, block = _DEQUANTIZERS[t.name], _BLOCKS[t.name]
    recs = raw.view(block)  # the caller validated that raw holds whole blocks
    out = np.empty((len(recs), t.block_size), np.float32)
    step = max(1, _CHUNK_ELEMENTS // t.block_size)
    # NaN/inf scales are data, not errors: propagate them silently like ggml does.
    with np.errstate(all="ignore"):
        for start in range(0, len(recs), step):
            out[start:start + step] = fn(recs[start:start + step])
    return out.reshape(-1)


# ---------------------------------------------------------------------------------------------
# The file

@dataclass(frozen=True)
class GGUFTensorInfo:
    """Where one tensor lives. ``dims`` are in GGUF/ggml order; ``shape`` is the NumPy shape (reversed)."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    type_name: str
    offset: int       # from the start of the data section, as stored in the file
    file_offset: int  # from the start of the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        return self.dims[::-1]

    @property
    def n_elements(self) -> int:
        return math.prod(self.dims)

    @property
    def quantized(self) -> bool:
        return GGML_TYPES[self.ggml_type].quantized


def _error(what: str, path: PathLike, fix: str, *, tensor: str | None = None, key: str | None = None,
           field: str | None = None, at: int | None = None) -> SerializationError:
    where = f"file {os.fspath(path)}"
    if key is not None:
        where += f", metadata key {key!r}"
    if tensor is not None:
        where += f", tensor {tensor!r}"
    if field is not None:
        where += f", field {field!r}"
    if at is not None:
        where += f", byte {at}"
    return SerializationError(what, where=where, fix=fix)


class GGUFFile:
    """A parsed, validated GGUF file whose tensor data is memory-mapped.

    ``metadata`` maps each key to a Python value: ``int``/``float``/``bool``/``str`` for scalars, a 1-D
    NumPy array for numeric and bool arrays, ``list[str]`` for string arrays and a ``list`` for arrays of
    arrays. ``metadata_types`` gives each key's GGUF type (``"uint32"``, ``"array[string]"`` ...).
    ``tensors`` maps names to :class:`GGUFTensorInfo`, in file order. Arrays returned by :meth:`raw` and
    :meth:`tensor` keep the memory map alive as long as they live.
    """

    def __init__(self, path: PathLike, *, version: int, alignment: int, data_offset: int,
                 metadata: dict[str, Any], metadata_types: dict[str, str],
                 tensors: dict[str, GGUFTensorInfo], mm: np.ndarray) -> None:
        self.path = os.fspath(path)
        self.version = version
        self.alignment = alignment
        self.data_offset = data_offset
        self.metadata = metadata
        self.metadata_types = metadata_types
        self.tensors = tensors
        self._mm = mm

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path!r}, version={self.version}, {len(self.metadata)} metadata keys, "
                f"{len(self.tensors)} tensors)")

    def _info(self, name: str) -> GGUFTensorInfo:
        info = self.tensors.get(name)
        if info is None:
            some = ", ".join(repr(n) for n in list(self.tensors)[:5])
            more = ", ..." if len(self.tensors) > 5 else ""
            raise _error(f"the file has no tensor named {name!r}", self.path,
                         f"use one of its {len(self.tensors)} tensor names ({some}{more})")
        return info

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes exactly as stored: a read-only, zero-copy 1-D uint8 view of the map."""
        info = self._info(name)
        view = self._mm[info.file_offset:info.file_offset + info.nbytes]
        if len(view) != info.nbytes:  # the file shrank after it was validated
            raise _error(f"the data is {len(view)} bytes, shorter than the {info.nbytes} bytes validated",
                         self.path, "the file changed while it was read; read it again", tensor=name)
        return view

    def tensor(self, name: str, dequantize: bool = True) -> np.ndarray:
        """The tensor in NumPy shape order (the reverse of the GGUF dims).

        Plain types: a read-only zero-copy view with the matching dtype (bf16 through ``ml_dtypes``).
        Quantized types: a new float32 array when ``dequantize`` (types in :data:`DEQUANTIZABLE`), else
        the raw blocks as a zero-copy uint8 view of shape ``shape[:-1] + (bytes per row,)``.
        """
        info = self._info(name)
        raw = self.raw(name)
        t = GGML_TYPES[info.ggml_type]
        shape = info.shape
        if not t.quantized:
            dtype = PLAIN_TYPES[t.name]
            arr = raw.view(dtype.np).reshape(shape)
            if not _LITTLE and dtype.itemsize > 1:  # files are little-endian; swap into a copy
                arr = arr.byteswap()
                arr.flags.writeable = False
            return arr
        if not dequantize:
            return raw.reshape(*shape[:-1], shape[-1] // t.block_size * t.type_size)
        if t.name not in _DEQUANTIZERS:
            raise _error(f"dequantizing ggml type {t.name} (id {t.id}) is not supported", self.path,
                         f"pass dequantize=False to get the raw blocks, or requantize the model to one of "
                         f"{', '.join(DEQUANTIZABLE)} or a float type", tensor=name)
        return _dequantize(raw, t).reshape(shape)

    def arrays(self, dequantize: bool = True) -> dict[str, np.ndarray]:
        """Every tensor, as :meth:`tensor` returns it, in file order."""
        return {name: self.tensor(name, dequantize) for name in self.tensors}


class _Cursor:
    """Bounds-checked little-endian reads from the start of the memory-mapped file."""

    def __init__(self, buf: memoryview, path: PathLike) -> None:
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.path = path
        self.ctx: dict[str, Any] = {}  # key= / tensor= for error messages

    def error(self, what: str, fix: str = _REWRITE, *, field: str | None = None,
              at: int | None = None) -> SerializationError:
        return _error(what, self.path, fix, field=field, at=self.pos if at is None else at, **self.ctx)

    def take(self, n: int, what: str) -> int:
        """Advance over ``n`` bytes holding ``what``; return where they start."""
        start = self.pos
        if n > self.size - start:
            raise self.error(f"the file ends at byte {self.size}, inside {what} ({n} bytes from byte "
                             f"{start})", _TRUNCATED, at=start)
        self.pos = start + n
        return start

    def unpack(self, st: struct.Struct, what: str) -> Any:
        return st.unpack_from(self.buf, self.take(st.size, what))[0]

    def u32(self, what: str) -> int:
        return self.unpack(_U32, what)

    def u64(self, what: str) -> int:
        return self.unpack(_U64, what)

    def string(self, what: str) -> str:
        start = self.pos
        n = self.u64(f"the length of {what}")
        begin = self.take(n, f"{what} ({n} bytes)")
        try:
            return str(self.buf[begin:begin + n], "utf-8")
        except UnicodeDecodeError as e:
            raise self.error(f"{what} is not valid UTF-8 (bad byte at offset {e.start} of the string)",
                             at=start) from None

    def need(self, count: int, min_size: int, what: str) -> None:
        """Refuse at once a count that cannot fit in the rest of the file (no loop over garbage counts)."""
        if count * min_size > self.size - self.pos:
            raise self.error(f"{what} is {count}, but the {self.size - self.pos} bytes left in the file can "
                             f"hold at most {(self.size - self.pos) // min_size}",
                             f"the count is corrupt or {_TRUNCATED}")


# Smallest encoding of one value of each type (used to bound counts before looping).
def _min_size(vtype: int) -> int:
    if vtype in _SCALAR_TYPES:
        return np.dtype(_SCALAR_TYPES[vtype][1]).itemsize
    return 8 if vtype == _STRING else 12  # an array: u32 type + u64 count


def _value_type(cur: _Cursor, what: str) -> int:
    at = cur.pos
    vtype = cur.u32(what)
    if vtype not in _VALUE_TYPE_NAMES:
        raise cur.error(f"{what} is {vtype}, which is not a GGUF value type (0..12)", at=at)
    return vtype


def _read_value(cur: _Cursor, vtype: int, depth: int = 0) -> tuple[Any, str]:
    """One value of ``vtype``; returns it and its type name."""
    if vtype == _STRING:
        return cur.string("the string value"), "string"
    if vtype == _ARRAY:
        if depth >= MAX_ARRAY_DEPTH:
            raise cur.error(f"arrays are nested more than {MAX_ARRAY_DEPTH} deep")
        etype = _value_type(cur, "the array element type")
        count = cur.u64("the array length")
        cur.need(count, _min_size(etype), "the array length")
        if etype in _SCALAR_TYPES:
            name, code = _SCALAR_TYPES[etype]
            dtype = np.dtype(code)
            start = cur.take(count * dtype.itemsize, f"an array of {count} {name} values")
            arr = np.frombuffer(cur.buf, dtype, count, start).astype(dtype.newbyteorder("="))
            if etype == _BOOL:
                arr = _check_bools(cur, arr, start)
            return arr, f"array[{name}]"
        if etype == _STRING:
            return _read_strings(cur, count), "array[string]"
        items: list[Any] = []
        sub = "array"
        for _ in range(count):
            item, sub = _read_value(cur, _ARRAY, depth + 1)
            items.append(item)
        if not items:  # an empty array of arrays says nothing about the inner element type
            sub = "array"
        return items, f"array[{sub}]"
    name = _SCALAR_TYPES[vtype][0]
    start = cur.pos
    value = cur.unpack(_SCALAR_STRUCTS[vtype], f"the {name} value")
    if vtype == _BOOL:
        value = bool(_check_bools(cur, np.array([value], np.uint8), start)[0])
    return value, name


def _read_strings(cur: _Cursor, count: int) -> list[str]:
    """An array of strings: the hot loop of tokenizer vocabularies (10^5 entries), kept lean.

    One pass finds and bounds-checks every string, then the whole run is copied out of the map once
    and decoded from bytes (slicing bytes is several times cheaper than slicing the map)."""
    buf, size, start = cur.buf, cur.size, cur.pos
    unpack = _U64.unpack_from
    spans: list[tuple[int, int]] = []
    pos = start
    for i in range(count):
        if size - pos < 8 or (n := unpack(buf, pos)[0]) > size - pos - 8:
            cur.pos = pos
            cur.string(f"string #{i} of the array")  # raises the precise truncation error
        spans.append((pos + 8 - start, n))
        pos += 8 + n
    blob = bytes(buf[start:pos])
    try:
        out = [blob[a:a + n].decode("utf-8") for a, n in spans]
    except UnicodeDecodeError:
        out = []  # find which string, for the error message
        for i, (a, _n) in enumerate(spans):
            cur.pos = start + a - 8
            out.append(cur.string(f"string #{i} of the array"))
    cur.pos = pos
    return out


def _check_bools(cur: _Cursor, arr: np.ndarray, at: int) -> np.ndarray:
    if arr.size and int(arr.max()) > 1:
        bad = int(np.flatnonzero(arr > 1)[0])
        raise cur.error(f"a bool holds the byte {int(arr[bad])}, not 0 or 1", at=at + bad)
    return arr.astype(bool)


def _sniff_legacy(magic: bytes) -> str | None:
    legacy = {b"lmgg": "GGML", b"fmgg": "GGMF", b"tjgg": "GGJT", b"algg": "GGLA"}.get(magic)
    if legacy is not None:
        return f"the file is in the legacy {legacy} format that came before GGUF"
    return None


def _parse_header(cur: _Cursor) -> tuple[int, dict[str, Any], dict[str, str], list[tuple], int]:
    path = cur.path
    magic = bytes(cur.buf[cur.take(4, "the 4-byte magic"):4])
    if magic != GGUF_MAGIC:
        legacy = _sniff_legacy(magic)
        if legacy:
            raise _error(legacy, path, "convert it to GGUF with llama.cpp's convert_llama_ggml_to_gguf.py",
                         at=0)
        raise _error(f"the file starts with {magic!r}, not the GGUF magic {GGUF_MAGIC!r}", path,
                     "this is not a GGUF file; pass a .gguf file (safetensors files have their own reader)",
                     at=0)
    version = cur.u32("the version")
    if version not in SUPPORTED_VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in (1, 2, 3):
            raise _error(f"the file is a big-endian GGUF v{swapped} file", path,
                         "only little-endian GGUF files are supported; convert the model again without "
                         "--bigendian", field="version", at=4)
        if version == 1:
            raise _error("GGUF version 1 (32-bit lengths, 2023) is not supported", path,
                         "convert the model again with a current llama.cpp to get GGUF v3", field="version",
                         at=4)
        raise _error(f"GGUF version {version} is not supported (supported: "
                     f"{', '.join(map(str, SUPPORTED_VERSIONS))})", path,
                     "the file is damaged or newer than this reader; convert it to GGUF v3",
                     field="version", at=4)
    n_tensors = cur.u64("the tensor count")
    n_kv = cur.u64("the metadata count")
    cur.need(n_kv, 8 + 4 + 1, "the metadata count")

    metadata: dict[str, Any] = {}
    types: dict[str, str] = {}
    for i in range(n_kv):
        at = cur.pos
        key = cur.string(f"metadata key #{i}")
        cur.ctx = {"key": key}
        if key in metadata:
            raise cur.error(f"metadata key #{i} repeats an earlier key", at=at)
        vtype = _value_type(cur, "the value type")
        metadata[key], types[key] = _read_value(cur, vtype)
        cur.ctx = {}

    cur.need(n_tensors, 8 + 4 + 4 + 8, "the tensor count")
    infos: list[tuple] = []
    seen: set[str] = set()
    for i in range(n_tensors):
        at = cur.pos
        name = cur.string(f"the name of tensor #{i}")
        cur.ctx = {"tensor": name}
        if name in seen:
            raise cur.error(f"tensor #{i} repeats the name of an earlier tensor", at=at)
        seen.add(name)
        n_dims = cur.u32("the number of dimensions")
        if n_dims > MAX_DIMS:
            raise cur.error(f"the tensor has {n_dims} dimensions; ggml allows at most {MAX_DIMS}",
                            field="n_dims", at=cur.pos - 4)
        dims = tuple(cur.u64(f"dimension {j}") for j in range(n_dims))
        type_at = cur.pos
        type_id = cur.u32("the ggml type")
        offset = cur.u64("the data offset")
        infos.append((name, dims, type_id, offset, at, type_at))
        cur.ctx = {}
    return version, metadata, types, infos, cur.pos


def _alignment(metadata: Mapping[str, Any], types: Mapping[str, str], path: PathLike) -> int:
    if ALIGNMENT_KEY not in metadata:
        return DEFAULT_ALIGNMENT
    value, vtype = metadata[ALIGNMENT_KEY], types[ALIGNMENT_KEY]
    # Like ggml and gguf-py: the GGUF specification makes it a uint32, and nothing else is accepted.
    if vtype != "uint32" or value <= 0 or value & (value - 1):
        raise _error(f"the alignment is {value!r} ({vtype}), not a uint32 power of two", path,
                     f"{ALIGNMENT_KEY} must be a uint32 power of two such as 32; {_REWRITE}",
                     key=ALIGNMENT_KEY)
    return value


def _layout_tensors(infos: list[tuple], data_offset: int, alignment: int, size: int,
                    path: PathLike) -> dict[str, GGUFTensorInfo]:
    tensors: dict[str, GGUFTensorInfo] = {}
    for name, dims, type_id, offset, at, type_at in infos:
        def err(what: str, fix: str = _REWRITE, field: str | None = None, where: int = at,
                _name: str = name) -> SerializationError:
            return _error(what, path, fix, tensor=_name, field=field, at=where)

        t = GGML_TYPES.get(type_id)
        if t is None:
            if type_id in _REMOVED_TYPES:
                raise err(f"the tensor has ggml type id {type_id} ({_REMOVED_TYPES[type_id]}), a type ggml "
                          "has removed", "convert or quantize the model again with a current llama.cpp",
                          "type", type_at)
            raise err(f"the tensor has ggml type id {type_id}, which is not a known ggml type", f"the file "
                      f"is damaged or needs a newer reader; known types: {', '.join(GGML_TYPES_BY_NAME)}",
                      "type", type_at)
        n = math.prod(dims)
        if n >= 1 << 63:
            raise err(f"dims {list(dims)} hold {n} elements, more than ggml's int64 limit", field="dims")
        # Zero-element tensors too: [0, 2**62, 2**62] holds nothing but no array can have that shape.
        # 8 bytes covers every view tensor() makes (plain dtypes, float32 dequantized, raw blocks).
        problem = shape_problem(dims, 8)
        if problem is not None:
            raise err(problem, field="dims")
        ne0 = dims[0] if dims else 1
        if ne0 % t.block_size:
            raise err(f"dimension 0 is {ne0}, not a multiple of the {t.name} block size {t.block_size}",
                      field="dims")
        nbytes = n // t.block_size * t.type_size
        if offset % alignment:
            raise err(f"the data offset {offset} is not a multiple of the alignment {alignment}",
                      f"tensor data must be aligned to {alignment} bytes; {_REWRITE}", "offset")
        begin = data_offset + offset
        end = begin + nbytes
        if end > size:
            raise err(f"tensor {name!r} ends at byte {end} but the file has {size} bytes "
                      f"(data offset {offset}, {nbytes} bytes of {t.name})",
                      f"the offset is corrupt or {_TRUNCATED}", "offset")
        tensors[name] = GGUFTensorInfo(name, dims, type_id, t.name, offset, begin, nbytes)

    prev: GGUFTensorInfo | None = None
    for info in sorted(tensors.values(), key=lambda i: (i.offset, i.nbytes, i.name)):
        if prev is not None and info.nbytes and info.offset < prev.offset + prev.nbytes:
            raise _error(f"bytes [{info.offset}, {info.offset + info.nbytes}) of the data section overlap "
                         f"tensor {prev.name!r}, which ends at {prev.offset + prev.nbytes}", path,
                         f"tensors must not share bytes; {_REWRITE}", tensor=info.name, field="offset")
        if info.nbytes:
            prev = info
    return tensors


def read_gguf(path: PathLike) -> GGUFFile:
    """Parse and validate a GGUF v2/v3 file; tensor data is memory-mapped, not read."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise _error(f"cannot open the file: {e.strerror or e}", path,
                     "check that the path exists and is a readable file") from None
    with f:
        size = os.fstat(f.fileno()).st_size
    if size == 0:
        raise _error("the file is empty", path, _TRUNCATED)
    try:
        mm = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise _error(f"cannot memory-map the file: {e}", path,
                     "check that the path is a regular file") from None
    size = len(mm)
    cur = _Cursor(mm.data, path)  # the array's bytes (a memoryview that keeps the map alive)
    version, metadata, types, infos, end = _parse_header(cur)
    alignment = _alignment(metadata, types, path)
    data_offset = -(-end // alignment) * alignment
    tensors = _layout_tensors(infos, data_offset, alignment, size, path)
    return GGUFFile(path, version=version, alignment=alignment, data_offset=data_offset, metadata=metadata,
                    metadata_types=types, tensors=tensors, mm=mm)
