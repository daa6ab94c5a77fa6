"""LIR steps -> freestanding C functions shaped for Hexagon HVX.

Shapes are static (a program is specialised before lowering), so every loop bound and stride is a
constant: each step becomes one function of ``restrict``, 64-byte aligned pointers (the buffer plan's
alignment) whose innermost loop is unit-stride (or reads a broadcast scalar), the form clang's
Hexagon auto-vectoriser turns into 128-byte HVX vectors. Elementwise bodies (single ops and fused
chains) come from the shared C renderer; the math the renderer asks for (``rlx_expf`` ...) is the
freestanding prelude's (:data:`PRELUDE`), since no libm exists on a bare DSP. Nothing here includes
a header beyond the freestanding ``<stdbool.h>``/``<stdint.h>``.

Steps never run in place: with ``restrict`` pointers an aliased output would be undefined, so the
claims say ``in_place=False`` and every output has its own bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import DIALECTS, FUSED, DType, IRError, normalize_axis, render_program, single_op_program

D = DType
ALIGN = 64
#: ``(t0 != t0)``: a self-inequality, i.e. a float NaN test clang cannot select on HVX vectors
SELF_COMPARE = re.compile(r"\b([A-Za-z_]\w*) != \1\b")
TYPES = {D.F32: "float", D.I32: "int", D.I64: "long long", D.BOOL: "bool"}
#: math the renderer may call -> the prelude's function
MATH = {"exp": "rlx_expf", "log": "rlx_logf", "sqrt": "rlx_sqrtf", "abs": "rlx_fabsf", "floor": "rlx_floorf",
        "ceil": "rlx_ceilf", "round": "rlx_rintf"}
NO_MATH = frozenset({"sin", "cos", "tanh", "pow"})


def _math(op: str, dt: DType) -> str:
    if op not in MATH:
        raise IRError(f"{op} has no freestanding implementation for Hexagon",
                      fix="it runs through a decomposition, or on another backend")
    return MATH[op]


def _rule(op: str, args: Sequence[str], in_types: Sequence[DType], out: DType, attrs: dict) -> str | None:
    if op in NO_MATH:
        raise IRError(f"{op} has no freestanding implementation for Hexagon",
                      fix="it runs through a decomposition, or on another backend")
    if op in ("maximum", "minimum"):
        a, b = args
        if in_types[0] is D.F32:  # NaN propagates from either side, as the reference does
            return f"{'rlx_maxf' if op == 'maximum' else 'rlx_minf'}({a}, {b})"  # see the prelude
        return f"((({a}) {'>' if op == 'maximum' else '<'} ({b})) ? ({a}) : ({b}))"  # integers: no NaN
    if op in ("div", "reciprocal") and out is D.F32:
        a, b = (args if op == "div" else ("1.0f", args[0]))
        return f"rlx_divf({a}, {b})"  # out of line: see the prelude
    if op == "sign" and in_types[0] is D.F32:
        x = args[0]  # sign(NaN) is NaN (the bit test again, see above)
        return f"(rlx_isnanf({x}) ? ({x}) : ((float)(({x}) > 0.0f) - (float)(({x}) < 0.0f)))"
    if op == "abs" and in_types[0] in (D.I32, D.I64):
        # no <stdlib.h> abs (and C's abs would narrow i64); negate in unsigned so MIN wraps to MIN
        # as the reference does, instead of overflowing
        t, u = ("int", "unsigned") if in_types[0] is D.I32 else ("long long", "unsigned long long")
        x = args[0]
        return f"(({x}) < 0 ? ({t})(({u})0 - ({u})({x})) : ({x}))"
    return None


#: the shared C dialect with the prelude's math (erf through the renderer's exp polynomial)
DIALECT = dataclasses.replace(DIALECTS["c"], name="hexagon", math=_math, has_erf=False, rule=_rule)

PRELUDE = r"""/* rlx-hexagon: freestanding C for Hexagon HVX. No libc, no libm: the math is here. */
#include <stdbool.h>
#include <stdint.h>
#define RLX_A(p) __builtin_assume_aligned((p), 64)
typedef union { float f; uint32_t u; } rlx_fu;
/* NaN as a bit test: exponent all ones and a nonzero mantissa, i.e. (bits << 1) > 0xff000000.
   Never `x != x`: clang 19 cannot select that compare (setuo) on HVX vectors and crashes. */
static inline bool rlx_isnanf(float x) { rlx_fu v = {x}; return (v.u << 1) > 0xff000000u; }
/* NaN-propagating max/min, NaN tested on both sides. Never `a > b ? a : b` alone, even after a NaN
   test of a: clang 19's Hexagon back end selects that shape as sfmax/sfmin, which return the
   non-NaN operand (max(inf, NaN) = inf, found executing the scalar build under qemu-hexagon). */
static inline float rlx_maxf(float a, float b) {
  return ((a > b || rlx_isnanf(a)) && !rlx_isnanf(b)) ? a : b;
}
static inline float rlx_minf(float a, float b) {
  return ((a < b || rlx_isnanf(a)) && !rlx_isnanf(b)) ? a : b;
}
/* Division out of line. HVX has no vector divide: a loop of f32 divisions that clang vectorises
   (or SLP-packs) expands every lane into the scalar divide sequence inside vector code (one 512
   element row-broadcast divide: 18k instructions and 9 s of compile time); the call keeps the
   loop scalar and the division IEEE. */
static __attribute__((noinline)) float rlx_divf(float a, float b) { return a / b; }
static inline float rlx_fabsf(float x) { return __builtin_fabsf(x); }
static inline float rlx_rintf(float x) { /* half to even in the default rounding mode */
  const float a = __builtin_fabsf(x);
  if (!(a < 8388608.0f)) return x;
  const float r = (a + 8388608.0f) - 8388608.0f;
  return __builtin_copysignf(r, x);
}
static inline float rlx_floorf(float x) {
  const float r = rlx_rintf(x);
  return r > x ? r - 1.0f : r;
}
static inline float rlx_ceilf(float x) {
  const float r = rlx_rintf(x);
  return r < x ? r + 1.0f : r;
}
static inline float rlx_sqrtf(float x) {
  if (!(x > 0.0f) || x == __builtin_inff())
    return x == 0.0f || x == __builtin_inff() ? x : __builtin_nanf("");
  rlx_fu v = {x};
  v.u = 0x5f3759dfu - (v.u >> 1);             /* 1/sqrt(x) estimate, then Newton steps */
  float y = v.f;
  y = y * (1.5f - 0.5f * x * y * y);
  y = y * (1.5f - 0.5f * x * y * y);
  y = y * (1.5f - 0.5f * x * y * y);
  float s = x * y;
  s = 0.5f * (s + x / s);                      /* one Heron step on the square root itself */
  return s;
}
static inline float rlx_expf(float x) {
  if (rlx_isnanf(x)) return x;
  if (x > 88.72283935546875f) return __builtin_inff();
  if (x < -103.97208f) return 0.0f;
  const float n = rlx_rintf(x * 1.44269504088896341f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;   /* Cody-Waite ln2 split */
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f; p = p * r + 1.0f / 120.0f; p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f; p = p * r + 0.5f; p = p * r + 1.0f; p = p * r + 1.0f;
  int k = (int)n;
  float scale = 1.0f;
  if (k < -126) { scale = 1.17549435e-38f; k += 126; }        /* subnormal results */
  rlx_fu e; e.u = (uint32_t)(k + 127) << 23;
  return p * e.f * scale;
}
static inline float rlx_logf(float x) {
  if (rlx_isnanf(x) || x < 0.0f) return __builtin_nanf("");
  if (x == 0.0f) return -__builtin_inff();
  if (x == __builtin_inff()) return x;
  int k = 0;
  if (x < 1.17549435e-38f) { x *= 8388608.0f; k = -23; }       /* subnormal inputs */
  rlx_fu v = {x};
  k += (int)(v.u >> 23) - 127;
  v.u = (v.u & 0x007fffffu) | 0x3f800000u;                     /* mantissa in [1, 2) */
  float m = v.f;
  if (m > 1.41421356f) { m *= 0.5f; k += 1; }
  const float s = (m - 1.0f) / (m + 1.0f), z = s * s;          /* log m = 2 atanh s */
  float p = 2.0f / 9.0f;
  p = p * z + 2.0f / 7.0f; p = p * z + 2.0f / 5.0f; p = p * z + 2.0f / 3.0f; p = p * z + 2.0f;
  return (float)k * 0.693147180559945f + s * p;
}
"""


def ctype(dt: DType) -> str:
    try:
        return TYPES[dt]
    except KeyError:
        raise IRError(f"the Hexagon kernels do not handle {dt}",
                      fix="cast to f32/i32/i64/bool first") from None


def stype(dt: DType) -> str:
    """A dtype's type in buffers: bool is stored as a byte and read as ``!= 0``. (clang 19's Hexagon
    back end cannot select the vector ``i8 -> i1`` truncate a ``bool`` load becomes under HVX: "Cannot
    select: v4i1 = truncate", a compiler crash on a broadcast ``where``; a byte compare vectorises.)"""
    return "unsigned char" if dt is D.BOOL else ctype(dt)


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def _contig(shape: Sequence[int]) -> list[int]:
    st, acc = [0] * len(shape), 1
    for j in range(len(shape) - 1, -1, -1):
        st[j] = acc
        acc *= shape[j]
    return st


def _bcast(shape: Sequence[int], out: Sequence[int]) -> list[int]:
    full = (1,) * (len(out) - len(shape)) + tuple(shape)
    st = _contig(full)
    return [0 if full[j] == 1 else st[j] for j in range(len(out))]


def _coalesce(dims: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """The same iteration with fewer loops: size-1 dims dropped, and a dim merged into the next where
    every array steps over both as one (stride j == stride j+1 * size j+1). Fewer, longer loops are
    what clang's HVX vectoriser wants (a 64-wide inner loop under three unrolled outer loops of 1, 2,
    2 compiles ~4x slower, into more code) and the generated C stays small."""
    if math.prod(dims) == 0:
        return [0], [[0] for _ in strides]
    out_d: list[int] = []
    out_s: list[list[int]] = [[] for _ in strides]
    for j, d in enumerate(dims):
        if d == 1:
            continue
        if out_d and all(o[-1] == st[j] * d for o, st in zip(out_s, strides)):
            out_d[-1] *= d
            for o, st in zip(out_s, strides):
                o[-1] = st[j]
            continue
        out_d.append(d)
        for o, st in zip(out_s, strides):
            o.append(st[j])
    return out_d, out_s


def _loops(dims: Sequence[int], var: str, indent: int) -> tuple[list[str], str, int]:
    """Nested ``for`` headers over ``dims`` (loop variables ``var0..``): (lines, closing, depth)."""
    lines = [" " * (indent + 2 * j) + f"for (int {var}{j} = 0; {var}{j} < {d}; ++{var}{j}) {{"
             for j, d in enumerate(dims)]
    close = "\n".join(" " * (indent + 2 * j) + "}" for j in reversed(range(len(dims))))
    return lines, close, indent + 2 * len(dims)


def _index(var: str, strides: Sequence[int], base: int = 0) -> str:
    terms = [f"{var}{j} * {s}" if s != 1 else f"{var}{j}" for j, s in enumerate(strides) if s]
    if base:
        terms.append(str(base))
    return " + ".join(terms) or "0"


def _function(prefix: str, params: Sequence[tuple[DType, str, bool]], body: Sequence[str]) -> tuple[str, str]:
    decl = ", ".join(f"{'const ' if c else ''}{stype(dt)} *restrict {n}_" for dt, n, c in params)
    unpack = [f"  {'const ' if c else ''}{stype(dt)} *restrict {n} = RLX_A({n}_);" for dt, n, c in params]
    text = "\n".join([*unpack, *body])
    name = f"{prefix}_{hashlib.sha256((decl + text).encode()).hexdigest()[:16]}"
    return name, f"void {name}({decl}) {{\n{text}\n}}\n"


def elementwise(program: str, ins: Sequence[tuple[DType, tuple[int, ...]]], out: tuple[DType, tuple[int, ...]]
                ) -> tuple[str, str]:
    odt, oshape = out
    n = math.prod(oshape)
    lines, res, _ = render_program(program, [f"a{k}" for k in range(len(ins))], [d for d, _ in ins], DIALECT)
    for ln in lines:
        if SELF_COMPARE.search(ln):  # an op whose shared rule tests NaN as x != x (see _rule)
            raise IRError("the Hexagon C would test NaN as `x != x`, which clang 19 cannot compile for "
                          f"HVX: {ln}",
                          fix="add a rlx_isnanf rule for this op to rlx_hexagon.codegen._rule")
    flat = all(math.prod(s) == 1 or (1,) * (len(oshape) - len(s)) + tuple(s) == oshape for _, s in ins)
    params = [(dt, f"x{k}", True) for k, (dt, _) in enumerate(ins)] + [(odt, "y", False)]
    if flat or not oshape:
        idx = ["0" if math.prod(s) == 1 else "i" for _, s in ins]
        head, close, ind, out_ix = [f"  for (int i = 0; i < {n}; ++i) {{"], "  }", 4, "i"
    else:
        dims, st = _coalesce(oshape, [_contig(oshape), *(_bcast(s, oshape) for _, s in ins)])
        head, close, ind = _loops(dims, "d", 2)
        idx = [_index("d", x) for x in st[1:]]
        out_ix = _index("d", st[0])
    body = [*head]
    body += [" " * ind + (f"const bool a{k} = x{k}[{idx[k]}] != 0;" if dt is D.BOOL else
                          f"const {ctype(dt)} a{k} = x{k}[{idx[k]}];") for k, (dt, _) in enumerate(ins)]
    body += [" " * ind + ln for ln in lines]
    store = f"(unsigned char)(({res}) != 0)" if odt is D.BOOL else f"({ctype(odt)})({res})"
    body += [" " * ind + f"y[{out_ix}] = {store};", close]
    return _function("rlx_ew", params, body)


def matmul(ash: tuple[int, ...], bsh: tuple[int, ...], oshape: tuple[int, ...]) -> tuple[str, str]:
    a2 = ash if len(ash) > 1 else (1, *ash)
    b2 = bsh if len(bsh) > 1 else (*bsh, 1)
    m, k = a2[-2:]
    nn = b2[-1]
    batch = tuple(int(x) for x in np.broadcast_shapes(a2[:-2], b2[:-2]))
    sa = [s * m * k for s in _bcast(a2[:-2], batch)]
    sb = [s * k * nn for s in _bcast(b2[:-2], batch)]
    sy = [s * m * nn for s in _contig(batch)]
    head, close, ind = _loops(batch, "b", 2)
    p = " " * ind
    body = [*head,
            f"{p}const float *restrict A = a + {_index('b', sa)};",
            f"{p}const float *restrict B = b + {_index('b', sb)};",
            f"{p}float *restrict Y = y + {_index('b', sy)};",
            f"{p}for (int i = 0; i < {m}; ++i) {{",
            f"{p}  float *restrict yr = Y + i * {nn};",
            f"{p}  for (int j = 0; j < {nn}; ++j) yr[j] = 0.0f;",
            f"{p}  for (int q = 0; q < {k}; ++q) {{",
            f"{p}    const float av = A[i * {k} + q];",
            f"{p}    const float *restrict br = B + q * {nn};",
            f"{p}    for (int j = 0; j < {nn}; ++j) yr[j] += av * br[j];",
            f"{p}  }}", f"{p}}}", close]
    return _function("rlx_matmul", [(D.F32, "a", True), (D.F32, "b", True), (D.F32, "y", False)], body)


def reduce(kind: str, xshape: tuple[int, ...], axes: Sequence[int]) -> tuple[str, str]:
    st = _contig(xshape)
    kept = [d for d in range(len(xshape)) if d not in axes]
    red = sorted(axes)
    cnt = math.prod(xshape[d] for d in red)
    init = {"sum": "0.0f", "mean": "0.0f", "max": "-__builtin_inff()", "min": "__builtin_inff()"}[kind]
    if kind in ("sum", "mean"):
        step = "s += v;"
    else:
        step = f"s = rlx_{kind}f(v, s);"
    fin = f"s / {float(cnt)!r}f" if kind == "mean" else "s"
    h1, c1, i1 = _loops([xshape[d] for d in kept], "k", 2)
    h2, c2, i2 = _loops([xshape[d] for d in red], "r", i1 + 2)
    p1 = " " * i1
    base = _index("k", [st[d] for d in kept])
    body = ["  int o = 0;", *h1, f"{p1}const float *restrict xb = x + {base};", f"{p1}float s = {init};", *h2,
            " " * i2 + f"const float v = xb[{_index('r', [st[d] for d in red])}];", " " * i2 + step, c2,
            f"{p1}y[o++] = {fin};", c1]
    if not red or cnt == 0:
        body = ["  int o = 0;", *h1, f"{p1}y[o++] = {init if cnt == 0 else 'x[' + base + ']'};", c1]
        if kind == "mean" and cnt == 0:
            body = ["  int o = 0;", *h1, f"{p1}y[o++] = __builtin_nanf(\"\");", c1]
    return _function(f"rlx_reduce_{kind}", [(D.F32, "x", True), (D.F32, "y", False)], body)


def softmax(rows: int, n: int, log: bool) -> tuple[str, str]:
    out = ("yr[j] = (xr[j] - m) - rlx_logf(s);" if log else "yr[j] = rlx_expf(xr[j] - m) / s;")
    body = [f"  for (int r = 0; r < {rows}; ++r) {{",
            f"    const float *restrict xr = x + r * {n};",
            f"    float *restrict yr = y + r * {n};",
            "    float m = -__builtin_inff();",
            f"    for (int j = 0; j < {n}; ++j) m = rlx_maxf(xr[j], m);",
            "    float s = 0.0f;",
            f"    for (int j = 0; j < {n}; ++j) s += rlx_expf(xr[j] - m);",
            f"    for (int j = 0; j < {n}; ++j) {out}", "  }"]
    return _function("rlx_log_softmax" if log else "rlx_softmax", [(D.F32, "x", True), (D.F32, "y", False)],
                     body)


def layer_norm(rows: int, n: int, eps: float) -> tuple[str, str]:
    body = [f"  for (int r = 0; r < {rows}; ++r) {{",
            f"    const float *restrict xr = x + r * {n};",
            f"    float *restrict yr = y + r * {n};",
            "    float mu = 0.0f;",
            f"    for (int j = 0; j < {n}; ++j) mu += xr[j];",
            f"    mu /= {float(n)!r}f;",
            "    float var = 0.0f;",
            f"    for (int j = 0; j < {n}; ++j) {{ const float d = xr[j] - mu; var += d * d; }}",
            f"    var /= {float(n)!r}f;",
            f"    const float rstd = 1.0f / rlx_sqrtf(var + {float(eps)!r}f);",
            f"    for (int j = 0; j < {n}; ++j) yr[j] = ((xr[j] - mu) * rstd) * g[j] + b[j];", "  }"]
    params = [(D.F32, "x", True), (D.F32, "g", True), (D.F32, "b", True), (D.F32, "y", False)]
    return _function("rlx_layer_norm", params, body)


def copy(dt: DType, dims: Sequence[int], ys: Sequence[int], xs: Sequence[int], yo: int, xo: int,
         fill: str | None = None, fill_n: int = 0) -> tuple[str, str]:
    """``y[yo + sum c*ys] = x[xo + sum c*xs]`` over ``dims`` (after ``y[:fill_n] = fill`` for pad)."""
    dims, (ys, xs) = _coalesce(dims, [ys, xs])
    head, close, ind = _loops(dims, "c", 2)
    body = [f"  for (int i = 0; i < {fill_n}; ++i) y[i] = ({stype(dt)})({fill});"] if fill is not None else []
    body += [*head, " " * ind + f"y[{_index('c', ys, yo)}] = x[{_index('c', xs, xo)}];", close]
    return _function(f"rlx_copy_{dt.value}", [(dt, "x", True), (dt, "y", False)], body)


def literal(v: Any, dt: DType) -> str:
    if dt is D.BOOL:
        return "true" if bool(v) else "false"
    if dt is D.F32:
        s = repr(float(v))
        special = {"inf": "__builtin_inff()", "-inf": "(-__builtin_inff())", "nan": "__builtin_nanf(\"\")"}
        return special.get(s, s + "f")
    return str(int(v))


def step_calls(step: Any, types: Mapping[str, Any]) -> list[tuple[str, str, list[str]]]:
    """``(function name, source, [value per parameter])`` for one LIR step (concat: one per input)."""
    op, ins, out = step.op, list(step.inputs), step.outputs[0]
    its = [types[i] for i in ins]
    ot = types[out]
    oshape = _shape(ot)
    a = step.attrs
    if op == FUSED or step.kernel.startswith("hexagon.ew."):
        prog = str(a["program"]) if op == FUSED else single_op_program(op, len(ins), dict(a))
        name, src = elementwise(prog, [(t.dtype, _shape(t)) for t in its], (ot.dtype, oshape))
        return [(name, src, [*ins, out])]
    if op == "matmul":
        name, src = matmul(_shape(its[0]), _shape(its[1]), oshape)
        return [(name, src, [*ins, out])]
    if op in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min"):
        xs = _shape(its[0])
        axes = range(len(xs)) if a["axes"] is None else [normalize_axis(int(x), len(xs)) for x in a["axes"]]
        name, src = reduce(op.split("_", 1)[1], xs, sorted(set(axes)))
        return [(name, src, [ins[0], out])]
    if op in ("softmax", "log_softmax", "layer_norm"):
        xs = _shape(its[0])
        ax = normalize_axis(int(a["axis"]), len(xs)) if xs else 0
        inner = math.prod(xs[ax:])
        rows = math.prod(xs) // inner if inner else 0
        name, src = (layer_norm(rows, inner, float(a["eps"])) if op == "layer_norm"
                     else softmax(rows, inner, op == "log_softmax"))
        return [(name, src, [*ins, out])]
    dt = ot.dtype
    n = math.prod(oshape)
    if op == "reshape":
        name, src = copy(dt, [n], [1], [1], 0, 0)
        return [(name, src, [ins[0], out])]
    if op in ("transpose", "expand", "slice"):
        xs = _shape(its[0])
        base = (np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), xs, _contig(xs)) if xs
                else np.zeros((), np.int8))
        if op == "transpose":
            v = base.transpose(tuple(a["perm"])) if a["perm"] is not None else base.transpose()
        elif op == "expand":
            v = np.broadcast_to(base, oshape)
        else:
            from rlx_core.plugin import slice_params

            idx: list[Any] = [slice(None)] * len(xs)
            for axx, sl in slice_params(a, xs):
                idx[axx] = sl
            v = base[tuple(idx)]
        off = (v.__array_interface__["data"][0] - base.__array_interface__["data"][0]) if v.size else 0
        name, src = copy(dt, oshape, _contig(oshape), list(v.strides), 0, off)
        return [(name, src, [ins[0], out])]
    if op == "concat":
        ax = normalize_axis(int(a["axis"]), len(oshape))
        ost = _contig(oshape)
        res, start = [], 0
        for x, t in zip(ins, its):
            xs = _shape(t)
            if math.prod(xs):
                name, src = copy(dt, xs, ost, _contig(xs), start * ost[ax], 0)
                res.append((name, src, [x, out]))
            start += xs[ax]
        return res
    if op == "pad":
        pads = tuple(a["pads"])
        xs = _shape(its[0])
        ost = _contig(oshape)
        yo = sum(int(pads[d]) * ost[d] for d in range(len(xs)))
        name, src = copy(dt, xs if math.prod(xs) else [0], ost if math.prod(xs) else [0],
                         _contig(xs) if math.prod(xs) else [0], yo, 0, literal(a["value"], dt), n)
        return [(name, src, [ins[0], out])]
    raise IRError(f"the Hexagon generator has no kernel for {op}",
                  fix="report this bug (claims and codegen disagree)")
