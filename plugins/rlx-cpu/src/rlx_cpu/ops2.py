"""rlx-cpu's kernels for the exact primitives of ``rlx_core.ir.ops.exact``: ``mod`` (NumPy's
``fmod``/``mod`` ufuncs, which are C's ``fmod`` and Python's ``%``, exact as the op's reference)
and ``bitcast`` (NumPy's ``.view``: the input's bytes reinterpreted, nothing computed). Claimed
like the other elementwise kernels (``plugin.factories``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import Attrs

from .kernels import Run


def k_mod(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    a, b = ins
    o = outs[0]
    fn = np.fmod if attrs.get("mode", "fmod") == "fmod" else np.mod

    def run() -> None:
        fn(a, b, out=o)
    return run


def k_bitcast(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray], attrs: Attrs) -> Run:
    x, o = ins[0], outs[0]

    def run() -> None:
        # a non-contiguous input cannot be viewed as another dtype: copy it to the output's
        # bytes first (same width, so the byte image is the same size)
        o.view(x.dtype)[...] = x
    return run


FACTORIES: dict[str, Any] = {"cpu.mod": k_mod, "cpu.bitcast": k_bitcast}
