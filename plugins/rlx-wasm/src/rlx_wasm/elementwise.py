"""Elementwise kernels: one MIR op or a fused chain, with NumPy broadcasting, in SIMD128 or scalar code.

A kernel is a small *program* (``fused_elementwise``'s op list; a single node is a program of one
op). Loads, every intermediate and the store go through typed locals. Dims are collapsed first
(adjacent dims whose strides chain merge, size-1 dims vanish), so a same-shape op is one flat
loop. The innermost loop runs four lanes at a time (``f32x4``) when every value is f32, every op
has a vector form and every operand is contiguous or broadcast along it; otherwise it is scalar.
Operands broadcast along the inner dim are loaded once per row.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlx_core.plugin import REGISTRY, DType, TensorType

from . import mathlib
from .wat import Func, ModuleBuilder, f32, f64, get, i32, i64, mem

D = DType


@dataclass(frozen=True)
class Repr:
    """How a dtype lives in a wasm local and in memory."""

    vt: str
    load: str
    store: str
    size: int


REPR: dict[DType, Repr] = {
    D.BOOL: Repr("i32", "i32.load8_u", "i32.store8", 1),
    D.U8: Repr("i32", "i32.load8_u", "i32.store8", 1),
    D.I8: Repr("i32", "i32.load8_s", "i32.store8", 1),
    D.I16: Repr("i32", "i32.load16_s", "i32.store16", 2),
    D.F16: Repr("i32", "i32.load16_u", "i32.store16", 2),
    D.BF16: Repr("i32", "i32.load16_u", "i32.store16", 2),
    D.I32: Repr("i32", "i32.load", "i32.store", 4),
    D.F32: Repr("f32", "f32.load", "f32.store", 4),
    D.I64: Repr("i64", "i64.load", "i64.store", 8),
    D.F64: Repr("f64", "f64.load", "f64.store", 8),
    D.C64: Repr("i64", "i64.load", "i64.store", 8),
}

FLOATS = frozenset({D.F32, D.F64})
I32_CLASS = frozenset({D.I32, D.I16, D.I8, D.U8, D.BOOL})
INTS = frozenset({D.I32, D.I64, D.I16, D.I8, D.U8})
SIGNED_INTS = frozenset({D.I32, D.I64, D.I16, D.I8})
CASTABLE = frozenset({D.BOOL, D.U8, D.I8, D.I16, D.I32, D.I64, D.F16, D.BF16, D.F32, D.F64})
LIBRARY_OPS = ("exp", "log", "tanh", "sigmoid", "erf")
COMPARE = ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")

#: op -> input dtypes run natively (the operand dtype; comparisons/where produce other dtypes).
SUPPORTED: dict[str, frozenset[DType]] = {
    "neg": FLOATS | SIGNED_INTS, "abs": FLOATS | SIGNED_INTS, "sign": FLOATS | SIGNED_INTS,
    **{op: frozenset({D.F32}) for op in LIBRARY_OPS},
    **{op: FLOATS for op in ("sqrt", "rsqrt", "reciprocal", "floor", "ceil", "round")},
    "logical_not": frozenset({D.BOOL}),
    **{op: FLOATS | INTS for op in ("add", "sub", "mul", "div", "maximum", "minimum")},
    **{op: frozenset({D.BOOL}) for op in ("logical_and", "logical_or", "logical_xor")},
    **{op: FLOATS | INTS for op in ("less", "less_equal", "greater", "greater_equal")},
    "equal": FLOATS | INTS | {D.BOOL}, "not_equal": FLOATS | INTS | {D.BOOL},
    "where": frozenset(REPR), "cast": CASTABLE,
}
#: Ops with an f32x4 form (every value of the kernel must be f32 for the vector path).
SIMD_OPS = frozenset({"add", "sub", "mul", "div", "maximum", "minimum", "neg", "abs", "sqrt", "rsqrt",
                      "reciprocal", "floor", "ceil", "round", "sign", *LIBRARY_OPS})

_CMP = {"equal": "eq", "not_equal": "ne", "less": "lt", "less_equal": "le", "greater": "gt",
        "greater_equal": "ge"}


def supported(op: str, in_dtypes: Sequence[DType], out_dtype: DType) -> str | None:
    """``None`` if this backend runs the elementwise op on these dtypes, else why not."""
    ok = SUPPORTED.get(op)
    if ok is None:
        return f"no wasm kernel for {op!r}"
    data = list(in_dtypes[1:]) if op == "where" else list(in_dtypes)
    if op == "where" and in_dtypes and in_dtypes[0] is not D.BOOL:
        return "where needs a bool condition"
    bad = sorted({d.value for d in data if d not in ok})
    if bad:
        return f"{op} runs on {', '.join(sorted(d.value for d in ok))}; got {', '.join(bad)}"
    if op == "cast" and out_dtype not in CASTABLE:
        return f"cast to {out_dtype} is not supported"
    return None


def decode_program(program: str) -> list[tuple[str, list[str], dict[str, Any]]]:
    from rlx_core.plugin import decode_fused as decode

    ops, out = decode(program)
    if out != f"t{len(ops) - 1}":
        # Keep the result last so the kernel stores the final temporary.
        raise ValueError(f"fused program output {out} is not its last op")
    return ops


Program = list[tuple[str, list[str], dict[str, Any]]]


def program_dtypes(ops: Program, in_dtypes: Sequence[DType]) -> list[DType]:
    """The dtype of every temporary ``t<j>`` (through the op schemas' inference)."""
    env = {f"i{k}": d for k, d in enumerate(in_dtypes)}
    out = []
    for j, (op, args, attrs) in enumerate(ops):
        schema = REGISTRY.get(op)
        ts = [TensorType(env[a], ()) for a in args]
        dt = schema.infer(ts, schema.check_attrs(attrs, f"wasm elementwise {op}"))[0].dtype
        env[f"t{j}"] = dt
        out.append(dt)
    return out


def fused_supported(program: str, in_dtypes: Sequence[DType]) -> str | None:
    from rlx_core.plugin import check_ops

    try:
        decode_program(program)  # (this backend also needs the result last)
        return check_ops(program, tuple(in_dtypes), supported)
    except Exception as e:
        return f"fused program not understood: {e}"


# ---------------------------------------------------------------------------------------------
# Scalar and vector expressions


class Emit:
    """Expression helpers bound to one function (temporaries become locals)."""

    def __init__(self, fn: Func, mb: ModuleBuilder) -> None:
        self.fn = fn
        self.mb = mb

    def let(self, expr: str, ty: str, hint: str = "x") -> str:
        name = self.fn.local(ty, hint)
        self.fn.set(name, expr)
        return get(name)


def const(dt: DType, value: float) -> str:
    """A scalar constant of ``dt`` in its local representation."""
    import numpy as np

    if dt in (D.F16, D.BF16):
        bits = int(np.asarray(value).astype(dt.np).view(np.uint16))
        return i32(bits)
    if dt is D.F32:
        return f32(float(np.float32(value)))
    if dt is D.F64:
        return f64(float(value))
    if dt is D.C64:
        raw = np.asarray(value).astype(np.complex64).view(np.int64)
        return i64(int(raw.reshape(-1)[0]))
    with np.errstate(all="ignore"):
        v = int(np.asarray(value).astype(dt.np))
    return i64(v) if REPR[dt].vt == "i64" else i32(v)


def canon(dt: DType, e: str) -> str:
    """Re-wrap an i32 result to the value range of a narrow integer type."""
    if dt is D.I8:
        return f"(i32.extend8_s {e})"
    if dt is D.I16:
        return f"(i32.extend16_s {e})"
    if dt is D.U8:
        return f"(i32.and {e} {i32(255)})"
    return e


def _p(dt: DType) -> str:
    return "f64" if dt is D.F64 else "f32" if dt is D.F32 else REPR[dt].vt


def _int_div(em: Emit, a: str, b: str, dt: DType) -> str:
    """The reference's integer division: C semantics (truncate toward zero, what ``i64.div_s``
    does), 0 for a zero divisor, and INT_MIN / -1 wrapping to INT_MIN (``div_s`` would trap on both);
    computed in i64, wrapped back."""
    wide = dt is D.I64
    wa = em.let(a if wide else f"(i64.extend_i32_s {a})", "i64", "a")
    wb = em.let(b if wide else f"(i64.extend_i32_s {b})", "i64", "b")
    # A divisor that would trap (0, or -1 under INT64_MIN) is replaced by 1; the select fixes the result.
    zero = f"(i64.eqz {wb})"
    minus1 = f"(i32.and (i64.eq {wb} {i64(-1)}) (i64.eq {wa} {i64(-2**63)}))"
    safe = em.let(f"(select {i64(1)} {wb} (i32.or {zero} {minus1}))", "i64", "bs")
    q = f"(i64.div_s {wa} {safe})"
    res = f"(select {i64(0)} {q} {zero})"
    return res if wide else canon(dt, f"(i32.wrap_i64 {res})")


def cast_expr(em: Emit, x: str, src: DType, dst: DType) -> str:
    if src is dst:
        return x
    if src is D.F16:
        return cast_expr(em, mathlib.convert(em.mb, "$f16_to_f32", x), D.F32, dst)
    if src is D.BF16:
        return cast_expr(em, mathlib.bf16_to_f32(x), D.F32, dst)
    if dst is D.BOOL:
        p = _p(src)
        return f"({p}.ne {x} {f32(0.0) if p == 'f32' else f64(0.0) if p == 'f64' else f'({p}.const 0)'})"
    if dst is D.F16:
        return mathlib.convert(em.mb, "$f32_to_f16", cast_expr(em, x, src, D.F32))
    if dst is D.BF16:
        return mathlib.convert(em.mb, "$f32_to_bf16", cast_expr(em, x, src, D.F32))
    if src in FLOATS and dst in FLOATS:
        return f"(f64.promote_f32 {x})" if dst is D.F64 else f"(f32.demote_f64 {x})"
    if src in FLOATS:  # -> int: truncate (saturating: never traps)
        if dst is D.I64:
            return f"(i64.trunc_sat_{_p(src)}_s {x})"
        return canon(dst, f"(i32.trunc_sat_{_p(src)}_s {x})")
    if dst in FLOATS:  # int/bool -> float
        return f"({_p(dst)}.convert_{'i64' if src is D.I64 else 'i32'}_s {x})"
    # int -> int
    if dst is D.I64:
        return f"(i64.extend_i32_s {x})"
    if src is D.I64:
        return canon(dst, f"(i32.wrap_i64 {x})")
    return canon(dst, x)


def scalar_expr(em: Emit, op: str, args: list[str], dts: list[DType], out: DType,
                attrs: dict[str, Any]) -> str:
    dt = dts[0] if dts else out
    p = _p(dt)
    a = args[0] if args else ""
    b = args[1] if len(args) > 1 else ""
    isf = dt in FLOATS
    if op == "cast":
        return cast_expr(em, a, dt, out)
    if op == "where":
        return f"(select {b} {args[2]} {a})"
    if op in _CMP:
        if isf:
            return f"({p}.{_CMP[op]} {a} {b})"
        sfx = "" if op in ("equal", "not_equal") else "_s"
        return f"({p}.{_CMP[op]}{sfx} {a} {b})"
    if op in ("logical_and", "logical_or", "logical_xor"):
        return f"(i32.{op[8:]} {a} {b})"
    if op == "logical_not":
        return f"(i32.eqz {a})"
    if op in ("add", "sub", "mul"):
        return canon(dt, f"({p}.{op} {a} {b})")
    if op == "div":
        return f"({p}.div {a} {b})" if isf else _int_div(em, a, b, dt)
    if op in ("maximum", "minimum"):
        if isf:
            return f"({p}.{op[:3]} {a} {b})"
        return f"(select {a} {b} ({p}.{'gt' if op == 'maximum' else 'lt'}_s {a} {b}))"
    if op == "neg":
        return f"({p}.neg {a})" if isf else canon(dt, f"({p}.sub ({p}.const 0) {a})")
    if op == "abs":
        if isf:
            return f"({p}.abs {a})"
        return canon(dt, f"(select ({p}.sub ({p}.const 0) {a}) {a} ({p}.lt_s {a} ({p}.const 0)))")
    if op == "sign":
        if isf:
            one = f32(1.0) if p == "f32" else f64(1.0)
            zero = f32(0.0) if p == "f32" else f64(0.0)
            return (f"(select {one} (select ({p}.neg {one}) {a} ({p}.lt {a} {zero})) "
                    f"({p}.gt {a} {zero}))")
        gt = f"({p}.gt_s {a} ({p}.const 0))"
        lt = f"({p}.lt_s {a} ({p}.const 0))"
        if p == "i64":
            return f"(i64.sub (i64.extend_i32_u {gt}) (i64.extend_i32_u {lt}))"
        return f"(i32.sub {gt} {lt})"
    one = f32(1.0) if p == "f32" else f64(1.0)
    if op == "sqrt":
        return f"({p}.sqrt {a})"
    if op == "rsqrt":
        return f"({p}.div {one} ({p}.sqrt {a}))"
    if op == "reciprocal":
        return f"({p}.div {one} {a})"
    if op in ("floor", "ceil"):
        return f"({p}.{op} {a})"
    if op == "round":
        return f"({p}.nearest {a})"
    if op in LIBRARY_OPS:
        return mathlib.call(em.mb, op, a, vector=False)
    raise ValueError(f"no scalar wasm code for {op!r}")


def vector_expr(em: Emit, op: str, args: list[str]) -> str:
    a = args[0]
    b = args[1] if len(args) > 1 else ""
    one = mathlib.VECTOR.c(1.0)
    if op in ("add", "sub", "mul", "div"):
        return f"(f32x4.{op} {a} {b})"
    if op in ("maximum", "minimum"):
        return f"(f32x4.{op[:3]} {a} {b})"
    if op in ("neg", "abs", "sqrt", "floor", "ceil"):
        return f"(f32x4.{op} {a})"
    if op == "round":
        return f"(f32x4.nearest {a})"
    if op == "reciprocal":
        return f"(f32x4.div {one} {a})"
    if op == "rsqrt":
        return f"(f32x4.div {one} (f32x4.sqrt {a}))"
    if op == "sign":
        zero = mathlib.VECTOR.c(0.0)
        neg = f"(v128.bitselect {mathlib.VECTOR.c(-1.0)} {a} (f32x4.lt {a} {zero}))"
        return f"(v128.bitselect {one} {neg} (f32x4.gt {a} {zero}))"
    if op in LIBRARY_OPS:
        return mathlib.call(em.mb, op, a, vector=True)
    raise ValueError(f"no vector wasm code for {op!r}")


# ---------------------------------------------------------------------------------------------
# Layout helpers


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    out = [0] * len(shape)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        out[i] = acc
        acc *= shape[i]
    return out


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> list[int]:
    """Element strides of an operand of ``shape`` read at every index of ``out_shape``."""
    pad = len(out_shape) - len(shape)
    own = contiguous_strides(shape)
    res = []
    for i in range(len(out_shape)):
        j = i - pad
        if j < 0 or shape[j] == 1:
            res.append(0)
        else:
            res.append(own[j])
    return res


def collapse(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> list[tuple[int, list[int]]]:
    """Merge dims whose strides chain (for every operand) and drop size-1 dims."""
    out: list[tuple[int, list[int]]] = []
    for i, n in enumerate(shape):
        if n == 1:
            continue
        ss = [s[i] for s in strides]
        if out and all(ps == s * n for ps, s in zip(out[-1][1], ss)):
            out[-1] = (out[-1][0] * n, ss)
        else:
            out.append((n, ss))
    return out


def nest(fn: Func, dims: list[tuple[int, list[int]]], sizes: Sequence[int], bases: list[str],
         inner: Any) -> None:
    """Loops over all dims but the last; ``inner(row_ptrs, n, inner_strides)`` emits the last one.

    ``bases`` are i32 expressions of the operands' base addresses; ``sizes`` their item sizes.
    """
    if not dims:
        inner(bases, 1, [0] * len(bases))
        return
    if len(dims) == 1:
        inner(bases, dims[0][0], dims[0][1])
        return
    n, ss = dims[0]
    ptrs = []
    for b in bases:
        p = fn.local("i32", "p")
        fn.set(p, b)
        ptrs.append(p)
    with fn.loop(n):
        nest(fn, dims[1:], sizes, [get(p) for p in ptrs], inner)
        for p, s, isz in zip(ptrs, ss, sizes):
            fn.inc(p, s * isz)


# ---------------------------------------------------------------------------------------------
# The kernel


def elementwise_kernel(mb: ModuleBuilder, ops: list[tuple[str, list[str], dict[str, Any]]],
                       in_types: Sequence[TensorType], out_type: TensorType) -> str:
    """A function ``(in_0 .. in_{n-1}, out)`` computing the program over ``out_type``'s shape."""
    in_dts = [t.dtype for t in in_types]
    tdts = program_dtypes(ops, in_dts)
    key = ("ew", json.dumps([[o, a, {k: str(v) for k, v in at.items()}] for o, a, at in ops]),
           tuple(in_types), out_type, mb.simd)

    def make(name: str) -> Func:
        nin = len(in_types)
        params = [(f"$in{k}", "i32") for k in range(nin)] + [("$out", "i32")]
        fn = Func(name, params)
        em = Emit(fn, mb)
        shape = [int(d) for d in out_type.shape]
        if math.prod(shape) == 0:
            return fn
        strides = [broadcast_strides([int(d) for d in t.shape], shape) for t in in_types]
        strides.append(contiguous_strides(shape))
        dims = collapse(shape, strides)
        sizes = [REPR[d].size for d in in_dts] + [REPR[out_type.dtype].size]
        every = in_dts + tdts
        vec = (mb.simd and all(d is D.F32 for d in every) and all(o in SIMD_OPS for o, _, _ in ops)
               and (not dims or all(s in (0, 1) for s in dims[-1][1])) and
               (dims[-1][0] if dims else 1) >= 4)
        used = {a for _, args, _ in ops for a in args}

        def compute(vals: dict[str, str], vector: bool) -> str:
            env = dict(vals)
            for j, (op, args, attrs) in enumerate(ops):
                xs = [env[a] for a in args]
                if vector:
                    e = vector_expr(em, op, xs)
                    ty = "v128"
                else:
                    e = scalar_expr(em, op, xs, [_dt(a, in_dts, tdts) for a in args], tdts[j], attrs)
                    ty = REPR[tdts[j]].vt
                env[f"t{j}"] = em.let(e, ty, "t")
            return env[f"t{len(ops) - 1}"]

        def inner(rows: list[str], n: int, ss: list[int]) -> None:
            hoisted: dict[str, str] = {}
            vhoisted: dict[str, str] = {}
            ptrs: list[str | None] = []
            for k in range(nin):
                name_k = f"i{k}"
                if name_k not in used:
                    ptrs.append(None)
                    continue
                r = REPR[in_dts[k]]
                if ss[k] == 0:
                    hoisted[name_k] = em.let(mem(r.load, rows[k]), r.vt, "h")
                    if vec:
                        vhoisted[name_k] = em.let(f"(f32x4.splat {hoisted[name_k]})", "v128", "hv")
                    ptrs.append(None)
                else:
                    p = fn.local("i32", "q")
                    fn.set(p, rows[k])
                    ptrs.append(p)
            po = fn.local("i32", "q")
            fn.set(po, rows[nin])
            ro = REPR[out_type.dtype]
            done = 0
            if vec:
                nv = n // 4
                with fn.loop(nv):
                    vals = dict(vhoisted)
                    for k in range(nin):
                        if ptrs[k] is not None:
                            vals[f"i{k}"] = em.let(mem("v128.load", get(ptrs[k])), "v128", "v")  # type: ignore[arg-type]
                    res = compute(vals, True)
                    fn.emit(mem("v128.store", get(po), 0, res))
                    for k in range(nin):
                        if ptrs[k] is not None:
                            fn.inc(ptrs[k], 16)  # type: ignore[arg-type]
                    fn.inc(po, 16)
                done = nv * 4
            rest = n - done
            if rest <= 0:
                return
            with fn.loop(rest):
                vals = dict(hoisted)
                for k in range(nin):
                    if ptrs[k] is not None:
                        r = REPR[in_dts[k]]
                        vals[f"i{k}"] = em.let(mem(r.load, get(ptrs[k])), r.vt, "s")  # type: ignore[arg-type]
                res = compute(vals, False)
                fn.emit(mem(ro.store, get(po), 0, res))
                for k in range(nin):
                    if ptrs[k] is not None:
                        fn.inc(ptrs[k], ss[k] * sizes[k])  # type: ignore[arg-type]
                fn.inc(po, ss[nin] * sizes[nin])

        nest(fn, dims, sizes, [get(f"$in{k}") for k in range(nin)] + [get("$out")], inner)
        return fn

    return mb.kernel(key, make)


def _dt(a: str, in_dts: Sequence[DType], tdts: Sequence[DType]) -> DType:
    return in_dts[int(a[1:])] if a[0] == "i" else tdts[int(a[1:])]


def single_op_program(op: str, nin: int, attrs: dict[str, Any]) -> Program:
    return [(op, [f"i{k}" for k in range(nin)], dict(attrs))]
