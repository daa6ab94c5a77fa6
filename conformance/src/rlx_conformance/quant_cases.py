"""Conformance cases for the quantized ops (``rlx_core.quant``), by op name; part of
:data:`rlx_conformance.cases.GENERATORS`.

They cover what the integer rules are about: the ends of the int8/int32 ranges, zero points, rounding
ties, per-channel parameters, padding, strides, dilation, groups and depthwise, scalar and empty
tensors and non-contiguous inputs. Integer outputs are compared exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlx_core.plugin import DType

Shape = tuple[int, ...]


def _full(lo: int, hi: int) -> Callable[[np.random.Generator, Shape, DType], np.ndarray]:
    def make(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
        return rng.integers(lo, hi, size=shape, endpoint=True).astype(dt.np)
    return make


def _ends(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Half of the elements at the ends of the dtype's range, the rest uniform over it."""
    info = np.iinfo(dt.np)
    lo, hi = int(info.min), int(info.max)
    ends = np.array([lo, lo + 1, -1, 0, 1, hi - 1, hi] if lo < 0 else [0, 1, hi - 1, hi], np.int64)
    full = rng.integers(lo, hi, size=shape, endpoint=True)
    pick = rng.choice(ends, size=shape)
    return np.where(rng.random(shape) < 0.5, pick, full).astype(dt.np)


def _choice(values: Any) -> Callable[[np.random.Generator, Shape, DType], np.ndarray]:
    def make(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
        return rng.choice(np.asarray(values), size=shape).astype(dt.np)
    return make


def _uniform(lo: float, hi: float) -> Callable[[np.random.Generator, Shape, DType], np.ndarray]:
    def make(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
        return rng.uniform(lo, hi, size=shape).astype(dt.np)
    return make


def _ties(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """With scale 0.5: x / scale = k + 0.5 exactly (round half to even decides)."""
    k = rng.integers(-20, 20, size=shape)
    return ((k + 0.5) * 0.5).astype(dt.np)


def _with_inf(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    x = rng.uniform(-3.0, 3.0, size=shape)
    flat = x.reshape(-1)
    flat[: min(4, flat.size)] = [np.inf, -np.inf, 1e30, -1e30][: min(4, flat.size)]
    return rng.permutation(flat).reshape(shape).astype(dt.np)


def gen_quantize(c: Any) -> None:
    u = _uniform(-2.0, 2.0)
    c.add("basic", "basic", [("x", c.arr(u, (3, 4)))], {"scale": 0.02, "zero_point": 5})
    c.add("zp_min", "basic", [("x", c.arr(_uniform(0.0, 1.0), (2, 6)))],
          {"scale": 1.0 / 255.0, "zero_point": -128})
    c.add("ties", "basic", [("x", c.arr(_ties, (4, 5)))], {"scale": 0.5, "zero_point": 0})
    c.add("saturate", "large", [("x", c.arr(_uniform(-10.0, 10.0), (3, 4)))],
          {"scale": 0.02, "zero_point": -3})
    c.add("inf", "nan_inf", [("x", c.arr(_with_inf, (2, 5)))], {"scale": 0.1, "zero_point": 1})
    c.add("scalar", "scalar", [("x", c.arr(u, ()))], {"scale": 0.03})
    c.add("size0", "size0", [("x", c.arr(u, (0, 3)))], {"scale": 0.03})
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(u, (3, 4), nc=True))],
          {"scale": 0.015, "zero_point": -7})


def gen_dequantize(c: Any) -> None:
    f = _full(-128, 127)
    c.add("basic", "basic", [("x", c.arr(f, (3, 4)))], {"scale": 0.1, "zero_point": 7})
    c.add("overflow", "overflow", [("x", c.arr(_ends, (4, 5)))], {"scale": 0.0123, "zero_point": -128})
    c.add("zp_max", "overflow", [("x", c.arr(_ends, (2, 5)))], {"scale": 3.5, "zero_point": 127})
    c.add("scalar", "scalar", [("x", c.arr(f, ()))], {"scale": 0.25})
    c.add("size0", "size0", [("x", c.arr(f, (0, 4)))], {"scale": 0.25})
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(f, (3, 4), nc=True))], {"scale": 0.07})


def gen_matmul_i8(c: Any) -> None:
    f = _full(-128, 127)
    w = _full(-127, 127)
    b = _full(-5000, 5000)
    i32 = DType.I32

    def add(label: str, kind: str, xs: Shape, ws: Shape, zp: int = 0, xf: Any = f, wf: Any = w,
            nc: bool = False) -> None:
        c.add(label, kind, [("x", c.arr(xf, xs, nc=nc)), ("w", c.arr(wf, ws, nc=nc)),
                            ("bias", c.arr(b, (ws[0],), i32))], {"x_zero_point": zp})

    add("basic", "basic", (3, 5), (4, 5), zp=3)
    add("batched", "basic", (2, 3, 8), (6, 8), zp=-128)
    add("k_tail", "basic", (2, 7), (3, 7), zp=-5)  # K % 4 != 0: the SIMD tail
    add("vector", "basic", (9,), (4, 9), zp=1)
    add("overflow", "overflow", (4, 64), (5, 64), zp=-128, xf=_ends, wf=_ends)
    add("zp_max", "overflow", (3, 16), (2, 16), zp=127, xf=_ends, wf=_ends)
    add("size1", "size1", (1, 1), (1, 1), zp=2)
    add("size0", "size0", (0, 5), (3, 5))
    add("noncontiguous", "noncontiguous", (3, 6), (4, 6), zp=4, nc=True)


def gen_conv2d_i8(c: Any) -> None:
    f = _full(-128, 127)
    w = _full(-127, 127)
    b = _full(-3000, 3000)
    i32 = DType.I32
    for label, kind, sx, sw, attrs, xf in [
        ("basic", "basic", (1, 5, 5, 3), (4, 3, 3, 3), {"x_zero_point": 2}, f),
        ("padded", "basic", (1, 4, 4, 2), (3, 3, 3, 2), {"pads": (1, 1, 1, 1), "x_zero_point": -128}, f),
        ("strided", "basic", (2, 6, 5, 3), (2, 3, 3, 3), {"strides": (2, 2), "pads": (0, 1, 1, 0)}, f),
        ("dilated", "basic", (1, 7, 7, 2), (2, 3, 3, 2), {"dilations": (2, 2), "pads": (2, 2, 2, 2),
                                                          "x_zero_point": 5}, f),
        ("groups", "basic", (1, 5, 5, 4), (4, 3, 3, 2), {"groups": 2, "pads": (1, 1, 1, 1)}, f),
        ("depthwise", "basic", (1, 5, 4, 3), (3, 3, 3, 1), {"groups": 3, "pads": (1, 1, 1, 1),
                                                            "x_zero_point": -3}, f),
        ("depthwise_mult2", "basic", (2, 4, 4, 3), (6, 3, 3, 1), {"groups": 3, "strides": (2, 1),
                                                                  "pads": (1, 0, 1, 2)}, f),
        ("pointwise", "size1", (1, 3, 3, 8), (5, 1, 1, 8), {"x_zero_point": 1}, f),
        ("overflow", "overflow", (1, 4, 4, 6), (3, 3, 3, 6), {"pads": (1, 1, 1, 1), "x_zero_point": -128},
         _ends),
        ("size0", "size0", (0, 4, 4, 2), (2, 3, 3, 2), {}, f),
    ]:
        wf = _ends if kind == "overflow" else w
        c.add(label, kind, [("x", c.arr(xf, sx)), ("w", c.arr(wf, sw)), ("bias", c.arr(b, (sw[0],), i32))],
              attrs)
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(f, (1, 4, 5, 3), nc=True)),
                                             ("w", c.arr(w, (2, 3, 2, 3), nc=True)),
                                             ("bias", c.arr(b, (2,), i32))], {"x_zero_point": -1})


def _multipliers(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    return rng.integers(1 << 30, (1 << 31) - 1, size=shape, endpoint=True).astype(dt.np)


def gen_requantize(c: Any) -> None:
    acc = _full(-200000, 200000)
    m = _multipliers
    right = _full(-14, -6)
    for label, kind, sx, sm, attrs, xf, mf, sf in [
        ("basic", "basic", (3, 4), (), {"zero_point": 3}, acc, m, right),
        ("per_channel", "basic", (2, 3, 5), (5,), {"zero_point": -128}, acc, m, right),
        ("full", "basic", (3, 4), (3, 4), {}, acc, m, right),
        ("relu", "basic", (4, 6), (6,), {"zero_point": -20, "act_min": -20}, acc, m, right),
        ("clamp", "basic", (4, 6), (), {"act_min": -50, "act_max": 60}, acc, m, right),
        ("left_shift", "basic", (3, 5), (5,), {"zero_point": 1}, _full(-100, 100), m, _full(0, 3)),
        ("ties", "basic", (4, 8), (), {}, _full(-64, 64), _choice([1 << 30]), _choice([-5])),
        ("overflow", "overflow", (6, 7), (7,), {"zero_point": 5}, _ends, _ends, _full(-31, 31)),
        ("shift_ends", "overflow", (5, 8), (8,), {}, _ends, m, _choice([-31, -30, -1, 0, 1, 30, 31])),
        ("scalar", "scalar", (), (), {"zero_point": -1}, acc, m, right),
        ("size0", "size0", (0, 4), (4,), {}, acc, m, right),
    ]:
        c.add(label, kind, [("x", c.arr(xf, sx)), ("multiplier", c.arr(mf, sm)), ("shift", c.arr(sf, sm))],
              attrs)
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(acc, (3, 4), nc=True)),
                                             ("multiplier", c.arr(m, (3, 4), nc=True)),
                                             ("shift", c.arr(right, (3, 4), nc=True))], {"zero_point": 2})


def gen_softmax_i8(c: Any) -> None:
    f = _full(-128, 127)
    c.add("basic", "basic", [("x", c.arr(f, (3, 10)))], {"scale": 0.1})
    c.add("sharp", "basic", [("x", c.arr(f, (2, 7)))], {"scale": 0.5, "beta": 1.5})
    c.add("flat", "basic", [("x", c.arr(f, (2, 9)))], {"scale": 0.001})
    c.add("axis0", "negative_axis", [("x", c.arr(f, (5, 3)))], {"scale": 0.05, "axis": 0})
    c.add("axis_mid", "basic", [("x", c.arr(f, (2, 6, 3)))], {"scale": 0.08, "axis": 1})
    c.add("ties", "basic", [("x", c.arr(_choice([-3, 0, 4]), (4, 6)))], {"scale": 0.2})
    c.add("overflow", "overflow", [("x", c.arr(_ends, (4, 12)))], {"scale": 0.06})
    c.add("size1", "size1", [("x", c.arr(f, (3, 1)))], {"scale": 0.1})
    c.add("size0", "size0", [("x", c.arr(f, (0, 5)))], {"scale": 0.1})
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(f, (3, 8), nc=True))], {"scale": 0.04})
    c.add("long_row", "basic", [("x", c.arr(f, (1, 300)))], {"scale": 0.02})


def _gen_pool(c: Any) -> None:
    f = _full(-128, 127)
    for label, kind, shape, attrs, xf in [
        ("basic", "basic", (1, 4, 4, 3), {"kernel": (2, 2)}, f),
        ("batch2", "basic", (2, 5, 6, 2), {"kernel": (2, 3), "strides": (1, 2)}, f),
        ("padded", "basic", (1, 5, 5, 4), {"kernel": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}, f),
        ("asym_pads", "basic", (1, 4, 5, 1), {"kernel": (2, 3), "pads": (1, 0, 0, 2)}, f),
        ("overflow", "overflow", (2, 4, 4, 3), {"kernel": (2, 2), "pads": (1, 1, 0, 0)}, _ends),
        ("size1", "size1", (1, 1, 1, 5), {"kernel": (1, 1)}, f),
        ("size0", "size0", (0, 4, 4, 2), {"kernel": (2, 2)}, f),
    ]:
        c.add(label, kind, [("x", c.arr(xf, shape))], attrs)
    c.add("noncontiguous", "noncontiguous", [("x", c.arr(f, (1, 4, 4, 3), nc=True))], {"kernel": (2, 2)})


def gen_dequantize_int4(c: Any) -> None:
    f32 = DType.F32
    byte = _full(0, 255)
    sc = _uniform(0.001, 0.1)
    c.add("basic", "basic", [("packed", c.arr(byte, (4, 8))), ("scales", c.arr(sc, (4, 2), f32))],
          {"group_size": 8})
    c.add("one_group", "basic", [("packed", c.arr(byte, (3, 6))), ("scales", c.arr(sc, (3, 1), f32))],
          {"group_size": 12})
    c.add("group2", "size1", [("packed", c.arr(byte, (2, 3))), ("scales", c.arr(sc, (2, 3), f32))],
          {"group_size": 2})
    c.add("overflow", "overflow", [("packed", c.arr(_choice([0, 7, 8, 15, 0x78, 0x87, 0xF0, 0x0F, 255]),
                                                    (5, 4))), ("scales", c.arr(sc, (5, 1), f32))],
          {"group_size": 8})
    c.add("size0", "size0", [("packed", c.arr(byte, (0, 4))), ("scales", c.arr(sc, (0, 2), f32))],
          {"group_size": 4})


GENERATORS: dict[str, Callable[[Any], None]] = {
    "quantize": gen_quantize, "dequantize": gen_dequantize, "matmul_i8": gen_matmul_i8,
    "conv2d_i8": gen_conv2d_i8, "requantize": gen_requantize, "softmax_i8": gen_softmax_i8,
    "max_pool2d_i8": _gen_pool, "avg_pool2d_i8": _gen_pool, "dequantize_int4": gen_dequantize_int4,
}


__all__ = ["GENERATORS"]
