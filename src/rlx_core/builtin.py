"""The core's own contributions, delivered through the same hooks a plugin uses.

Decompositions: every op schema that has ``decompose`` (all HIR ops, some MIR ops).
Rewrites: precision and layout changes that are always legal when the backend lacks a variant.
"""

from __future__ import annotations

from typing import Any

from .dtypes import DType
from .hookspecs import hookimpl
from .ir.schema import REGISTRY
from .records import Decomposition, NodeVariant, Rewrite

PROVIDER = "rlx-core"
_HALF = (DType.F16, DType.BF16)
_NARROW_INT = (DType.I8, DType.I16, DType.U8)
#: Ops whose result modulo 2**bits does not depend on computing in a wider integer type.
_WRAP_SAFE = frozenset({"add", "sub", "mul", "neg", "abs", "sign", "maximum", "minimum", "reduce_sum",
                        "reduce_prod", "matmul", "cumsum", "equal", "not_equal", "less", "less_equal",
                        "greater", "greater_equal", "conv2d", "div"})


@hookimpl
def rlx_decompositions() -> list[Decomposition]:
    return [Decomposition(op=s.name, name=f"core.{s.name}", expand=s.decompose, provider=PROVIDER)
            for s in REGISTRY.schemas() if s.decompose is not None]


def _retype(dt: Any, frm: tuple[DType, ...], to: DType) -> Any:
    return to if isinstance(dt, DType) and dt in frm else dt


def _compute_in(frm: tuple[DType, ...], to: DType, b: Any, inputs: list[Any], v: NodeVariant) -> Any:
    """Cast ``frm`` operands to ``to``, run the op there, cast results back: casts wrap/round."""
    cast_in = [b.op("cast", x, to=to) if x.dtype in frm else x for x in inputs]
    attrs = {k: _retype(val, frm, to) for k, val in v.attrs.items()}
    outs = b.op(v.op, *cast_in, **attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return [b.op("cast", o, to=t.dtype) if o.dtype != t.dtype else o for o, t in zip(outs, v.out_types)]


def _has(v: NodeVariant, dts: tuple[DType, ...]) -> bool:
    return any(t.dtype in dts for t in v.in_types + v.out_types)


def _half_applies(v: NodeVariant) -> bool:
    return v.op != "cast" and _has(v, _HALF)


def _wide_applies(v: NodeVariant) -> bool:
    return v.op in _WRAP_SAFE and _has(v, _NARROW_INT)


def _broadcast_applies(v: NodeVariant) -> bool:
    schema = REGISTRY.get(v.op)
    return (schema.elementwise and len(v.in_types) >= 2
            and any(t.shape != v.out_types[0].shape for t in v.in_types))


def _materialize(b: Any, inputs: list[Any], v: NodeVariant) -> Any:
    shape = v.out_types[0].shape
    ins = [x if x.shape == shape else b.op("expand", x, shape=shape) for x in inputs]
    out = b.op(v.op, *ins, **dict(v.attrs))
    return [out]


@hookimpl
def rlx_rewrites() -> list[Rewrite]:
    return [
        Rewrite("compute_f16_in_f32", "f16/bf16 computed in f32 between casts (rounded once per op)",
                _half_applies, lambda b, ins, v: _compute_in(_HALF, DType.F32, b, ins, v), PROVIDER),
        Rewrite("widen_narrow_int", "i8/i16/u8 computed in i32, cast back (wraps identically)",
                _wide_applies, lambda b, ins, v: _compute_in(_NARROW_INT, DType.I32, b, ins, v),
                PROVIDER),
        Rewrite("materialize_broadcast", "broadcast operands expanded to the output shape first",
                _broadcast_applies, _materialize, PROVIDER),
    ]
