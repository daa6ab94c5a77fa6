"""rlx-cpu's kernels for the bitwise MIR ops (``rlx_core.ir.ops.bitwise``): NumPy's integer ufuncs,
which are two's complement as the ops' references are. Claimed like the other elementwise kernels
(``plugin.factories``), for every integer dtype the schemas accept."""

from __future__ import annotations

from typing import Any

import numpy as np

from .kernels import ufunc1, ufunc2

FACTORIES: dict[str, Any] = {
    "cpu.bitwise_and": ufunc2(np.bitwise_and),
    "cpu.bitwise_or": ufunc2(np.bitwise_or),
    "cpu.bitwise_xor": ufunc2(np.bitwise_xor),
    "cpu.bitwise_not": ufunc1(np.invert),
}
