"""A dependency-free reader/writer of the safetensors format.

Layout of a file::

    u64 little-endian N | N bytes of UTF-8 JSON header (may end in spaces) | byte buffer

The header maps each tensor name to ``{"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}``
(offsets relative to the start of the buffer) and may hold ``"__metadata__": {str: str}``. Tensors are
little-endian, C order, and together cover the buffer exactly: no holes, no overlaps, no trailing bytes
(the official implementation refuses those too, so files stay unambiguous and cannot be polyglots).

Reading validates everything in the header before touching tensor data, and every problem is raised as
a :class:`~rlx_core.errors.SerializationError` naming the file, the tensor and the field. Reading with
``mmap=True`` (the default) returns read-only arrays that view a shared memory map of the file: loading
costs no copy and pages are read on first use.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import struct
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..dtypes import DType
from ..errors import SerializationError
from .shapes import shape_problem

PathLike = str | os.PathLike[str]

#: safetensors dtype code -> RLX dtype. Only the types RLX has; others (F8_E8M0, F4 ...) are refused.
#: F8_E4M3 is float8_e4m3fn (as in PyTorch). The other low-precision RLX types (fnuz float8, float4,
#: int4/int2) have no safetensors code, so tensors of them are refused when saving (cast them first).
ST_DTYPES: Mapping[str, DType] = {
    "F16": DType.F16, "BF16": DType.BF16, "F32": DType.F32, "F64": DType.F64, "C64": DType.C64,
    "I8": DType.I8, "I16": DType.I16, "I32": DType.I32, "I64": DType.I64, "U8": DType.U8,
    "U16": DType.U16, "U32": DType.U32, "U64": DType.U64, "BOOL": DType.BOOL,
    "F8_E4M3": DType.F8E4M3FN, "F8_E5M2": DType.F8E5M2,
}
_ST_CODES: Mapping[DType, str] = {v: k for k, v in ST_DTYPES.items()}

METADATA_KEY = "__metadata__"
_FIELDS = ("dtype", "shape", "data_offsets")
# The data start is padded to this so every tensor (laid out largest itemsize first) is naturally
# aligned in a memory map, which NumPy and DLPack consumers need for fast, copy-free access.
_ALIGN = 8
_LITTLE = sys.byteorder == "little"


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class _Layout:
    entries: dict[str, _Entry]  # sorted by name
    metadata: dict[str, str]
    data_start: int  # absolute file offset of the byte buffer


class _JSONReject(ValueError):
    """Raised by our json hooks for input the json module accepts but safetensors does not."""


def _error(what: str, path: PathLike, fix: str, *, tensor: str | None = None,
           field: str | None = None) -> SerializationError:
    where = f"file {os.fspath(path)}"
    if tensor is not None:
        where += f", tensor {tensor!r}"
    if field is not None:
        where += f", field {field!r}"
    return SerializationError(what, where=where, fix=fix)


_REWRITE = "the file is damaged or was not written by a safetensors writer; write it again"


# ---------------------------------------------------------------------------------------------
# Reading

def _is_int(v: Any) -> bool:
    # JSON true/false decode to bool, a subclass of int: never accept them as sizes.
    return isinstance(v, int) and not isinstance(v, bool)


def _loads_strict(text: str) -> Any:
    """json.loads, refusing duplicate keys and the NaN/Infinity tokens that JSON does not define."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise _JSONReject(f"duplicate key {k!r}")
            out[k] = v
        return out

    def constant(token: str) -> Any:
        raise _JSONReject(f"non-standard JSON token {token!r}")

    return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)


def _read_layout(path: PathLike) -> _Layout:
    try:
        f = open(path, "rb")  # closed by the with below; only open's errors get this message
    except OSError as e:
        raise _error(f"cannot open the file: {e.strerror or e}", path,
                     "check that the path exists and is readable") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise _error(f"the file is {size} bytes long, too short for the 8-byte header length prefix",
                         path, f"the file is truncated or empty; {_REWRITE}")
        prefix = f.read(8)
        (n,) = struct.unpack("<Q", prefix)
        if n > size - 8:
            raise _error(f"the header length prefix says {n} bytes but only {size - 8} bytes follow it",
                         path, "the file is truncated or is not a safetensors file (a pickle/.bin "
                               f"checkpoint, for instance); {_REWRITE}")
        raw = f.read(n)
        if len(raw) != n:  # the file shrank while we read it
            raise _error(f"could read only {len(raw)} of the {n} header bytes", path,
                         "the file changed while it was read; read it again")
    return _parse_header(raw, path, buffer_len=size - 8 - n, data_start=8 + n)


def _parse_header(raw: bytes, path: PathLike, *, buffer_len: int, data_start: int) -> _Layout:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _error(f"the header is not valid UTF-8 (bad byte at header offset {e.start})", path,
                     _REWRITE) from None
    try:
        header = _loads_strict(text)
    except _JSONReject as e:
        raise _error(f"the header is not valid safetensors JSON: {e}", path, _REWRITE) from None
    except (ValueError, RecursionError) as e:
        if isinstance(e, json.JSONDecodeError):
            detail = f"{e.msg} at line {e.lineno} column {e.colno}"
        else:  # RecursionError from absurd nesting, or another decoder complaint
            detail = str(e) or type(e).__name__
        raise _error(f"the header is not valid JSON: {detail}", path, _REWRITE) from None
    if not isinstance(header, dict):
        raise _error(f"the header is a JSON {type(header).__name__}, not an object", path, _REWRITE)

    meta = header.pop(METADATA_KEY, None)
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise _error(f"metadata is a JSON {type(meta).__name__}, not an object", path,
                     "metadata must map strings to strings", field=METADATA_KEY)
    for k, v in meta.items():
        if not isinstance(v, str):
            raise _error(f"metadata value of {k!r} is a JSON {type(v).__name__}, not a string", path,
                         "metadata values must be strings (encode structured values as JSON text)",
                         field=f"{METADATA_KEY}.{k}")

    entries = {name: _parse_entry(name, header[name], path, buffer_len) for name in sorted(header)}
    _check_coverage(entries, path, buffer_len)
    return _Layout(entries, dict(meta), data_start)


def _parse_entry(name: str, spec: Any, path: PathLike, buffer_len: int) -> _Entry:
    def err(what: str, fix: str, field: str | None = None) -> SerializationError:
        return _error(what, path, fix, tensor=name, field=field)

    if not isinstance(spec, dict):
        raise err(f"the entry is a JSON {type(spec).__name__}, not an object",
                  'each tensor entry is {"dtype": ..., "shape": [...], "data_offsets": [begin, end]}')
    missing = [k for k in _FIELDS if k not in spec]
    if missing:
        raise err(f"the entry has no {missing[0]!r}", f"each tensor entry needs the fields {list(_FIELDS)}",
                  missing[0])
    unknown = sorted(set(spec) - set(_FIELDS))
    if unknown:
        raise err(f"the entry has an unknown field {unknown[0]!r}",
                  f"tensor entries have exactly the fields {list(_FIELDS)}", unknown[0])

    code = spec["dtype"]
    if not isinstance(code, str) or code not in ST_DTYPES:
        raise err(f"dtype {code!r} is not supported by RLX", f"use one of {sorted(ST_DTYPES)} "
                  "(convert the tensor before saving, e.g. F8/U16 types to F16/I32)", "dtype")
    dtype = ST_DTYPES[code]

    shape = spec["shape"]
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise err(f"shape {shape!r} is not a list of non-negative integers",
                  "a shape is a JSON list like [2, 3]; [] is a scalar", "shape")
    problem = shape_problem(shape, dtype.itemsize)
    if problem is not None:
        raise err(problem, "the header is damaged or not for this data; " + _REWRITE, "shape")

    offsets = spec["data_offsets"]
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets)):
        raise err(f"data_offsets {offsets!r} is not a pair of integers",
                  "data_offsets is [begin, end], byte offsets into the data buffer", "data_offsets")
    begin, end = offsets
    if not 0 <= begin <= end <= buffer_len:
        raise err(f"data_offsets [{begin}, {end}] are outside the {buffer_len}-byte data buffer",
                  f"need 0 <= begin <= end <= {buffer_len}; the file may be truncated", "data_offsets")
    want = math.prod(shape) * dtype.itemsize
    if end - begin != want:
        raise err(f"data_offsets [{begin}, {end}] span {end - begin} bytes but shape {shape} of {code} "
                  f"needs {want}", "the header and the data disagree; " + _REWRITE, "data_offsets")
    return _Entry(name, dtype, tuple(shape), begin, end)


def _check_coverage(entries: Mapping[str, _Entry], path: PathLike, buffer_len: int) -> None:
    """The tensors must tile the buffer exactly, as the safetensors specification requires."""
    pos, prev = 0, None
    for e in sorted(entries.values(), key=lambda e: (e.begin, e.end, e.name)):
        if e.begin < pos:
            raise _error(f"bytes [{e.begin}, {e.end}) overlap tensor {prev!r}, which ends at {pos}", path,
                         f"tensors must not share bytes; {_REWRITE}", tensor=e.name, field="data_offsets")
        if e.begin > pos:
            raise _error(f"bytes [{pos}, {e.begin}) before this tensor belong to no tensor", path,
                         f"tensors must cover the buffer without holes; {_REWRITE}", tensor=e.name,
                         field="data_offsets")
        pos, prev = e.end, e.name
    if pos != buffer_len:
        raise _error(f"the last {buffer_len - pos} bytes of the data buffer belong to no tensor", path,
                     f"the file has trailing data after the tensors; {_REWRITE}")


def read_safetensors_header(path: PathLike) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The validated header without reading tensor data: ``({name: {"dtype", "shape", "data_offsets"}},
    metadata)``, tensors sorted by name."""
    layout = _read_layout(path)
    header = {e.name: {"dtype": _ST_CODES[e.dtype], "shape": list(e.shape), "data_offsets": [e.begin, e.end]}
              for e in layout.entries.values()}
    return header, layout.metadata


def _check_bools(raw: np.ndarray, path: PathLike, name: str) -> None:
    # A bool byte other than 0/1 is undefined behaviour for NumPy and for backends: refuse it.
    if raw.size and int(raw.max()) > 1:
        raise _error("a BOOL tensor holds bytes other than 0 and 1", path,
                     "write booleans as 0/1 bytes; " + _REWRITE, tensor=name)


def read_safetensors(path: PathLike, *, mmap: bool = True) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read all tensors and the metadata. ``mmap=True``: read-only zero-copy views of a memory map of the
    file (the map lives as long as any array does); ``mmap=False``: ordinary, writable arrays."""
    layout = _read_layout(path)
    out: dict[str, np.ndarray] = {}
    if mmap:
        try:
            mm = np.memmap(path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:
            raise _error(f"cannot memory-map the file: {e}", path,
                         "pass mmap=False to read it into memory instead") from None
        for entry in layout.entries.values():
            raw = mm[layout.data_start + entry.begin: layout.data_start + entry.end]
            if len(raw) != entry.end - entry.begin:  # the file shrank between reading the header and mapping
                raise _error("the data is shorter than the header says", path, "read the file again",
                             tensor=entry.name)
            arr = raw.view(entry.dtype.np).reshape(entry.shape)
            if not _LITTLE and entry.dtype.itemsize > 1:  # files are little-endian; swap into a copy
                arr = arr.byteswap()
                arr.flags.writeable = False
            if entry.dtype is DType.BOOL:
                _check_bools(raw, path, entry.name)
            out[entry.name] = arr
        return out, layout.metadata

    with open(path, "rb") as f:
        for entry in layout.entries.values():
            arr = np.empty(entry.shape, dtype=entry.dtype.np)
            raw = arr.reshape(-1).view(np.uint8)
            if raw.size:
                f.seek(layout.data_start + entry.begin)
                got = f.readinto(raw.data)
                if got != raw.size:
                    raise _error(f"could read only {got} of {raw.size} bytes", path,
                                 "the file changed while it was read; read it again", tensor=entry.name)
            if not _LITTLE and entry.dtype.itemsize > 1:
                arr.byteswap(inplace=True)
            if entry.dtype is DType.BOOL:
                _check_bools(raw, path, entry.name)
            out[entry.name] = arr
    return out, layout.metadata


# ---------------------------------------------------------------------------------------------
# Writing

def _prepare(name: Any, value: Any, path: PathLike) -> tuple[DType, np.ndarray]:
    """Check one tensor and return it as a C-contiguous array of its native-order dtype."""
    if not isinstance(name, str) or not name:
        raise _error(f"tensor name {name!r} is not a non-empty string", path, "name tensors with strings")
    if name == METADATA_KEY:
        raise _error(f"{METADATA_KEY!r} is reserved for metadata", path, "rename the tensor", tensor=name)
    arr = np.asarray(value)
    # Non-native byte order (e.g. '>f4' from a big-endian file) is compared and converted as native.
    native = arr.dtype if arr.dtype.isnative else arr.dtype.newbyteorder("=")
    dtype = next((d for d in _ST_CODES if d.np == native), None)
    if dtype is None:
        raise _error(f"dtype {arr.dtype} is not supported", path,
                     f"cast to one of {[d.value for d in _ST_CODES]} before saving", tensor=name)
    # np.asarray (unlike ascontiguousarray) keeps 0-d arrays 0-d; it copies only when it must.
    arr = np.asarray(arr, dtype=native, order="C")
    if not _LITTLE and dtype.itemsize > 1:
        arr = arr.byteswap()
    return dtype, arr


def _atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write to a fresh temp file beside ``path`` and rename it over ``path``.

    Readers never see a half-written file, and arrays still memory-mapping the old file keep working
    (the old inode lives on until they are gone), so ``load`` then ``save`` to the same path is safe.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    try:
        while True:
            tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
            try:
                # Mode 0o666 through os.open honours the umask, so the file gets normal permissions
                # (tempfile would create it 0o600).
                fd = os.open(tmp, flags, 0o666)
                break
            except FileExistsError:
                continue
    except OSError as e:
        raise _error(f"cannot create a file in {path.parent}: {e.strerror or e}", path,
                     "check that the directory exists and is writable") from None
    try:
        with open(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise _error(f"cannot write the file: {e.strerror or e}", path,
                         "check free disk space and that the path is not a directory") from None
        raise
    with contextlib.suppress(OSError):  # make the rename durable; not possible on every platform
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def write_safetensors(path: PathLike, tensors: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` (and string ``metadata``) atomically.

    The header lists tensors sorted by name and is space-padded so the buffer starts 8-byte aligned.
    Data is laid out largest itemsize first (then by name), so every tensor is naturally aligned; the
    output is a deterministic function of the inputs. Big-endian and non-contiguous arrays are converted.
    """
    meta = dict(metadata or {})
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise _error(f"metadata item {k!r}: {type(v).__name__} is not a str -> str pair", path,
                         "metadata keys and values must be strings (encode structured values as JSON)",
                         field=METADATA_KEY)
    prepared = {name: _prepare(name, value, path) for name, value in tensors.items()}
    order = sorted(prepared, key=lambda n: (-prepared[n][0].itemsize, n))
    offsets: dict[str, tuple[int, int]] = {}
    pos = 0
    for name in order:
        n = prepared[name][1].nbytes
        offsets[name] = (pos, pos + n)
        pos += n

    header: dict[str, Any] = {METADATA_KEY: meta} if meta else {}
    for name in sorted(prepared):
        dtype, arr = prepared[name]
        header[name] = {"dtype": _ST_CODES[dtype], "shape": list(arr.shape),
                        "data_offsets": list(offsets[name])}
    try:
        hb = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates in a name or metadata string
        raise _error(f"a name or metadata string is not encodable as UTF-8: {e.reason}", path,
                     "use valid Unicode text") from None
    hb += b" " * (-(8 + len(hb)) % _ALIGN)

    def write(f: BinaryIO) -> None:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for name in order:
            arr = prepared[name][1]
            # A uint8 view exports a buffer for every dtype (bf16 itself cannot) and for 0-d/size-0.
            f.write(arr.reshape(-1).view(np.uint8).data)

    _atomic_write(Path(path), write)
