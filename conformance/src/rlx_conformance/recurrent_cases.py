"""Conformance cases for the recurrent ops (``rlx_core.ir.ops.recurrent``: ``lstm_scan``,
``gru_scan``): the ``"recurrent"`` family of :data:`rlx_conformance.cases.GENERATORS`.

Sizes where a shortcut goes wrong: one step, one batch row and one hidden unit; hidden sizes that
are no multiple of a vector width (5, 17) next to one that is (8, 16); forward, reverse and
bidirectional (two directions in one node: the projection's column halves); the
optional operands (LSTM peepholes, the GRU candidate's recurrent bias) present and absent; both
GRU reset modes; a non-contiguous projection; pre-activations large enough to saturate the gates
(|x| up to 30: sigmoid and tanh at 0 and 1, where an ``exp`` without range reduction overflows);
NaN and +-Inf in the projection (NaN must reach every later step of its batch row only). Recurrent
weights are scaled by ``1/sqrt(H)``, as trained layers are, so the recurrence does not amplify
rounding errors (the tolerance is the op's own ``condition``: ``T*(H+24)`` roundings).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_core.plugin import DType

Shape = tuple[int, ...]


def _uniform(lo: float, hi: float) -> Any:
    def make(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
        return rng.uniform(lo, hi, size=shape).astype(dt.np)
    return make


def _weights(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Recurrent weights ``[D, G*H, H]`` with unit-variance rows over ``sqrt(H)``."""
    return (rng.standard_normal(shape) / np.sqrt(max(shape[-1], 1))).astype(dt.np)


def _special(rng: np.random.Generator, shape: Shape, dt: DType) -> np.ndarray:
    """Projections in [-2, 2] with a NaN, +Inf and -Inf in three different batch rows."""
    x = rng.uniform(-2, 2, size=shape)
    t, b, g = shape
    x[t // 2, 0, 0] = np.nan
    if b > 1:
        x[0, 1, g - 1] = np.inf
    if b > 2:
        x[t - 1, 2, g // 2] = -np.inf
    return x.astype(dt.np)


def gen_recurrent(c: Any) -> None:
    lstm = c.op == "lstm_scan"
    gates = 4 if lstm else 3

    def case(label: str, kind: str, t: int, b: int, h: int, attrs: dict[str, Any], *, extra: bool = False,
             xw: Any = None, nc: bool = False) -> None:
        nd = 2 if attrs.get("direction") == "bidirectional" else 1
        shape = (t, b, nd * gates * h)
        # nc: the projection as a transposed view of a [D*G*H, B, T] array
        ins = [("xw", _transposed(c, shape) if nc else c.arr(xw or _uniform(-2, 2), shape)),
               ("r", c.arr(_weights, (nd, gates * h, h))), ("h0", c.arr(_uniform(-1, 1), (nd, b, h)))]
        if lstm:
            ins.append(("c0", c.arr(_uniform(-1, 1), (nd, b, h))))
        if extra:
            ins.append(("p" if lstm else "rb", c.arr(_uniform(-0.5, 0.5), (nd, (3 if lstm else 1) * h))))
        c.add(label, kind, ins, attrs)

    base: dict[str, Any] = {} if lstm else {"linear_before_reset": False}
    lbr: dict[str, Any] = {} if lstm else {"linear_before_reset": True}
    bi = {"direction": "bidirectional"}
    case("basic", "basic", 5, 3, 8, base)
    case("one_step", "size1", 1, 1, 1, base, extra=True)
    case("reverse", "basic", 6, 2, 5, {**base, "direction": "reverse"}, extra=True)
    case("bidirectional", "basic", 4, 3, 17, {**lbr, **bi}, extra=True)
    case("vector_width", "basic", 3, 4, 16, {**lbr, "direction": "reverse"})
    case("optional_operand", "basic", 7, 2, 6, {**base, **bi})
    case("saturated", "large", 4, 2, 5, lbr, xw=_uniform(-30, 30))
    case("noncontiguous", "noncontiguous", 3, 2, 4, {**base, **bi}, nc=True)
    case("nan_inf", "nan_inf", 4, 3, 3, {**lbr, **bi}, extra=True, xw=_special)


def _transposed(c: Any, shape: Shape) -> Any:
    def make(rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(-2, 2, size=shape[::-1]).astype(c.dtype.np).T
    return make


GENERATORS = {"recurrent": gen_recurrent}
