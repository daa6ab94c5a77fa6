"""One entry point for weight files: :func:`load_weights` reads safetensors (and ``.rlx``) or GGUF.

The format is recognised by content first (the GGUF magic; a safetensors length prefix followed by a
JSON object), then by suffix (``.gguf``, ``.safetensors``, ``.rlx``), so a misnamed file still loads and
a damaged file gets its own reader's precise error. Formats RLX does not read (PyTorch pickles and zip
checkpoints, NumPy ``.npy``/``.npz``, HDF5 ...) are named in the error with how to convert them.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from ..errors import SerializationError
from .gguf import GGUF_MAGIC, read_gguf
from .safetensors import read_safetensors

PathLike = str | os.PathLike[str]

FORMATS = ("safetensors", "gguf")
_SUFFIXES = {".gguf": "gguf", ".safetensors": "safetensors", ".rlx": "safetensors"}
_CONVERT = "convert it to safetensors (safetensors.numpy.save_file / torch save_file) or GGUF"

# Leading bytes of formats we recognise but do not read -> what they are.
_FOREIGN: tuple[tuple[bytes, str], ...] = (
    (b"PK\x03\x04", "a zip archive (a PyTorch .pt/.bin checkpoint or a NumPy .npz)"),
    (b"\x93NUMPY", "a NumPy .npy array"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file (a Keras .h5 checkpoint?)"),
    (b"\x80", "a Python pickle (a PyTorch .bin/.pt checkpoint?)"),
    (b"lmgg", "a legacy GGML model (before GGUF)"),
    (b"tjgg", "a legacy GGJT model (before GGUF)"),
    (b"fmgg", "a legacy GGMF model (before GGUF)"),
)


def _error(what: str, path: PathLike, fix: str) -> SerializationError:
    return SerializationError(what, where=f"file {os.fspath(path)}", fix=fix)


def _looks_like_safetensors(head: bytes, size: int) -> bool:
    if len(head) < 9:
        return False
    (n,) = struct.unpack_from("<Q", head)
    return 0 < n <= size - 8 and head[8:9] == b"{"


def detect_format(path: PathLike) -> str:
    """``"safetensors"`` or ``"gguf"``, by content and then suffix; a SerializationError otherwise."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(16)
    except OSError as e:
        raise _error(f"cannot open the file: {e.strerror or e}", path,
                     "check that the path exists and is a readable file") from None
    if head[:4] == GGUF_MAGIC:
        return "gguf"
    if _looks_like_safetensors(head, size):
        return "safetensors"
    by_suffix = _SUFFIXES.get(Path(path).suffix.lower())
    if by_suffix is not None:
        return by_suffix  # its reader explains what is wrong with the content
    if size == 0:
        raise _error("the file is empty, so its format cannot be recognised", path,
                     "the file is truncated; download or write it again")
    for magic, what in _FOREIGN:
        if head.startswith(magic):
            raise _error(f"the file is {what}, which RLX does not read", path, _CONVERT)
    raise _error(f"the file format is not recognised (it starts with {head[:8]!r})", path,
                 f"RLX reads {' and '.join(FORMATS)} files (.safetensors, .rlx, .gguf); {_CONVERT}")


def load_weights(path: PathLike, *, format: str | None = None) -> dict[str, np.ndarray]:
    """Every tensor of a weight file, by name, as NumPy arrays in NumPy shape order.

    safetensors: read-only zero-copy views of a memory map (all its dtypes, as stored). GGUF: plain
    types (F32, F16, BF16, F64, I8..I64) as read-only zero-copy views; quantized types dequantized to
    new float32 arrays (a SerializationError names any quantized type that cannot be). ``format``
    (``"safetensors"`` or ``"gguf"``) skips detection.
    """
    fmt = format if format is not None else detect_format(path)
    if fmt == "safetensors":
        tensors, _ = read_safetensors(path, mmap=True)
        return tensors
    if fmt == "gguf":
        return read_gguf(path).arrays(dequantize=True)
    raise _error(f"format {fmt!r} is not one RLX reads", path, f"pass format= one of {list(FORMATS)} or None")
