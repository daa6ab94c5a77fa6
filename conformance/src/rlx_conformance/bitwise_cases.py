"""Conformance cases for the bitwise ops (``rlx_core.ir.ops.bitwise``): the ``"bitwise"`` family of
:data:`rlx_conformance.cases.GENERATORS`. Few cases on purpose (every plugin runs them): the ends of
each integer type's range with -1 and 0 (sign bits), broadcasting, a scalar and an empty tensor.
Results are integers, compared exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_core.plugin import DType

Shape = tuple[int, ...]


def _ends(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Half of the elements at the ends of the type's range (and -1, 0, 1), the rest uniform."""
    info = np.iinfo(dt.np)
    lo, hi = int(info.min), int(info.max)
    # in the dtype itself: u64's top half does not fit int64
    ends = np.array([lo, lo + 1, -1, 0, 1, hi - 1, hi] if lo < 0 else [0, 1, hi - 1, hi], dt.np)
    full = rng.integers(lo, hi, size=shape, endpoint=True, dtype=dt.np)
    pick = rng.choice(ends, size=shape)
    return np.where(rng.random(shape) < 0.5, pick, full).astype(dt.np)


def gen_bitwise(c: Any) -> None:
    if c.op == "bitwise_not":
        c.add("basic", "overflow", [("x", c.arr(_ends, (3, 5)))])
        c.add("scalar", "scalar", [("x", c.arr(_ends, ()))])
        c.add("size0", "size0", [("x", c.arr(_ends, (0, 3)))])
        return
    c.add("basic", "overflow", [("a", c.arr(_ends, (3, 5))), ("b", c.arr(_ends, (3, 5)))])
    c.add("broadcast", "broadcast", [("a", c.arr(_ends, (2, 3, 4))), ("b", c.arr(_ends, (3, 1)))])
    c.add("scalar", "scalar", [("a", c.arr(_ends, ())), ("b", c.arr(_ends, (4,)))])
    c.add("size0", "size0", [("a", c.arr(_ends, (0, 3))), ("b", c.arr(_ends, (1, 3)))])


GENERATORS = {"bitwise": gen_bitwise}
