"""Give back the resident pages of read-only memory-mapped weights once they were read.

Why: a weight memory-mapped from its model file (safetensors, an ONNX model's external data) costs
no RSS until it is read; once a backend has packed it into its own layout, its pages would stay
resident for nothing: a second copy of the weights in the process's peak RSS (ResNet-18: 46 MB).
``MADV_DONTNEED`` on a read-only file mapping drops this process's mapping of those pages (they stay
in the page cache); a later read maps them again from the file, so nothing changes for readers.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

#: False: never give pages back (A/B runs; the weights then stay resident once read).
USE = True


def _read_only_map(a: Any) -> Any:
    """The ``mmap`` of a read-only ``np.memmap`` that ``a`` views, else None (anonymous memory must
    never be given back: MADV_DONTNEED would zero it)."""
    import numpy as np

    b = a
    while b is not None:
        if isinstance(b, np.memmap):
            mm = getattr(b, "_mmap", None)
            return mm if mm is not None and b.mode in ("r", "readonly") else None
        b = getattr(b, "base", None)
    return None


def release_file_pages(a: Any) -> int:
    """Drop the pages wholly inside ``a`` (a C-contiguous view of a read-only memory-mapped file)
    from this process's resident set; the bytes given back, 0 where ``a`` is anything else."""
    import numpy as np

    if not USE or not isinstance(a, np.ndarray) or not a.flags.c_contiguous or a.nbytes < mmap.PAGESIZE:
        return 0
    mm = _read_only_map(a)
    if mm is None or not hasattr(mm, "madvise"):
        return 0
    try:
        start = np.frombuffer(mm, np.uint8).ctypes.data
    except (TypeError, ValueError):  # a closed or empty map
        return 0
    page = mmap.PAGESIZE
    lo = -(-(a.ctypes.data - start) // page) * page
    hi = (a.ctypes.data + a.nbytes - start) // page * page
    if lo < 0 or hi <= lo or hi > len(mm):
        return 0
    try:
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    except OSError:
        return 0
    return hi - lo


def release_library_pages(path: str) -> int:
    """Drop the resident code pages of the loaded shared library ``path`` from this process's RSS;
    the bytes of mapping given back (0 off Linux, or where nothing qualifies).

    Why: loading a large C++ library runs static initialisers spread over all of its code, so
    oneDNN's dlopen leaves 18 MB of its 42 MB of machine code resident although an sgemm runs a
    few hundred kB of it. Only executable mappings with no private (copy-on-write) page are
    touched: their pages are clean copies of the file, mapped again from the page cache (a minor
    fault) when next executed, so nothing changes for the code but the peak and steady RSS.
    """
    if not USE:
        return 0
    try:
        want = os.path.realpath(path)
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    spans: list[tuple[int, int]] = []
    span: tuple[int, int] | None = None
    for line in lines:
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
            span = None
            if len(head) == 6 and head[1] == "r-xp" and head[5] == want:
                lo, _, hi = head[0].partition("-")
                span = (int(lo, 16), int(hi, 16))
        elif span is not None and line.startswith("Anonymous:"):
            if int(line.split()[1]) == 0:  # every resident page is the file's own
                spans.append(span)
            span = None
    if not spans:
        return 0
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return sum(hi - lo for lo, hi in spans if libc.madvise(lo, hi - lo, mmap.MADV_DONTNEED) == 0)
