"""The elementwise MIR ops: unary math, binary arithmetic, comparisons, logical ops, ``where``, ``cast``.

Each op is declared ONCE here with every fact the core knows about it: dtypes and inference, the
float64 reference, its C-style expression for fused kernels (:mod:`rlx_core.codegen.render`), its
reverse/forward autodiff rules, its AMP class, its fusion class, how the conformance suite feeds it
and its tolerance class. Adding an elementwise op is one call below plus a claim in each backend
that runs it natively; fusion, rendering, autodiff, autocast and conformance pick it up from here.

Semantics follow NumPy in float64: integer arithmetic wraps (two's complement), integer ``div``
truncates toward zero as C does, ``maximum``/``minimum`` propagate NaN, ``round`` is half-to-even,
float->int ``cast`` truncates. Expressions receive the dialect (``d``: its types, math names,
literals, ternary and cast forms), the argument expressions and the dtypes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...dtypes import ALL_DTYPES, FLOAT_DTYPES, DType
from ...errors import DTypeError
from ..schema import AttrSpec, CaseSpec, OpSchema, register_op
from ..types import Attrs, TensorType, attr_dtype, broadcast_shapes
from ._common import BOOL, FLOATS_C, NUMERIC_U, REAL_U, SIGNED, STORAGE, check_dtypes, same_dtype, wrap_int

Expr = str
#: ``unary expression(d, x, dtype)``
UnaryExpr = Callable[[Any, Expr, DType], Expr]
#: ``binary expression(d, a, b, in_dtype, out_dtype)``
BinaryExpr = Callable[[Any, Expr, Expr, DType, DType], Expr]
#: ``apply(b, v, x, y)``: the (co)tangent ``v`` times f'(x), given the output ``y`` (one rule
#: serves both modes, since a unary op's Jacobian is diagonal).
UnaryGrad = Callable[[Any, Any, Any, Any], Any]


# -- autodiff adapters ---------------------------------------------------------------------------
# Rules build MIR nodes with the graph builder they are given; the autodiff helpers are imported
# when a rule runs, so declaring an op does not import the autodiff package.

def _c(b: Any, value: float, like: Any) -> Any:
    return b.const(value, like.dtype)


def _zero_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    return [None] * len(ins)


def _zero_jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
    return [None] * len(outs)


#: ``grad=ZERO``: no gradient and no tangent (comparisons, logical ops, rounding).
ZERO = (_zero_vjp, _zero_jvp)


def _unary_grad(apply: UnaryGrad) -> tuple[Callable[..., list], Callable[..., list]]:
    def vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
        g = cts[0]
        if g is None or not ins[0].dtype.is_float:
            return [None]
        return [apply(b, g, ins[0], outs[0])]

    def jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
        t = ts[0]
        if t is None or not ins[0].dtype.is_float:
            return [None]
        return [apply(b, t, ins[0], outs[0])]

    return vjp, jvp


def _binary_grad(vjp_fn: Callable[..., tuple[Any, Any]], jvp_fn: Callable[..., Any]
                 ) -> tuple[Callable[..., list], Callable[..., list]]:
    """Broadcasting binary rules: cotangents are summed back to each operand's shape, tangents
    broadcast to the output's shape."""
    def vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
        from ...autodiff._util import sum_to

        g = cts[0]
        if g is None or not outs[0].dtype.is_float:
            return [None, None]
        a, c = ins
        ga, gc = vjp_fn(b, g, a, c, outs[0])
        return [None if ga is None else sum_to(b, ga, a.shape),
                None if gc is None else sum_to(b, gc, c.shape)]

    def jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
        from ...autodiff._util import expand_to

        if not outs[0].dtype.is_float or (ts[0] is None and ts[1] is None):
            return [None]
        t = jvp_fn(b, ts[0], ts[1], ins[0], ins[1], outs[0])
        return [None if t is None else expand_to(b, t, outs[0].shape)]

    return vjp, jvp


# -- declarations --------------------------------------------------------------------------------

def unary(name: str, ref: Callable[..., Any], dtypes: Sequence[DType], doc: str, *, expr: UnaryExpr,
          grad: UnaryGrad | tuple[Callable[..., list], Callable[..., list]] | None,
          amp: str | None = None, domain: str = "default", overflow: bool = False,
          accuracy: str | None = None, out_fn: Callable[[DType], DType] | None = None) -> OpSchema:
    """Declare and register a unary elementwise op ``y = f(x)`` (``grad``: ``apply(b, v, x, y)``,
    or :data:`ZERO`, or ``None`` for not differentiable)."""
    def infer(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        check_dtypes(name, ts, dtypes)
        return [TensorType(out_fn(ts[0].dtype) if out_fn else ts[0].dtype, ts[0].shape)]

    def render(d: Any, args: Sequence[Expr], in_dtypes: Sequence[DType], out: DType,
               attrs: Mapping[str, Any]) -> Expr:
        return expr(d, args[0], in_dtypes[0] if in_dtypes else out)

    vjp, jvp = (grad if isinstance(grad, tuple) else _unary_grad(grad)) if grad is not None else (None, None)
    return register_op(OpSchema(
        name, ("x",), infer, wrap_int(ref), category="elementwise", doc=doc, dtypes=tuple(dtypes),
        elementwise=True, fusion="elementwise", expr=render, vjp=vjp, jvp=jvp, amp=amp,
        accuracy=accuracy, cases=CaseSpec("unary", (domain,), overflow=overflow)))


def binary(name: str, ref: Callable[..., Any], dtypes: Sequence[DType], doc: str, *,
           expr: BinaryExpr, grad: tuple[Callable[..., Any], Callable[..., Any]] | None,
           out: DType | None = None, amp: str | None = None,
           domains: tuple[str, str] = ("default", "default"), accuracy: str | None = None) -> OpSchema:
    """Declare and register a broadcasting binary elementwise op (``grad``: ``(vjp_fn, jvp_fn)``
    with ``vjp_fn(b, g, a, c, y) -> (ga, gc)`` and ``jvp_fn(b, ta, tc, a, c, y)``, or :data:`ZERO`)."""
    def infer(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
        check_dtypes(name, ts, dtypes)
        dt = same_dtype(name, ts)
        return [TensorType(out or dt, broadcast_shapes(ts[0].shape, ts[1].shape))]

    def render(d: Any, args: Sequence[Expr], in_dtypes: Sequence[DType], out_dt: DType,
               attrs: Mapping[str, Any]) -> Expr:
        return expr(d, args[0], args[1], in_dtypes[0] if in_dtypes else out_dt, out_dt)

    vjp, jvp = (grad if grad is ZERO else _binary_grad(*grad)) if grad is not None else (None, None)
    return register_op(OpSchema(
        name, ("a", "b"), infer, wrap_int(ref), category="elementwise", doc=doc, dtypes=tuple(dtypes),
        elementwise=True, fusion="elementwise", expr=render, vjp=vjp, jvp=jvp, amp=amp,
        accuracy=accuracy, cases=CaseSpec("binary", domains)))


def _call(fn: str) -> UnaryExpr:
    """``fn(x)`` through the dialect's math-function names."""
    return lambda d, x, dt: f"{d.math(fn, dt)}({x})"


def _infix(op: str) -> BinaryExpr:
    return lambda d, a, b, dt, out: f"({a} {op} {b})"


def _erf_expr(d: Any, x: Expr, dt: DType) -> Expr:
    if not d.has_erf:
        return _erf_poly(d, x, dt)
    if d.name == "numba" and dt is DType.F32:
        return f"_erf_f32({x})"  # defined by the Numba module prelude (fast, f32-accurate)
    return f"{d.math('erf', dt)}({x})"


def _erf_poly(d: Any, x: Expr, dt: DType) -> Expr:
    """erf via Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7) for dialects without erf (f32 only)."""
    one = d.literal(1.0, dt)
    t = f"({one} / ({one} + {d.literal(0.3275911, dt)} * {d.math('abs', dt)}({x})))"
    poly = (f"((((({d.literal(1.061405429, dt)} * {t} + {d.literal(-1.453152027, dt)}) * {t} + "
            f"{d.literal(1.421413741, dt)}) * {t} + {d.literal(-0.284496736, dt)}) * {t} + "
            f"{d.literal(0.254829592, dt)}) * {t})")
    y = f"({one} - {poly} * {d.math('exp', dt)}(-({x}) * ({x})))"
    return d.ternary.format(c=f"({x} < {d.literal(0.0, dt)})", a=f"(-{y})", b=y)


def _sign_expr(d: Any, x: Expr, dt: DType) -> Expr:
    zero = d.literal(0.0, dt) if dt.is_float else "0"
    pos = d.cast.format(type=d.ctype(dt), x=f"({x} > {zero})")
    neg = d.cast.format(type=d.ctype(dt), x=f"({x} < {zero})")
    if dt.is_float:  # sign(NaN) is NaN, as in the reference
        return d.ternary.format(c=f"({x} != {x})", a=x, b=f"({pos} - {neg})")
    return f"({pos} - {neg})"


def _extreme_expr(cmp: str) -> BinaryExpr:
    def expr(d: Any, a: Expr, b: Expr, dt: DType, out: DType) -> Expr:
        # NaN propagates from either side, as the reference does.
        either = "or" if d.name == "numba" else "||"
        return d.ternary.format(c=f"({a} {cmp} {b} {either} {a} != {a})", a=a, b=b)
    return expr


_erf = np.vectorize(math.erf, otypes=[np.float64])

# -- unary ---------------------------------------------------------------------------------------

unary("neg", np.negative, SIGNED, "-x", expr=lambda d, x, dt: f"(-{x})",
      grad=lambda b, v, x, y: b.op("neg", v), accuracy="exact", overflow=True)
unary("abs", np.abs, SIGNED, "|x|; for c64 the result is f32",
      out_fn=lambda d: DType.F32 if d is DType.C64 else d,
      expr=lambda d, x, dt: f"abs({x})" if (d.name == "numba" or not dt.is_float)
      else f"{d.math('abs', dt)}({x})",
      grad=lambda b, v, x, y: v * b.op("sign", x), accuracy="exact", overflow=True)
unary("sign", np.sign, FLOAT_DTYPES + (DType.I8, DType.I16, DType.I32, DType.I64), "-1, 0 or 1",
      expr=_sign_expr, grad=ZERO, domain="ties", accuracy="exact", overflow=True)
unary("exp", np.exp, FLOATS_C, "e**x", expr=_call("exp"), grad=lambda b, v, x, y: v * y,
      amp="f32", accuracy="library")
unary("log", np.log, FLOATS_C, "natural log", expr=_call("log"), grad=lambda b, v, x, y: v / x,
      amp="f32", domain="positive", accuracy="library")
unary("sqrt", np.sqrt, FLOATS_C, "square root", expr=_call("sqrt"),
      grad=lambda b, v, x, y: (v * _c(b, 0.5, v)) / y, amp="f32", domain="positive")
unary("rsqrt", lambda x: 1.0 / np.sqrt(x), FLOAT_DTYPES, "1/sqrt(x)",
      expr=lambda d, x, dt: f"({d.literal(1.0, dt)} / {d.math('sqrt', dt)}({x}))",
      grad=lambda b, v, x, y: v * (y * y * y * _c(b, -0.5, v)), amp="f32", domain="positive",
      accuracy="library")
unary("reciprocal", lambda x: 1.0 / x, FLOATS_C, "1/x",
      expr=lambda d, x, dt: f"({d.literal(1.0, dt)} / {x})",
      grad=lambda b, v, x, y: b.op("neg", v * (y * y)), amp="f32", domain="nonzero")
unary("sin", np.sin, FLOATS_C, "sine", expr=_call("sin"), grad=lambda b, v, x, y: v * b.op("cos", x),
      accuracy="library")
unary("cos", np.cos, FLOATS_C, "cosine", expr=_call("cos"),
      grad=lambda b, v, x, y: b.op("neg", v * b.op("sin", x)), accuracy="library")
unary("tanh", np.tanh, FLOATS_C, "hyperbolic tangent", expr=_call("tanh"),
      grad=lambda b, v, x, y: v * (_c(b, 1.0, v) - y * y), accuracy="library")
unary("sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x)), FLOAT_DTYPES, "1/(1+e**-x)",
      expr=lambda d, x, dt: f"({d.literal(1.0, dt)} / ({d.literal(1.0, dt)} + {d.math('exp', dt)}(-{x})))",
      grad=lambda b, v, x, y: v * (y * (_c(b, 1.0, v) - y)), accuracy="library")
unary("erf", lambda x: _erf(x) if x.size else x.astype(np.float64), FLOAT_DTYPES, "Gauss error function",
      expr=_erf_expr, amp="f32", accuracy="library",
      grad=lambda b, v, x, y: v * (_c(b, 2.0 / math.sqrt(math.pi), v) * b.op("exp", b.op("neg", x * x))))
unary("floor", np.floor, FLOAT_DTYPES, "round toward -inf", expr=_call("floor"), grad=ZERO,
      domain="halves", accuracy="exact")
unary("ceil", np.ceil, FLOAT_DTYPES, "round toward +inf", expr=_call("ceil"), grad=ZERO,
      domain="halves", accuracy="exact")
unary("round", np.round, FLOAT_DTYPES, "round half to even",
      expr=lambda d, x, dt: f"np.rint({x})" if d.name == "numba" else f"{d.math('round', dt)}({x})",
      grad=ZERO, domain="halves", accuracy="exact")
unary("logical_not", np.logical_not, BOOL, "not x", expr=lambda d, x, dt: d.logical["not"].format(a=x),
      grad=ZERO, domain="bool", accuracy="exact")


# -- binary --------------------------------------------------------------------------------------

def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "u":  # truncation is floor here, and u64 does not fit i64 below
        with np.errstate(divide="ignore"):
            q = a // np.where(b == 0, 1, b)
        return np.where(b == 0, 0, q).astype(np.result_type(a, b))
    if a.dtype.kind in "iu":
        # C semantics (truncate toward zero), exact for every pair: a - fmod(a, b) is a multiple of b,
        # so the floor division is exact. (|a| // |b| overflowed for INT64_MIN.) A zero divisor gives 0.
        a64, b64 = a.astype(np.int64), b.astype(np.int64)
        with np.errstate(divide="ignore", over="ignore"):
            q = (a64 - np.fmod(a64, b64)) // np.where(b64 == 0, 1, b64)
        return np.where(b64 == 0, 0, q).astype(np.result_type(a, b))
    return a / b


def _div_expr(d: Any, a: Expr, b: Expr, dt: DType, out: DType) -> Expr:
    if d.idiv is not None and out.is_int:  # the dialect's helper for C-exact integer division
        return str(d.idiv.format(a=a, b=b))
    return f"({a} / {b})"


def _add_jvp(b: Any, ta: Any, tc: Any, a: Any, c: Any, y: Any) -> Any:
    if ta is None:
        return tc
    return ta if tc is None else ta + tc


def _sub_jvp(b: Any, ta: Any, tc: Any, a: Any, c: Any, y: Any) -> Any:
    if ta is None:
        return b.op("neg", tc)
    return ta if tc is None else ta - tc


def _mul_jvp(b: Any, ta: Any, tc: Any, a: Any, c: Any, y: Any) -> Any:
    parts = ([ta * c] if ta is not None else []) + ([a * tc] if tc is not None else [])
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]


def _div_jvp(b: Any, ta: Any, tc: Any, a: Any, c: Any, y: Any) -> Any:
    if tc is None:
        return ta / c
    num = b.op("neg", y * tc) if ta is None else ta - y * tc
    return num / c


def _pow_da(b: Any, a: Any, c: Any) -> Any:
    """d(a**c)/da = c * a**(c-1), and 0 where c == 0 (as torch, so 0**0 does not give 0*inf)."""
    d = c * b.op("pow", a, c - _c(b, 1.0, c))
    return b.op("where", b.op("equal", c, _c(b, 0.0, c)), _c(b, 0.0, c), d)


def _pow_dc(b: Any, a: Any, c: Any, y: Any) -> Any:
    """d(a**c)/dc = a**c * log(a), and 0 where a == 0 and c >= 0 (as torch)."""
    d = y * b.op("log", a)
    z = _c(b, 0.0, a)
    mask = b.op("logical_and", b.op("equal", a, z), b.op("greater_equal", c, z))
    return b.op("where", mask, z, d)


def _pow_jvp(b: Any, ta: Any, tc: Any, a: Any, c: Any, y: Any) -> Any:
    parts = ([ta * _pow_da(b, a, c)] if ta is not None else []) + \
            ([tc * _pow_dc(b, a, c, y)] if tc is not None else [])
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]


def _minmax(greater: str) -> tuple[Callable[..., tuple[Any, Any]], Callable[..., Any]]:
    """maximum (greater='greater') / minimum ('less'): the winner gets g, ties split it in half
    (as PyTorch)."""
    def vjp(b: Any, g: Any, a: Any, c: Any, y: Any) -> tuple[Any, Any]:
        z = _c(b, 0.0, g)
        half = g * _c(b, 0.5, g)
        tie = b.op("where", b.op("equal", a, c), half, z)
        return (b.op("where", b.op(greater, a, c), g, tie), b.op("where", b.op(greater, c, a), g, tie))

    def jvp(b: Any, ta: Any, tc: Any, a: Any, c: Any, y: Any) -> Any:
        from ...autodiff._util import zeros_like

        ta = ta if ta is not None else zeros_like(b, a)
        tc = tc if tc is not None else zeros_like(b, c)
        tie = (ta + tc) * _c(b, 0.5, y)
        return b.op("where", b.op(greater, a, c), ta, b.op("where", b.op(greater, c, a), tc, tie))

    return vjp, jvp


binary("add", np.add, NUMERIC_U, "a + b (integers wrap)", expr=_infix("+"),
       grad=(lambda b, g, a, c, y: (g, g), _add_jvp))
binary("sub", np.subtract, NUMERIC_U, "a - b (integers wrap)", expr=_infix("-"),
       grad=(lambda b, g, a, c, y: (g, b.op("neg", g)), _sub_jvp))
binary("mul", np.multiply, NUMERIC_U, "a * b (integers wrap)", expr=_infix("*"),
       grad=(lambda b, g, a, c, y: (g * c, g * a), _mul_jvp))
binary("div", _int_div, NUMERIC_U, "a / b; integers truncate toward zero", expr=_div_expr,
       grad=(lambda b, g, a, c, y: (g / c, b.op("neg", g * y / c)), _div_jvp),
       amp="f32", domains=("default", "nonzero"))
binary("pow", np.power, FLOATS_C, "a ** b",
       expr=lambda d, a, b, dt, out: (f"({a} ** {b})" if d.name == "numba"
                                      else f"{d.math('pow', dt)}({a}, {b})"),
       grad=(lambda b, g, a, c, y: (g * _pow_da(b, a, c), g * _pow_dc(b, a, c, y)), _pow_jvp),
       amp="f32", domains=("positive", "default"), accuracy="library")
binary("maximum", np.maximum, REAL_U, "max(a, b); NaN propagates", expr=_extreme_expr(">"),
       grad=_minmax("greater"), accuracy="exact")
binary("minimum", np.minimum, REAL_U, "min(a, b); NaN propagates", expr=_extreme_expr("<"),
       grad=_minmax("less"), accuracy="exact")
binary("logical_and", np.logical_and, BOOL, "a and b",
       expr=lambda d, a, b, dt, out: d.logical["and"].format(a=a, b=b), grad=ZERO, accuracy="exact")
binary("logical_or", np.logical_or, BOOL, "a or b",
       expr=lambda d, a, b, dt, out: d.logical["or"].format(a=a, b=b), grad=ZERO, accuracy="exact")
binary("logical_xor", np.logical_xor, BOOL, "a xor b", expr=_infix("!="), grad=ZERO, accuracy="exact")
for _name, _fn, _dtypes, _sym in (("equal", np.equal, ALL_DTYPES, "=="),
                                  ("not_equal", np.not_equal, ALL_DTYPES, "!="),
                                  ("less", np.less, REAL_U, "<"), ("less_equal", np.less_equal, REAL_U, "<="),
                                  ("greater", np.greater, REAL_U, ">"),
                                  ("greater_equal", np.greater_equal, REAL_U, ">=")):
    binary(_name, _fn, _dtypes, f"a {_sym} b", out=DType.BOOL, expr=_infix(_sym), grad=ZERO,
           domains=("ties", "ties"), accuracy="exact")


# -- where and cast ------------------------------------------------------------------------------

def _infer_where(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    if ts[0].dtype is not DType.BOOL:
        raise DTypeError(f"where: condition must be bool, got {ts[0].dtype}",
                         fix="compare first (e.g. greater) to get a bool mask")
    dt = same_dtype("where", ts[1:])
    return [TensorType(dt, broadcast_shapes(ts[0].shape, ts[1].shape, ts[2].shape))]


def _where_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    from ...autodiff._util import sum_to

    g = cts[0]
    cond, a, c = ins
    if g is None or not outs[0].dtype.is_float:
        return [None, None, None]
    z = _c(b, 0.0, g)
    return [None, sum_to(b, b.op("where", cond, g, z), a.shape),
            sum_to(b, b.op("where", cond, z, g), c.shape)]


def _where_jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
    from ...autodiff._util import expand_to

    _, ta, tc = ts
    if not outs[0].dtype.is_float or (ta is None and tc is None):
        return [None]
    z = _c(b, 0.0, outs[0])
    t = b.op("where", ins[0], ta if ta is not None else z, tc if tc is not None else z)
    return [expand_to(b, t, outs[0].shape)]


register_op(OpSchema("where", ("cond", "a", "b"), _infer_where,
                     wrap_int(lambda c, a, b: np.where(c, a, b)), category="elementwise",
                     doc="cond ? a : b", elementwise=True, fusion="elementwise",
                     expr=lambda d, args, in_dtypes, out, attrs: d.ternary.format(
                         c=args[0], a=args[1], b=args[2]),
                     vjp=_where_vjp, jvp=_where_jvp, cases=CaseSpec("where"), accuracy="exact",
                     dtypes=STORAGE))


def _infer_cast(ts: Sequence[TensorType], attrs: Attrs) -> list[TensorType]:
    return [TensorType(attr_dtype(attrs, "to"), ts[0].shape)]


def _ref_cast(xs: Sequence[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    to: DType = attrs["to"]  # type: ignore[assignment]
    x = xs[0]
    with np.errstate(all="ignore"):
        if to.is_int and x.dtype.kind == "f":
            x = np.trunc(x)
        if to is DType.BOOL:
            return [x != 0]
        if x.dtype.kind == "c" and not to.is_complex:
            x = x.real
        return [x.astype(to.np)]


def _cast_expr(d: Any, args: Sequence[Expr], in_dtypes: Sequence[DType], out: DType,
               attrs: Mapping[str, Any]) -> Expr:
    dt = in_dtypes[0] if in_dtypes else out
    if out is DType.BOOL:
        return f"({args[0]} != {d.literal(0.0, dt) if dt.is_float else '0'})"
    return str(d.cast.format(type=d.ctype(out), x=args[0]))


def _cast_vjp(b: Any, ins: Sequence[Any], outs: Sequence[Any], cts: Sequence[Any], attrs: Attrs) -> list:
    g = cts[0]
    if g is None or not (ins[0].dtype.is_float and outs[0].dtype.is_float):
        return [None]
    return [g if g.dtype == ins[0].dtype else b.op("cast", g, to=ins[0].dtype)]


def _cast_jvp(b: Any, ins: Sequence[Any], outs: Sequence[Any], ts: Sequence[Any], attrs: Attrs) -> list:
    t = ts[0]
    if t is None or not (ins[0].dtype.is_float and outs[0].dtype.is_float):
        return [None]
    return [t if t.dtype == outs[0].dtype else b.op("cast", t, to=outs[0].dtype)]


register_op(OpSchema("cast", ("x",), _infer_cast, _ref_cast,
                     attrs=(AttrSpec("to", "dtype", doc="target dtype, e.g. to='f32'"),),
                     category="elementwise", elementwise=True, fusion="elementwise", expr=_cast_expr,
                     vjp=_cast_vjp, jvp=_cast_jvp, cases=CaseSpec("cast"), dtypes=STORAGE,
                     doc="convert dtype; float->int truncates toward zero, ->bool is x != 0, "
                         "complex->real drops the imaginary part; to a float8/float4 type rounds to "
                         "nearest even, overflow gives Inf or NaN where the type has them (ONNX "
                         "Cast with saturate=0; saturate=1 is a clip first), to int4/int2 wraps"))
