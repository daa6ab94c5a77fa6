"""Conformance cases for the exact primitives of ``rlx_core.ir.ops.exact`` (``mod`` on floats,
``bitcast``): the ``"ops2"`` family of :data:`rlx_conformance.cases.GENERATORS`. Few cases (every
plugin that claims them runs them), chosen where a shortcut goes wrong: remainders of large
quotients (``a - trunc(a/b)*b`` is off there), both signs, zeros, infinities and NaN for ``mod``;
the sign bit, infinities, a quiet NaN and subnormals for ``bitcast``. Results are exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_core.plugin import DType

Shape = tuple[int, ...]


def _mod_a(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Dividends: mixed signs over many magnitudes (large quotients), zeros and non-finite values."""
    mag = np.exp2(rng.uniform(-4, 14 if dt.itemsize <= 2 else 40, size=shape))  # f16 max is 65504
    x = np.where(rng.random(shape) < 0.5, -mag, mag)
    special = rng.choice(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 7.0, -7.0]), size=shape)
    return np.where(rng.random(shape) < 0.2, special, x).astype(dt.np)


def _mod_b(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Divisors: mixed signs, small magnitudes, a few zeros, infinities and NaN."""
    mag = np.exp2(rng.uniform(-3, 6, size=shape))
    x = np.where(rng.random(shape) < 0.5, -mag, mag)
    special = rng.choice(np.array([0.0, np.inf, -np.inf, np.nan, 2.0, -2.0, 3.0]), size=shape)
    return np.where(rng.random(shape) < 0.2, special, x).astype(dt.np)


#: The dtype of the same width each dtype is bitcast to in the cases.
_PARTNER = {DType.F16: DType.I16, DType.BF16: DType.I16, DType.F32: DType.I32, DType.F64: DType.I64,
            DType.I8: DType.U8, DType.U8: DType.I8, DType.I16: DType.F16, DType.I32: DType.F32,
            DType.I64: DType.F64, DType.U16: DType.I16, DType.U32: DType.F32, DType.U64: DType.I64,
            DType.BOOL: DType.U8}


def _bits(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Values whose bit patterns matter: signed zeros, infinities, a quiet NaN (it survives the
    reference's float64 round trip; a signalling NaN would not), subnormals, integer extremes."""
    if dt == DType.BOOL:
        return rng.random(shape) < 0.5
    if dt.is_float:
        tiny = float(np.finfo(np.float32).smallest_subnormal) if dt == DType.F32 else 1e-310
        special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.5,
                            tiny if dt in (DType.F32, DType.F64) else 2.0 ** -20])
        x = rng.standard_normal(shape) * 100
        return np.where(rng.random(shape) < 0.5, rng.choice(special, size=shape), x).astype(dt.np)
    info = np.iinfo(dt.np)
    full = rng.integers(int(info.min), int(info.max), size=shape, endpoint=True, dtype=dt.np)
    ends = np.array([info.min, -1 if info.min < 0 else 1, 0, info.max], dtype=dt.np)
    x = np.where(rng.random(shape) < 0.3, rng.choice(ends, size=shape), full).astype(dt.np)
    to = _PARTNER[dt]
    if to.is_float:
        # bit patterns of a NaN other than the quiet canonical one may not survive float64
        # round trips in the reference (a signalling NaN is quieted): keep them out
        f = x.view(to.np)
        x = np.where(np.isnan(f), np.zeros_like(x), x)
    return x


def gen_ops2(c: Any) -> None:
    if c.op == "mod":
        for mode in ("fmod", "floor"):
            c.add(f"{mode}_basic", "nan_inf", [("a", c.arr(_mod_a, (4, 6))), ("b", c.arr(_mod_b, (4, 6)))],
                  {"mode": mode})
            c.add(f"{mode}_broadcast", "broadcast",
                  [("a", c.arr(_mod_a, (2, 3, 4))), ("b", c.arr(_mod_b, (3, 1)))], {"mode": mode})
            c.add(f"{mode}_scalar", "scalar", [("a", c.arr(_mod_a, ())), ("b", c.arr(_mod_b, (5,)))],
                  {"mode": mode})
            c.add(f"{mode}_size0", "size0", [("a", c.arr(_mod_a, (0, 3))), ("b", c.arr(_mod_b, (1, 3)))],
                  {"mode": mode})
        return
    to = _PARTNER.get(c.dtype)
    if to is None:
        return
    attrs = {"to": to, "src": c.dtype}
    c.add("basic", "basic", [("x", c.arr(_bits, (3, 5)))], attrs)
    c.add("scalar", "scalar", [("x", c.arr(_bits, ()))], attrs)
    c.add("size0", "size0", [("x", c.arr(_bits, (0, 3)))], attrs)
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(_bits, (4, 3), nc=True))], attrs)


GENERATORS = {"ops2": gen_ops2}
