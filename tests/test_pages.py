"""release_library_pages drops only the clean code pages of a loaded library, which keeps working."""

from __future__ import annotations

import ctypes
import os
import sys

import pytest

from rlx_core.pages import release_library_pages


def _code_rss_kb(path: str) -> int:
    want, total, inside = os.path.realpath(path), 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
                inside = len(head) == 6 and head[1] == "r-xp" and head[5] == want
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps is Linux's")
def test_library_code_pages_go_and_the_code_still_runs() -> None:
    import numpy as np

    libs = [p for p in (os.path.join(os.path.dirname(np.__file__), "_core"),) if os.path.isdir(p)]
    path = next(os.path.join(d, f) for d in libs for f in sorted(os.listdir(d))
                if f.startswith("_multiarray_umath") and f.endswith(".so"))
    before = _code_rss_kb(path)
    assert before > 0
    assert release_library_pages(path) > 0
    assert _code_rss_kb(path) < before
    a = np.arange(12.0).reshape(3, 4)  # the library's code maps back in from the page cache
    assert float((a @ a.T).sum()) == pytest.approx(float(np.einsum("ij,kj->", a, a)))
    libm = ctypes.CDLL("libm.so.6")
    libm.cos.restype, libm.cos.argtypes = ctypes.c_double, [ctypes.c_double]
    assert release_library_pages("/nonexistent/libx.so") == 0
    assert libm.cos(0.0) == 1.0
