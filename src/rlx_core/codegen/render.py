"""Render a fused elementwise program (see :mod:`rlx_core.fusion`) as statements in a dialect.

One renderer, small per-dialect tables — the tinygrad ``cstyle`` idea. A backend wraps the
statements in its own kernel skeleton (index computation, buffer declarations, launch). Each op's
expression lives on its schema (``OpSchema.expr``, written against the :class:`Dialect` fields
below), so the renderer names no op; the expressions follow the MIR references (NaN-propagating
``maximum``/``minimum``, half-to-even ``round``, truncating float->int ``cast``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..dtypes import DType
from ..errors import IRError
from ..fusion import decode
from ..ir.schema import REGISTRY
from ..ir.types import TensorType

Expr = str
#: ``rule(op, args, in_types, out, attrs)``: a dialect's own expression for one op, or ``None``
Rule = Callable[[str, Sequence[Expr], Sequence[DType], DType, dict], Expr | None]


@dataclass(frozen=True)
class Dialect:
    name: str
    types: dict[DType, str]
    #: unary math function name for (op, dtype) -> name, e.g. ("exp", F32) -> "expf"
    math: Callable[[str, DType], str]
    statement: str = "{type} {name} = {expr};"
    ternary: str = "({c} ? {a} : {b})"
    logical: dict[str, str] = field(default_factory=lambda: {"and": "({a} && {b})", "or": "({a} || {b})",
                                                              "not": "(!{a})"})
    cast: str = "(({type})({x}))"
    true_false: tuple[str, str] = ("true", "false")
    #: how a float literal of a dtype is written
    literal: Callable[[float, DType], str] = lambda v, dt: repr(float(v))
    has_erf: bool = True
    #: how ``div`` with an integer result (i8/i16/i32/i64/u8) is written, with ``{a}`` and ``{b}``,
    #: e.g. ``"rlx_idiv({a}, {b})"`` for a helper giving the reference's semantics (zero divisor,
    #: ``MIN / -1``); ``None`` (the default): the C operator, ``({a} / {b})``, as for floats
    idiv: str | None = None
    #: per-op override consulted before the shared rules (see :data:`Rule`): returns the
    #: expression, or ``None`` to fall through to the shared rule; it may raise :class:`IRError` to
    #: refuse an op/dtype the target cannot compute. ``None`` (the default): shared rules only
    rule: Rule | None = None

    def ctype(self, dt: DType) -> str:
        try:
            return self.types[dt]
        except KeyError:
            raise IRError(f"dialect {self.name!r} has no type for {dt}",
                          fix="cast to a supported dtype before this kernel") from None


def _c_math(suffix_f32: bool) -> Callable[[str, DType], str]:
    def name(op: str, dt: DType) -> str:
        base = {"abs": "fabs", "round": "rint"}.get(op, op)
        return base + ("f" if suffix_f32 and dt is DType.F32 else "")
    return name


def _c_lit(v: float, dt: DType) -> str:
    s = repr(float(v))
    if s in ("inf", "-inf", "nan"):
        return {"inf": "INFINITY", "-inf": "(-INFINITY)", "nan": "NAN"}[s]
    return s + ("f" if dt is DType.F32 else "")


def _hlsl_lit(v: float, dt: DType) -> str:
    s = repr(float(v))
    bits = {"inf": "0x7f800000u", "-inf": "0xff800000u", "nan": "0x7fc00000u"}.get(s)
    return f"asfloat({bits})" if bits else s


_CTYPES = {DType.F32: "float", DType.F64: "double", DType.I32: "int", DType.I64: "long long",
           DType.I8: "signed char", DType.I16: "short", DType.U8: "unsigned char", DType.BOOL: "bool"}

DIALECTS: dict[str, Dialect] = {
    "c": Dialect("c", _CTYPES, _c_math(True), literal=_c_lit),
    "cuda": Dialect("cuda", {**_CTYPES, DType.F16: "half", DType.BF16: "__nv_bfloat16",
                             DType.I64: "long long"}, _c_math(True),
                    literal=_c_lit),
    "opencl": Dialect("opencl", {**_CTYPES, DType.I64: "long", DType.F16: "half"}, _c_math(False),
                      literal=_c_lit),
    "metal": Dialect("metal", {DType.F32: "float", DType.F16: "half", DType.I32: "int", DType.I64: "long",
                               DType.I16: "short", DType.I8: "char", DType.U8: "uchar", DType.BOOL: "bool"},
                     lambda op, dt: "metal::precise::" + {"abs": "fabs", "round": "rint"}.get(op, op),
                     literal=_c_lit, has_erf=False),
    "glsl": Dialect("glsl", {DType.F32: "float", DType.I32: "int", DType.BOOL: "bool"},
                    lambda op, dt: {"round": "roundEven"}.get(op, op), cast="{type}({x})",
                    has_erf=False, literal=lambda v, dt: repr(float(v))),
    # HLSL (Shader Model 5/6): C casts as constructors, round() is round-half-to-even, no inf/nan
    # literals (bit patterns instead), no erf (the polynomial); a backend adds its helpers on top.
    "hlsl": Dialect("hlsl", {DType.F32: "float", DType.I32: "int", DType.BOOL: "bool"},
                    lambda op, dt: op, cast="{type}({x})", has_erf=False, literal=_hlsl_lit),
    "wgsl": Dialect("wgsl", {DType.F32: "f32", DType.I32: "i32", DType.BOOL: "bool"},
                    lambda op, dt: op, statement="let {name}: {type} = {expr};",
                    ternary="select({b}, {a}, {c})", cast="{type}({x})", has_erf=False,
                    literal=lambda v, dt: repr(float(v))),
    "numba": Dialect("numba", {DType.F32: "np.float32", DType.F64: "np.float64", DType.I32: "np.int32",
                               DType.I64: "np.int64", DType.I8: "np.int8", DType.I16: "np.int16",
                               DType.U8: "np.uint8", DType.BOOL: "np.bool_"},
                     lambda op, dt: "math." + {"abs": "fabs", "round": "__round__"}.get(op, op),
                     statement="{name} = {expr}", ternary="({a} if {c} else {b})",
                     logical={"and": "({a} and {b})", "or": "({a} or {b})", "not": "(not {a})"},
                     cast="{type}({x})", true_false=("True", "False"),
                     literal=lambda v, dt: f"np.{'float32' if dt is DType.F32 else 'float64'}({float(v)!r})"),
}

def render_op(d: Dialect, op: str, args: Sequence[Expr], in_types: Sequence[DType], out: DType,
              attrs: dict) -> Expr:
    """``op`` as one expression in ``d``: the dialect's own :attr:`Dialect.rule` first, else the
    expression declared on the op's schema (``OpSchema.expr``; the core's are in
    :mod:`rlx_core.ir.ops.elementwise`)."""
    if d.rule is not None:
        own = d.rule(op, args, in_types, out, attrs)
        if own is not None:
            return own
    schema = REGISTRY.get(op, where=f"rendering a fused program for dialect {d.name!r}")
    if schema.expr is None:
        raise IRError(f"the renderer has no rule for op {op!r} in dialect {d.name!r}",
                      fix="leave this op out of fused groups for this backend")
    return schema.render(d, args, in_types, out, attrs)


#: Helpers a generated Numba module defines once (see rlx_cpu.fused).
NUMBA_PRELUDE = '''
@njit(inline="always", error_model="numpy")
def _erf_f32(x):
    # The float32 minimax rational fit used by Eigen and XLA: erf(x) = x P(x^2) / Q(x^2) on
    # [-4, 4] (erf rounds to +-1 beyond). Branch-free arithmetic, so the loop around it
    # vectorises (libm's double erf does not); max relative error 4.5e-7 over the f32 range.
    c = min(max(x, np.float32(-4.0)), np.float32(4.0))
    z = c * c
    p = np.float32(-2.72614225801306e-10)
    p = p * z + np.float32(2.77068142495902e-08)
    p = p * z + np.float32(-2.10102402082508e-06)
    p = p * z + np.float32(-5.69250639462346e-05)
    p = p * z + np.float32(-7.34990630326855e-04)
    p = p * z + np.float32(-2.95459980854025e-03)
    p = p * z + np.float32(-1.60960333262415e-02)
    q = np.float32(-1.45660718464996e-05)
    q = q * z + np.float32(-2.13374055278905e-04)
    q = q * z + np.float32(-1.68282697438203e-03)
    q = q * z + np.float32(-7.37332916720468e-03)
    q = q * z + np.float32(-1.42647390514189e-02)
    r = c * p / q
    return x if x != x else r
'''


def render_program(program: str, in_exprs: Sequence[Expr], in_dtypes: Sequence[DType],
                   dialect: str | Dialect, *, prefix: str = "t") -> tuple[list[str], Expr, DType]:
    """Statements computing a fused program from input expressions; returns (lines, result, dtype).

    ``dialect``: a name in :data:`DIALECTS`, or a :class:`Dialect` (typically a backend's
    ``dataclasses.replace`` of a shared one, with its own ``math``/``literal``/``idiv``/``rule``)."""
    d = dialect if isinstance(dialect, Dialect) else DIALECTS[dialect]
    ops, out = decode(program)
    env: dict[str, tuple[Expr, DType]] = {f"i{k}": (e, t)
                                          for k, (e, t) in enumerate(zip(in_exprs, in_dtypes))}
    lines = []
    for j, (op, args, attrs) in enumerate(ops):
        schema = REGISTRY.get(op)
        arg_types = [TensorType(env[x][1], ()) for x in args]
        out_dt = schema.infer(arg_types, schema.check_attrs(attrs, f"fused {op}"))[0].dtype
        expr = render_op(d, op, [env[x][0] for x in args], [env[x][1] for x in args], out_dt, attrs)
        name = f"{prefix}{j}"
        lines.append(d.statement.format(type=d.ctype(out_dt), name=name, expr=expr))
        env[f"t{j}"] = (name, out_dt)  # programs name results t<j>; the prefix is only the C name
    res, dt = env[out]
    return lines, res, dt
