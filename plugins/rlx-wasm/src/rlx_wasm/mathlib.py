"""f32 library functions as wasm helpers, in a scalar (``f32``) and a SIMD128 (``f32x4``) form.

Each algorithm is written once against a small operator set (:class:`Scalar` / :class:`Vector`)
and emitted twice. Accuracy (measured against float64 over dense grids, f32 arithmetic):

* ``exp``: Cody-Waite reduction by ln 2, degree-5 polynomial (Cephes ``expf`` coefficients),
  ``2**n`` applied in two halves so subnormal results are right; < 1 ulp.
* ``log``: frexp to ``[sqrt(1/2), sqrt(2))``, degree-8 polynomial (Cephes ``logf``); < 1 ulp.
* ``tanh``: odd polynomial below 0.625 (Cephes ``tanhf``), else ``1 - 2/(exp(2|x|)+1)``; < 1.3 ulp.
* ``erf``: ``x*P(x**2)`` below 0.921875, else ``1 - exp(-x**2) * R(1/|x|)``; coefficients fitted
  for this backend (weighted least squares on Chebyshev nodes); < 2.5 ulp.
* ``sigmoid``: ``1 / (1 + exp(-x))``.

The conformance tolerance for these (LIBRARY_ULPS) is 8 ulp plus two storage ulps. NaN propagates,
infinities give the IEEE limits. Also here: f16 and bf16 <-> f32 conversions (round to nearest even).
"""

from __future__ import annotations

from .wat import Func, f32, get, i32, v128_f32, v128_i32

LOG2E = 1.44269504088896341
LN2_HI = 0.693359375
LN2_LO = -2.12194440e-4
EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
         5.0000001201e-1)
LOG_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
         -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)
TANH_P = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1)
ERF_SPLIT = 0.921875
ERF_SMALL = (8.410180453211069e-05, -0.0008153537637554109, 0.005202149040997028, -0.026859942823648453,
             0.11283708363771439, -0.37612634897232056, 1.128379225730896)
ERF_LARGE = (0.0211850106716156, -0.12809784710407257, 0.31711453199386597, -0.37555721402168274,
             0.10396285355091095, 0.3028033971786499, -0.40109384059906006, 0.026014788076281548,
             0.5610952377319336, 0.0001566719583934173)
INF = float("inf")
NAN = float("nan")


class Scalar:
    """f32 values, i32 integers, i32 (0/1) conditions."""

    t = "f32"
    it = "i32"
    suffix = "s"

    def c(self, x: float) -> str:
        return f32(x)

    def ic(self, n: int) -> str:
        return i32(n)

    def op(self, name: str, *a: str) -> str:
        return f"(f32.{name} {' '.join(a)})"

    def iop(self, name: str, *a: str) -> str:
        return f"(i32.{name} {' '.join(a)})"

    def shl(self, a: str, n: int) -> str:
        return f"(i32.shl {a} {i32(n)})"

    def shr_s(self, a: str, n: int) -> str:
        return f"(i32.shr_s {a} {i32(n)})"

    def shr_u(self, a: str, n: int) -> str:
        return f"(i32.shr_u {a} {i32(n)})"

    def to_int(self, a: str) -> str:
        return f"(i32.trunc_sat_f32_s {a})"

    def to_float(self, a: str) -> str:
        return f"(f32.convert_i32_s {a})"

    def as_float(self, a: str) -> str:
        return f"(f32.reinterpret_i32 {a})"

    def as_int(self, a: str) -> str:
        return f"(i32.reinterpret_f32 {a})"

    def select(self, a: str, b: str, cond: str) -> str:
        return f"(select {a} {b} {cond})"

    def cmp(self, name: str, a: str, b: str) -> str:
        return f"(f32.{name} {a} {b})"

    def either(self, a: str, b: str) -> str:
        return f"(i32.or {a} {b})"

    def dec_if(self, n: str, cond: str) -> str:
        return f"(i32.sub {n} {cond})"

    def copysign(self, mag: str, sign: str) -> str:
        return f"(f32.copysign {mag} {sign})"


class Vector(Scalar):
    """f32x4 values, i32x4 integers, v128 lane masks as conditions."""

    t = "v128"
    it = "v128"
    suffix = "v"

    def c(self, x: float) -> str:
        return v128_f32(x)

    def ic(self, n: int) -> str:
        return v128_i32(n)

    def op(self, name: str, *a: str) -> str:
        return f"(f32x4.{name} {' '.join(a)})"

    def iop(self, name: str, *a: str) -> str:
        if name in ("and", "or", "xor"):
            return f"(v128.{name} {' '.join(a)})"
        return f"(i32x4.{name} {' '.join(a)})"

    def shl(self, a: str, n: int) -> str:
        return f"(i32x4.shl {a} {i32(n)})"

    def shr_s(self, a: str, n: int) -> str:
        return f"(i32x4.shr_s {a} {i32(n)})"

    def shr_u(self, a: str, n: int) -> str:
        return f"(i32x4.shr_u {a} {i32(n)})"

    def to_int(self, a: str) -> str:
        return f"(i32x4.trunc_sat_f32x4_s {a})"

    def to_float(self, a: str) -> str:
        return f"(f32x4.convert_i32x4_s {a})"

    def as_float(self, a: str) -> str:
        return a

    def as_int(self, a: str) -> str:
        return a

    def select(self, a: str, b: str, cond: str) -> str:
        return f"(v128.bitselect {a} {b} {cond})"

    def cmp(self, name: str, a: str, b: str) -> str:
        return f"(f32x4.{name} {a} {b})"

    def either(self, a: str, b: str) -> str:
        return f"(v128.or {a} {b})"

    def dec_if(self, n: str, cond: str) -> str:
        return f"(i32x4.add {n} {cond})"  # a true lane is -1

    def copysign(self, mag: str, sign: str) -> str:
        return f"(v128.bitselect {sign} {mag} {v128_i32(0x80000000)})"


SCALAR = Scalar()
VECTOR = Vector()


class _Gen:
    """Straight-line code with every intermediate in a local (values are used several times)."""

    def __init__(self, fn: Func, o: Scalar) -> None:
        self.fn = fn
        self.o = o

    def let(self, expr: str, ty: str | None = None, hint: str = "v") -> str:
        name = self.fn.local(ty or self.o.t, hint)
        self.fn.set(name, expr)
        return get(name)

    def ilet(self, expr: str) -> str:
        return self.let(expr, self.o.it, "n")

    def horner(self, coeffs: tuple[float, ...], t: str) -> str:
        o = self.o
        acc = o.c(coeffs[0])
        for c in coeffs[1:]:
            acc = self.let(o.op("add", o.op("mul", acc, t), o.c(c)))
        return acc


def _func(name: str, o: Scalar) -> tuple[Func, _Gen, str]:
    fn = Func(name, [("$x", o.t)], o.t)
    return fn, _Gen(fn, o), get("$x")


def exp_fn(mb: object, o: Scalar) -> str:
    fn, g, x = _func(f"$exp_{o.suffix}", o)
    n = g.let(o.op("nearest", o.op("mul", x, o.c(LOG2E))))
    r = g.let(o.op("sub", x, o.op("mul", n, o.c(LN2_HI))))
    r = g.let(o.op("sub", r, o.op("mul", n, o.c(LN2_LO))))
    p = g.horner(EXP_P, r)
    z = g.let(o.op("mul", r, r))
    p = g.let(o.op("add", o.op("add", o.op("mul", p, z), r), o.c(1.0)))
    k = g.ilet(o.to_int(n))
    h = g.ilet(o.shr_s(k, 1))
    s1 = o.as_float(o.shl(o.iop("add", h, o.ic(127)), 23))
    s2 = o.as_float(o.shl(o.iop("add", o.iop("sub", k, h), o.ic(127)), 23))
    res = g.let(o.op("mul", o.op("mul", p, s1), s2))
    res = g.let(o.select(o.c(0.0), res, o.cmp("lt", x, o.c(-104.0))))
    fn.emit(o.select(o.c(INF), res, o.cmp("gt", x, o.c(88.8))))
    return fn.render()


def log_fn(mb: object, o: Scalar) -> str:
    fn, g, x = _func(f"$log_{o.suffix}", o)
    tiny = g.let(o.cmp("lt", x, o.c(1.17549435e-38)), o.it, "c")
    s = g.let(o.select(o.op("mul", x, o.c(8388608.0)), x, tiny))
    bits = g.ilet(o.as_int(s))
    e = g.ilet(o.iop("add", o.select(o.ic(-23), o.ic(0), tiny),
                     o.iop("sub", o.shr_u(bits, 23), o.ic(126))))
    m = g.let(o.as_float(o.iop("or", o.iop("and", bits, o.ic(0x007FFFFF)), o.ic(0x3F000000))))
    c = g.let(o.cmp("lt", m, o.c(0.707106781186547524)), o.it, "c")
    e = g.ilet(o.dec_if(e, c))
    m = g.let(o.op("sub", o.select(o.op("add", m, m), m, c), o.c(1.0)))
    z = g.let(o.op("mul", m, m))
    y = g.horner(LOG_P, m)
    y = g.let(o.op("mul", o.op("mul", y, m), z))
    fe = g.let(o.to_float(e))
    y = g.let(o.op("add", y, o.op("mul", fe, o.c(LN2_LO))))
    y = g.let(o.op("sub", y, o.op("mul", o.c(0.5), z)))
    r = g.let(o.op("add", m, y))
    r = g.let(o.op("add", r, o.op("mul", fe, o.c(LN2_HI))))
    r = g.let(o.select(x, r, o.either(o.cmp("eq", x, o.c(INF)), o.cmp("ne", x, x))))
    r = g.let(o.select(o.c(-INF), r, o.cmp("eq", x, o.c(0.0))))
    fn.emit(o.select(o.c(NAN), r, o.cmp("lt", x, o.c(0.0))))
    return fn.render()


def tanh_fn(mb: object, o: Scalar) -> str:
    exp = mb.helper(f"$exp_{o.suffix}", lambda m: exp_fn(m, o))  # type: ignore[attr-defined]
    fn, g, x = _func(f"$tanh_{o.suffix}", o)
    a = g.let(o.op("abs", x))
    z = g.let(o.op("mul", x, x))
    p = g.horner(TANH_P, z)
    ys = g.let(o.op("add", o.op("mul", o.op("mul", p, z), x), x))
    e = g.let(f"(call {exp} {o.op('add', a, a)})")
    t = g.let(o.op("sub", o.c(1.0), o.op("div", o.c(2.0), o.op("add", e, o.c(1.0)))))
    t = g.let(o.copysign(t, x))
    fn.emit(o.select(ys, t, o.cmp("lt", a, o.c(0.625))))
    return fn.render()


def sigmoid_fn(mb: object, o: Scalar) -> str:
    exp = mb.helper(f"$exp_{o.suffix}", lambda m: exp_fn(m, o))  # type: ignore[attr-defined]
    fn, g, x = _func(f"$sigmoid_{o.suffix}", o)
    fn.emit(o.op("div", o.c(1.0), o.op("add", o.c(1.0), f"(call {exp} {o.op('neg', x)})")))
    return fn.render()


def erf_fn(mb: object, o: Scalar) -> str:
    exp = mb.helper(f"$exp_{o.suffix}", lambda m: exp_fn(m, o))  # type: ignore[attr-defined]
    fn, g, x = _func(f"$erf_{o.suffix}", o)
    a = g.let(o.op("abs", x))
    z = g.let(o.op("mul", x, x))
    ys = g.let(o.op("mul", g.horner(ERF_SMALL, z), x))
    u = g.let(o.op("div", o.c(1.0), a))
    r = g.horner(ERF_LARGE, u)
    e = g.let(f"(call {exp} {o.op('neg', z)})")
    yl = g.let(o.op("sub", o.c(1.0), o.op("mul", e, r)))
    yl = g.let(o.select(o.c(1.0), yl, o.cmp("ge", a, o.c(4.0))))
    yl = g.let(o.copysign(yl, x))
    fn.emit(o.select(ys, yl, o.cmp("lt", a, o.c(ERF_SPLIT))))
    return fn.render()


LIBRARY = {"exp": exp_fn, "log": log_fn, "tanh": tanh_fn, "sigmoid": sigmoid_fn, "erf": erf_fn}


def call(mb: object, name: str, arg: str, vector: bool) -> str:
    """``(call $name_s|v arg)``, emitting the helper on first use."""
    o = VECTOR if vector else SCALAR
    fname = mb.helper(f"${name}_{o.suffix}", lambda m: LIBRARY[name](m, o))  # type: ignore[attr-defined]
    return f"(call {fname} {arg})"


# -- half-precision conversions (scalar, bit manipulation) -------------------------------------

def f16_to_f32_fn(mb: object) -> str:
    fn = Func("$f16_to_f32", [("$h", "i32")], "f32")
    h = get("$h")
    sign = fn.local("i32", "s")
    e = fn.local("i32", "e")
    m = fn.local("i32", "m")
    fn.set(sign, f"(i32.shl (i32.and {h} {i32(0x8000)}) {i32(16)})")
    fn.set(e, f"(i32.and (i32.shr_u {h} {i32(10)}) {i32(0x1F)})")
    fn.set(m, f"(i32.and {h} {i32(0x3FF)})")
    bits = f"(i32.shl (i32.and {h} {i32(0x7FFF)}) {i32(13)})"
    normal = f"(i32.or {get(sign)} (i32.add {bits} {i32(112 << 23)}))"
    special = f"(i32.or {get(sign)} (i32.or {i32(0x7F800000)} (i32.shl {get(m)} {i32(13)})))"
    sub = (f"(i32.or {get(sign)} (i32.reinterpret_f32 (f32.mul (f32.convert_i32_u {get(m)}) "
           f"{f32(2.0 ** -24)})))")
    fn.emit(f"(f32.reinterpret_i32 (select {sub} (select {special} {normal} (i32.eq {get(e)} {i32(31)})) "
            f"(i32.eqz {get(e)})))")
    return fn.render()


def f32_to_f16_fn(mb: object) -> str:
    fn = Func("$f32_to_f16", [("$x", "f32")], "i32")
    f = fn.local("i32", "f")
    sign = fn.local("i32", "s")
    mm = fn.local("i32", "m")
    sh = fn.local("i32", "k")
    h = fn.local("i32", "h")
    rem = fn.local("i32", "r")
    half = fn.local("i32", "hf")
    fn.set(f, "(i32.reinterpret_f32 (local.get $x))")
    fn.set(sign, f"(i32.and (i32.shr_u {get(f)} {i32(16)}) {i32(0x8000)})")
    fn.set(f, f"(i32.and {get(f)} {i32(0x7FFFFFFF)})")
    # NaN / Inf
    fn.emit(f"(if (i32.ge_u {get(f)} {i32(0x7F800000)}) (then (return (i32.or {get(sign)} "
            f"(select {i32(0x7E00)} {i32(0x7C00)} (i32.gt_u {get(f)} {i32(0x7F800000)}))))))")
    fn.emit(f"(if (i32.ge_u {get(f)} {i32(0x477FF000)}) (then (return (i32.or {get(sign)} {i32(0x7C00)}))))")
    fn.emit(f"(if (i32.lt_u {get(f)} {i32(0x33000000)}) (then (return {get(sign)})))")
    # subnormal half: shift the full mantissa right, round to nearest even
    fn.emit(f"(if (i32.lt_u {get(f)} {i32(0x38800000)}) (then")
    fn.set(mm, f"(i32.or (i32.and {get(f)} {i32(0x7FFFFF)}) {i32(0x800000)})")
    fn.set(sh, f"(i32.sub {i32(126)} (i32.shr_u {get(f)} {i32(23)}))")
    fn.set(h, f"(i32.shr_u {get(mm)} {get(sh)})")
    fn.set(rem, f"(i32.and {get(mm)} (i32.sub (i32.shl {i32(1)} {get(sh)}) {i32(1)}))")
    fn.set(half, f"(i32.shl {i32(1)} (i32.sub {get(sh)} {i32(1)}))")
    fn.emit(f"(return (i32.or {get(sign)} (i32.add {get(h)} (i32.or (i32.gt_u {get(rem)} {get(half)}) "
            f"(i32.and (i32.eq {get(rem)} {get(half)}) (i32.and {get(h)} {i32(1)}))))))))")
    fn.emit(f"(i32.or {get(sign)} (i32.shr_u (i32.sub (i32.add {get(f)} (i32.add {i32(0xFFF)} "
            f"(i32.and (i32.shr_u {get(f)} {i32(13)}) {i32(1)}))) {i32(0x38000000)}) {i32(13)}))")
    return fn.render()


def bf16_to_f32(h: str) -> str:
    return f"(f32.reinterpret_i32 (i32.shl {h} {i32(16)}))"


def f32_to_bf16_fn(mb: object) -> str:
    fn = Func("$f32_to_bf16", [("$x", "f32")], "i32")
    f = fn.local("i32", "f")
    fn.set(f, "(i32.reinterpret_f32 (local.get $x))")
    rounded = (f"(i32.shr_u (i32.add {get(f)} (i32.add {i32(0x7FFF)} (i32.and (i32.shr_u {get(f)} {i32(16)}) "
               f"{i32(1)}))) {i32(16)})")
    nan = f"(i32.or (i32.and (i32.shr_u {get(f)} {i32(16)}) {i32(0x8000)}) {i32(0x7FC0)})"
    fn.emit(f"(select {nan} {rounded} (f32.ne (local.get $x) (local.get $x)))")
    return fn.render()


CONVERSIONS = {"$f16_to_f32": f16_to_f32_fn, "$f32_to_f16": f32_to_f16_fn, "$f32_to_bf16": f32_to_bf16_fn}


def convert(mb: object, name: str, arg: str) -> str:
    fname = mb.helper(name, CONVERSIONS[name])  # type: ignore[attr-defined]
    return f"(call {fname} {arg})"
