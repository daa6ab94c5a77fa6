"""What the Hexagon generator claims: elementwise ops and fused chains that render as freestanding C
(f32, plus exact i32/i64/bool ops; no sin/cos/tanh/pow: no freestanding implementation), matmul,
reductions, softmax/log_softmax over the last axis, layer_norm, and data movement. Nothing runs in
place (the kernels take ``restrict`` pointers)."""

from __future__ import annotations

from typing import Any

from rlx_core.plugin import (
    FUSIBLE,
    DType,
    KernelClaim,
    NodeVariant,
    all_of,
    cstyle,
    elementwise_claims,
    fused_claim,
    normalize_axis,
    render_check,
    renders,
)

from .codegen import elementwise

D = DType
F32 = frozenset({D.F32})
FIB = frozenset({D.F32, D.I32, D.I64, D.BOOL})


def _static(v: NodeVariant) -> str | None:
    if any(not t.is_static for t in (*v.in_types, *v.out_types)):
        return "shapes must be static"
    return cstyle.fits(v)


def _last_axis(v: NodeVariant) -> str | None:
    t = v.in_types[0]
    if t.rank and normalize_axis(int(v.attrs["axis"]), t.rank) != t.rank - 1:  # type: ignore[arg-type]
        return "only the last axis (other axes run through the decomposition)"
    return _static(v)


def _render(program: str, ins: tuple[DType, ...], out: DType) -> Any:
    return elementwise(program, [(d, (4,)) for d in ins], (out, (4,)))


def claims() -> list[KernelClaim]:
    renderable = all_of(_static, renders(render_check(_render, "as Hexagon C", op_ok=cstyle.op_ok)))

    def claim(op: str, dtypes: frozenset[DType], **kw: Any) -> KernelClaim:
        kw.setdefault("predicate", _static)
        return KernelClaim(op, f"hexagon.{op}", dtypes=dtypes, **kw)

    out = elementwise_claims("hexagon.ew.", FIB, renderable, ops=tuple(sorted(FUSIBLE)), out_dtypes=FIB,
                             in_place=False)
    out += [
        fused_claim("hexagon.fused_elementwise", renderable, in_place=False,
                    constraint="f32/i32/i64/bool programs of claimed elementwise ops (shared C renderer)"),
        claim("matmul", F32, constraint="i-k-j loops, unit-stride inner loop over N (HVX)"),
        claim("softmax", F32, predicate=_last_axis, constraint="last axis"),
        claim("log_softmax", F32, predicate=_last_axis, constraint="last axis"),
        claim("layer_norm", F32, constraint="two-pass statistics per row"),
        claim("reduce_sum", F32), claim("reduce_mean", F32),
        claim("reduce_max", F32), claim("reduce_min", F32),
        claim("reshape", FIB), claim("transpose", FIB), claim("expand", FIB), claim("slice", FIB),
        claim("concat", FIB), claim("pad", FIB),
    ]
    return out
