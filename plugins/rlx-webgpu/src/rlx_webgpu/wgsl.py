"""WGSL compute-shader sources. Elementwise bodies come from the shared renderer
(:func:`rlx_core.plugin.render_program`, dialect :data:`WGSL`: the shared ``"wgsl"`` one with this
backend's helpers); matmul, reductions, row kernels and movement are hand-written templates. Every
shader sees the arena (binding 0, ``A: array<u32>``, read-write), the constants (binding 1,
``W: array<u32>``) and its own launch parameters (binding 2, ``M: array<i32>``, bound with a dynamic
offset per dispatch: WebGPU has no push constants, and a dynamic offset works in every
implementation, browsers included).

WGSL differs from GLSL where it matters here: no ``isnan``/``isinf`` built-ins and no promise that
``x != x`` survives the compiler (implementations may assume finite floats), so NaN/Inf tests look
at the bits; inf/nan values come from ``bitcast`` of a *variable* (a constant expression that is
not finite is a shader-creation error); no ``precise``; integer division by zero is defined
(``a / 0 == a``) but not as the reference, hence ``rlx_idiv``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from functools import cache, lru_cache

from rlx_core.plugin import DIALECTS, DType, IRError, render_op, render_program

WG = 64
#: WGSL types of values in kernels (f16/bf16 values are held exactly in f32)
TYPES = {DType.F32: "f32", DType.I32: "i32", DType.BOOL: "bool", DType.I64: "vec2<u32>", DType.F16: "f32",
         DType.BF16: "f32"}
ESIZE = {DType.F32: 4, DType.I32: 4, DType.BOOL: 1, DType.I64: 8, DType.F16: 2, DType.BF16: 2}

HEADER = """@group(0) @binding(0) var<storage, read_write> A: array<u32>;
@group(0) @binding(1) var<storage, read> W: array<u32>;
@group(0) @binding(2) var<storage, read> M: array<i32>;
fn rd(b: i32, a: u32) -> u32 { if (b == 0) { return A[a >> 2u]; } return W[a >> 2u]; }
fn ldf(b: i32, a: u32) -> f32 { return bitcast<f32>(rd(b, a)); }
fn ldi(b: i32, a: u32) -> i32 { return bitcast<i32>(rd(b, a)); }
fn ldb(b: i32, a: u32) -> bool { return ((rd(b, a) >> ((a & 3u) * 8u)) & 0xffu) != 0u; }
fn rlx_inf() -> f32 { var u = 0x7f800000u; return bitcast<f32>(u); }
fn rlx_nan() -> f32 { var u = 0x7fc00000u; return bitcast<f32>(u); }
fn rlx_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn rlx_isinf(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u; }
fn rlx_idiv(a: i32, b: i32) -> i32 {
  if (b == 0) { return 0; }
  let q = u32(abs(a)) / u32(abs(b));
  return select(-1, 1, (a > 0) == (b > 0) || a == 0) * i32(q);
}
fn rlx_tanh(x: f32) -> f32 { if (abs(x) > 15.0) { return sign(x); } return tanh(x); }
fn rlx_exp(x: f32) -> f32 {
  if (rlx_isnan(x)) { return x; }
  if (x > 88.8) { return rlx_inf(); }
  if (x < -104.0) { return 0.0; }
  return exp(x);
}
fn rlx_log(x: f32) -> f32 {
  if (rlx_isnan(x)) { return x; }
  if (x < 0.0) { return rlx_nan(); }
  if (x == 0.0) { return -rlx_inf(); }
  if (rlx_isinf(x)) { return x; }
  return log(x);
}
fn rlx_sqrt(x: f32) -> f32 {
  if (rlx_isnan(x) || x < 0.0) { return rlx_nan(); }
  if (rlx_isinf(x)) { return x; }
  return sqrt(x);
}
fn rlx_max(a: f32, b: f32) -> f32 {
  if (rlx_isnan(a) || rlx_isnan(b)) { return rlx_nan(); } return select(b, a, a > b);
}
fn rlx_min(a: f32, b: f32) -> f32 {
  if (rlx_isnan(a) || rlx_isnan(b)) { return rlx_nan(); } return select(b, a, a < b);
}
fn rlx_sign(x: f32) -> f32 { if (rlx_isnan(x)) { return x; } return f32(x > 0.0) - f32(x < 0.0); }
"""

MUL64 = """
fn rlx_mul64(a: u32, b: u32) -> vec2<u32> {  // the 64-bit product as (high word, low word)
  let a0 = a & 0xffffu; let a1 = a >> 16u; let b0 = b & 0xffffu; let b1 = b >> 16u;
  let p00 = a0 * b0; let p01 = a0 * b1; let p10 = a1 * b0;
  let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
  let hi = a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
  return vec2<u32>(hi, (p00 & 0xffffu) | (mid << 16u));
}
"""

#: i64 values as vec2<u32> (low word, high word): WGSL has no 64-bit integers. Two's-complement
#: add/sub/mul wrap as the reference does; i64 -> f32 rounds once (to nearest even) like a C cast.
I64 = """
fn rlx_add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  let lo = a.x + b.x; return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}
fn rlx_sub64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}
fn rlx_neg64(a: vec2<u32>) -> vec2<u32> { return rlx_sub64(vec2<u32>(0u, 0u), a); }
fn rlx_mulw64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  let p = rlx_mul64(a.x, b.x); return vec2<u32>(p.y, p.x + a.x * b.y + a.y * b.x);
}
fn rlx_lt64(a: vec2<u32>, b: vec2<u32>) -> bool {
  let ah = bitcast<i32>(a.y); let bh = bitcast<i32>(b.y); return ah < bh || (ah == bh && a.x < b.x);
}
fn rlx_eq64(a: vec2<u32>, b: vec2<u32>) -> bool { return a.x == b.x && a.y == b.y; }
fn rlx_i64_f32(a: vec2<u32>) -> f32 {
  let neg = bitcast<i32>(a.y) < 0;
  var m = a; if (neg) { m = rlx_neg64(a); }
  var r = 0.0;
  if (m.y == 0u) { r = f32(m.x); } else {
    // the top 32 bits, with a sticky bit for everything below: one correctly rounded u32 -> f32
    let n = countLeadingZeros(m.y); var top = m.y; var rest = m.x;
    if (n > 0u) { top = (m.y << n) | (m.x >> (32u - n)); rest = m.x << n; }
    r = ldexp(f32(top | select(0u, 1u, rest != 0u)), i32(32u - n));
  }
  return select(r, -r, neg);
}
"""

#: f16/bf16 storage: 2-byte elements converted exactly to f32 on load and rounded to nearest even on
#: store, in integer arithmetic (WGSL leaves pack2x16float's rounding and overflow to the
#: implementation, and shader-f16 is optional: this works on every adapter).
HALF = """
fn rlx_ld16(b: i32, a: u32) -> u32 { return (rd(b, a) >> ((a & 2u) * 8u)) & 0xffffu; }
fn rlx_f16_f32(h: u32) -> f32 {
  let s = (h & 0x8000u) << 16u; let e = (h >> 10u) & 0x1fu; let m = h & 0x3ffu;
  if (e == 0u) { let v = f32(m) * 5.960464477539063e-08; return select(v, -v, s != 0u); }
  if (e == 31u) { return bitcast<f32>(s | 0x7f800000u | (m << 13u)); }
  return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}
fn rlx_f32_f16(x: f32) -> u32 {
  let b = bitcast<u32>(x); let s = (b >> 16u) & 0x8000u; let a = b & 0x7fffffffu;
  if (a > 0x7f800000u) { return s | 0x7e00u; }
  if (a >= 0x477ff000u) { return s | 0x7c00u; }  // 65520 and up round to inf
  if (a >= 0x38800000u) { let r = a - 0x38000000u; return s | ((r + 0xfffu + ((r >> 13u) & 1u)) >> 13u); }
  if (a < 0x33000000u) { return s; }
  let e = a >> 23u; let m = (a & 0x7fffffu) | 0x800000u; let sh = 126u - e;  // subnormal: units of 2^-24
  let q = m >> sh; let rem = m & ((1u << sh) - 1u); let hf = 1u << (sh - 1u);
  return s | (q + select(0u, 1u, rem > hf || (rem == hf && (q & 1u) == 1u)));
}
fn rlx_bf16_f32(h: u32) -> f32 { return bitcast<f32>(h << 16u); }
fn rlx_f32_bf16(x: f32) -> u32 {
  let b = bitcast<u32>(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) { return ((b >> 16u) & 0x8000u) | 0x7fc0u; }
  return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}
fn rlx_round_f16(x: f32) -> f32 { return rlx_f16_f32(rlx_f32_f16(x)); }
fn rlx_round_bf16(x: f32) -> f32 { return rlx_bf16_f32(rlx_f32_bf16(x)); }
"""
HALVES = frozenset({DType.F16, DType.BF16})

#: sin/cos/pow without f64 or i64 (WGSL has neither): Payne-Hanek argument reduction with 32-bit
#: integer arithmetic (64-bit products from 16-bit halves), Cephes polynomials, and a pow whose
#: exponent b*log2|a| keeps its b*e part exact (fma). Appended only to shaders that call them.
TRIG_POW = """
var<private> TWO_OVER_PI: array<u32, 10> = array<u32, 10>(0xA2F9836Eu, 0x4E441529u, 0xFC2757D1u,
  0xF534DDC0u, 0xDB629599u, 0x3C439041u, 0xFE5163ABu, 0xDEBBC561u, 0xB7246E3Au, 0x424DD2E0u);
fn rlx_bits32(j: i32) -> u32 {  // bits j..j+31 of 2/pi (bit j has weight 2^-j; bits j <= 0 are 0)
  let p = j - 1;
  if (p < 0) { let n = -p; if (n >= 32) { return 0u; } return TWO_OVER_PI[0] >> u32(n); }
  let w = p >> 5u; let o = u32(p & 31);
  var hi = 0u; var lo = 0u;
  if (w < 10) { hi = TWO_OVER_PI[w]; }
  if (w + 1 < 10) { lo = TWO_OVER_PI[w + 1]; }
  if (o == 0u) { return hi; }
  return (hi << o) | (lo >> (32u - o));
}
// |x| * 2/pi mod 4 exactly (Payne-Hanek): quadrant (y) and the angle in [-pi/4, pi/4] (x)
fn rlx_reduce(x: f32) -> vec2<f32> {
  let u = bitcast<u32>(abs(x));
  var E = i32(u >> 23u);
  var mant = u & 0x7fffffu;
  if (E > 0) { mant |= 0x800000u; } else { E = 1; }
  let j0 = E - 152;
  let c1h = rlx_bits32(j0 + 1); let c1l = rlx_bits32(j0 + 33); let c2h = rlx_bits32(j0 + 65);
  let p = rlx_mul64(mant, c1l);
  let lo = p.y + rlx_mul64(mant, c2h).x;
  let hi = p.x + mant * c1h + select(0u, 1u, lo < p.y);
  var q = hi >> 30u; var h = hi & 0x3fffffffu; var l = lo; var sgn = 1.0;
  if ((h & 0x20000000u) != 0u) {  // fraction >= 0.5: take 1 - fraction, exactly, in the integers
    l = ~lo + 1u; h = (~h & 0x3fffffffu) + select(0u, 1u, lo == 0u); q += 1u; sgn = -1.0;
  }
  let f = sgn * (f32(h) * 9.313225746154785e-10 + f32(l) * 2.168404344971009e-19);
  return vec2<f32>(f * 1.5707963267948966, f32(q & 3u));
}
// sin/cos on [-pi/4, pi/4] by polynomial (Cephes sinf/cosf, ~1 ulp): implementations may give
// the built-ins a fast hardware approximation.
fn rlx_sinp(r: f32) -> f32 {
  let z = r * r;
  return r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * (-1.9515295891e-4)));
}
fn rlx_cosp(r: f32) -> f32 {
  let z = r * r;
  return 1.0 - 0.5 * z
         + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
}
fn rlx_sin(x: f32) -> f32 {
  if (rlx_isnan(x) || rlx_isinf(x)) { return rlx_nan(); }
  if (abs(x) <= 0.78539816) { return rlx_sinp(x); }
  let rq = rlx_reduce(x); let r = rq.x; let q = i32(rq.y);
  var v = -rlx_cosp(r);
  if (q == 0) { v = rlx_sinp(r); }
  else if (q == 1) { v = rlx_cosp(r); }
  else if (q == 2) { v = -rlx_sinp(r); }
  return select(v, -v, x < 0.0);
}
fn rlx_cos(x: f32) -> f32 {
  if (rlx_isnan(x) || rlx_isinf(x)) { return rlx_nan(); }
  if (abs(x) <= 0.78539816) { return rlx_cosp(x); }
  let rq = rlx_reduce(x); let r = rq.x; let q = i32(rq.y);
  if (q == 0) { return rlx_cosp(r); }
  if (q == 1) { return -rlx_sinp(r); }
  if (q == 2) { return -rlx_cosp(r); }
  return rlx_sinp(r);
}
// Products are split with bit masks, not fma: lavapipe does not fuse fma, and the masks survive any
// algebraic rewriting a driver may do. hi12(x) keeps the top 12 significant bits, x - hi12(x) the rest,
// so products of the halves are exact.
fn rlx_hi12(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) & 0xfffff000u); }
fn rlx_prod_err(a: f32, b: f32, p: f32) -> f32 {  // a*b - p exactly (Dekker), for p = a*b rounded
  let a1 = rlx_hi12(a); let a2 = a - a1; let b1 = rlx_hi12(b); let b2 = b - b1;
  return ((a1 * b1 - p) + a1 * b2 + a2 * b1) + a2 * b2;
}
// log2(m) for finite m > 0 as e + hi + lo (returned as (e, hi, lo)), |error| ~ 2^-40: the drivers'
// log2 may be off by 2^-21 (the Vulkan limit), which b * log2 would multiply into a 1e-5 pow error.
// ln y = 2 atanh(z), z = (y - 1) / (y + 1), y in [sqrt(1/2), sqrt(2)), in double-f32 where it matters.
fn rlx_log2x(m: f32) -> vec3<f32> {
  let fe = frexp(m); var y = fe.fract; var e = f32(fe.exp);
  if (y < 0.70710678) { y = y * 2.0; e = e - 1.0; }
  let num = y - 1.0;  // exact (Sterbenz)
  // y + 1 exactly as dh + dl (a rounded y + 1 loses a bit; (y + 1) - 1 would be folded back to y)
  let yh = rlx_hi12(y); let dl = y - yh; let dh = yh + 1.0; let den = dh + dl;
  let zh = num / den;
  let p1 = zh * dh; let p2 = zh * dl;
  let zl = (((num - p1) - p2) - rlx_prod_err(zh, dh, p1) - rlx_prod_err(zh, dl, p2)) / den;
  let w = zh * zh;
  let p = 0.33333333333 + w * (0.2 + w * (0.14285714286 + w * (0.11111111111 + w * (0.09090909091
          + w * (0.07692307692 + w * 0.06666666667)))));
  let ah = 2.0 * zh; let al = 2.0 * zl + 2.0 * zh * w * p;  // ln y = ah + al
  let ch = 1.44269502162933349609375; let cl = 1.925962991126617468e-08;  // 1/ln 2
  let lh = ah * ch; let ll = rlx_prod_err(ah, ch, lh) + (ah * cl + al * ch);
  return vec3<f32>(e, lh, ll);
}
fn rlx_exp2p(x: f32) -> f32 {  // 2^x on [-1/2, 1/2] (Cephes exp2f, ~1 ulp): exp2 may be approximate
  return 1.0 + x * (6.931472028550421e-1 + x * (2.402264791363012e-1 + x * (5.550332471162809e-2
         + x * (9.618437357674640e-3 + x * (1.339887440266574e-3 + x * 1.535336188319500e-4)))));
}
fn rlx_pow(a: f32, b: f32) -> f32 {
  if (b == 0.0 || a == 1.0) { return 1.0; }
  if (rlx_isnan(a) || rlx_isnan(b)) { return rlx_nan(); }
  if (rlx_isinf(b)) {
    let m = abs(a); if (m == 1.0) { return 1.0; }
    return select(0.0, rlx_inf(), (m > 1.0) == (b > 0.0));
  }
  let bint = floor(b) == b; let odd = bint && (abs(b) % 2.0) == 1.0;
  let neg = (bitcast<u32>(a) >> 31u) != 0u;
  if (neg && a != 0.0 && !rlx_isinf(a) && !bint) { return rlx_nan(); }
  let m = abs(a); var r = 0.0;
  if (m == 0.0) { r = select(rlx_inf(), 0.0, b > 0.0); }
  else if (rlx_isinf(m)) { r = select(0.0, rlx_inf(), b > 0.0); }
  else {
    // b * log2 m = b*e + b*hi + b*lo as exact partial products; their integer parts and exact
    // fractions are summed separately, so the exponent keeps ~2^-24 absolute accuracy for any |b|
    let lg = rlx_log2x(m); let e = lg.x;
    let b1 = rlx_hi12(b); let b2 = b - b1; let l1 = rlx_hi12(lg.y); let l2 = lg.y - l1;
    let p1 = b1 * e; let p2 = b2 * e; let p3 = b1 * l1; let p4 = b1 * l2 + b2 * l1;
    var n = floor(p1) + floor(p2) + floor(p3) + floor(p4);
    var f = (p1 - floor(p1)) + (p2 - floor(p2)) + (p3 - floor(p3)) + (p4 - floor(p4)) + (b2 * l2 + b * lg.z);
    let nf = round(f); n = n + nf; f = f - nf;  // f in [-1/2, 1/2]
    if (n > 130.0) { r = rlx_inf(); } else if (n < -160.0) { r = 0.0; }
    else {
      let ni = i32(n);
      if (ni < -120) { r = ldexp(ldexp(rlx_exp2p(f), ni + 60), -60); } else { r = ldexp(rlx_exp2p(f), ni); }
    }
  }
  return select(r, -r, neg && odd);
}
"""

ENTRY = ("@compute @workgroup_size(%(wx)d, %(wy)d)\n"
         "fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) ng: vec3<u32>,\n"
         "        @builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {\n")


def header() -> str:
    return HEADER


def entry(wx: int = WG, wy: int = 1) -> str:
    return ENTRY % {"wx": wx, "wy": wy}


def load(dt: DType, b: str, a: str) -> str:
    if dt is DType.I64:  # two little-endian words
        return f"vec2<u32>(rd({b}, {a}), rd({b}, ({a}) + 4u))"
    if dt in HALVES:
        return f"rlx_{'f16' if dt is DType.F16 else 'bf16'}_f32(rlx_ld16({b}, {a}))"
    return {DType.F32: "ldf", DType.I32: "ldi", DType.BOOL: "ldb"}[dt] + f"({b}, {a})"


_WGSL = DIALECTS["wgsl"]
#: WGSL built-ins replaced by this module's helpers (:data:`HEADER`): IEEE overflow, underflow and
#: special values as the reference computes them (the built-ins leave them to the implementation).
HELPERS = {"exp": "rlx_exp", "log": "rlx_log", "tanh": "rlx_tanh", "sqrt": "rlx_sqrt", "sin": "rlx_sin",
           "cos": "rlx_cos", "pow": "rlx_pow"}


def _math(op: str, dt: DType) -> str:
    if op == "pow" and not dt.is_float:
        raise IRError("integer pow has no WGSL rule", fix="compute pow in f32")
    return HELPERS.get(op) or {"round": "round"}.get(op, _WGSL.math(op, dt))


def _literal(v: float, dt: DType) -> str:
    s = _WGSL.literal(v, dt)
    return {"inf": "rlx_inf()", "-inf": "(-rlx_inf())", "nan": "rlx_nan()"}.get(s, s)


_CMP64 = {"equal": "rlx_eq64({a}, {b})", "not_equal": "(!rlx_eq64({a}, {b}))", "less": "rlx_lt64({a}, {b})",
          "less_equal": "(!rlx_lt64({b}, {a}))", "greater": "rlx_lt64({b}, {a})",
          "greater_equal": "(!rlx_lt64({a}, {b}))", "add": "rlx_add64({a}, {b})",
          "sub": "rlx_sub64({a}, {b})", "mul": "rlx_mulw64({a}, {b})", "neg": "rlx_neg64({a})",
          "maximum": "select({b}, {a}, rlx_lt64({b}, {a}))",
          "minimum": "select({b}, {a}, rlx_lt64({a}, {b}))"}


def _rule64(op: str, args: Sequence[str], in_types: Sequence[DType], out: DType) -> str | None:
    """An op with an i64 operand or result (vec2<u32>), or IRError when WGSL has no rule for it."""
    x = args[0]
    if op == "cast":
        src = in_types[0]
        if src is out:
            return x
        if out is DType.I64 and src is DType.I32:
            return f"vec2<u32>(bitcast<u32>({x}), select(0u, 0xffffffffu, {x} < 0))"
        if out is DType.I64 and src is DType.BOOL:
            return f"vec2<u32>(select(0u, 1u, {x}), 0u)"
        if src is DType.I64 and out is DType.F32:
            return f"rlx_i64_f32({x})"
        if src is DType.I64 and out is DType.I32:
            return f"bitcast<i32>({x}.x)"
        if src is DType.I64 and out is DType.BOOL:
            return f"(({x}.x | {x}.y) != 0u)"
    elif op == "where":
        return None  # the shared select() takes vectors
    elif op in _CMP64:
        return _CMP64[op].format(a=x, b=args[1] if len(args) > 1 else "")
    raise IRError(f"{op}({', '.join(t.value for t in in_types)}) -> {out.value} has no WGSL rule here "
                  "(i64 is emulated as two 32-bit words)", fix="compute in i32/f32")


def _rule_half(op: str, args: Sequence[str], in_types: Sequence[DType], out: DType, attrs: dict) -> str:
    """Casts from/to f16/bf16 (held as f32 values); other ops on them are refused: the core's
    compute_f16_in_f32 rewrite runs them in f32 between these casts."""
    src, dst = in_types[0], out
    if op != "cast" or DType.I64 in (src, dst):
        raise IRError(f"{op}({', '.join(t.value for t in in_types)}) -> {out.value}: f16/bf16 have casts "
                      "only here", fix="the core computes f16/bf16 ops in f32 between casts")
    s32 = DType.F32 if src in HALVES else src
    d32 = DType.F32 if dst in HALVES else dst
    inner = args[0] if s32 is d32 else render_op(WGSL, "cast", args, [s32], d32, {"to": d32})
    if dst in HALVES:
        return f"rlx_round_{'f16' if dst is DType.F16 else 'bf16'}({inner})"
    return inner


def _rule(op: str, args: Sequence[str], in_types: Sequence[DType], out: DType, attrs: dict) -> str | None:
    if out in HALVES or any(t in HALVES for t in in_types):
        return _rule_half(op, args, in_types, out, attrs)
    if out is DType.I64 or DType.I64 in in_types:
        return _rule64(op, args, in_types, out)
    if op == "cast" and out is DType.BOOL and in_types[0] is DType.BOOL:
        return args[0]  # WGSL cannot compare a bool with 0
    f32 = bool(in_types) and in_types[0] is DType.F32
    if op in ("maximum", "minimum") and f32:
        return f"{'rlx_max' if op == 'maximum' else 'rlx_min'}({args[0]}, {args[1]})"
    if op == "sign" and f32:
        return f"rlx_sign({args[0]})"
    # an unordered comparison: lavapipe compiles WGSL's != on floats as an ordered one (NaN != x false)
    if op == "not_equal" and f32:
        return f"(!({args[0]} == {args[1]}))"
    if op == "cast" and out is DType.BOOL and f32:
        return f"(!({args[0]} == 0.0))"
    if op == "cast" and in_types[0] is DType.F32 and out is DType.I32:
        # WGSL's i32(f32) saturates; NaN has no defined result: the reference's C cast gives MIN
        return f"select(i32({args[0]}), -2147483647 - 1, rlx_isnan({args[0]}))"
    return None


#: The shared WGSL dialect with this backend's helpers.
WGSL = dataclasses.replace(_WGSL, types=dict(TYPES), math=_math, literal=_literal, idiv="rlx_idiv({a}, {b})",
                           rule=_rule)


@lru_cache(maxsize=4096)
def elementwise(program: str, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str:
    """Meta: n, rank, out_off, 0, shape[rank], then per input: buf, off, strides[rank]."""
    nin = len(in_dtypes)
    for dt in (*in_dtypes, out_dtype):
        if dt not in TYPES:
            raise IRError(f"no WGSL storage for {dt}", fix="cast to f32/i32/bool first")
    lines, res, rdt = render_program(program, [f"x{k}" for k in range(nin)], in_dtypes, WGSL)
    if rdt is not out_dtype:
        raise IRError(f"program yields {rdt}, the node {out_dtype}", fix="check the fused program")
    ot = TYPES[out_dtype]
    # helpers by what the program uses (a fused chain may pass through i64 or f16 inside)
    body = "\n".join(lines)
    trig = re.search(r"rlx_(sin|cos|pow)\(", body) is not None
    i64 = DType.I64 in in_dtypes or out_dtype is DType.I64 or "vec2<u32>" in body or "64(" in body
    half = any(t in HALVES for t in (*in_dtypes, out_dtype)) or "rlx_round_" in body
    extra = ((MUL64 if trig or i64 else "") + (I64 if i64 else "") + (TRIG_POW if trig else "")
             + (HALF if half else ""))
    src = [header() + extra, f"fn value_at(i: u32) -> {ot} {{", "  let rank = M[1];"]
    src += [f"  var e{k}: i32 = 0; let p{k} = 4 + rank + {k} * (rank + 2);" for k in range(nin)]
    src += ["  var rem = i;", "  for (var d = rank - 1; d >= 0; d--) {",
            "    let s = u32(M[4 + d]); let c = i32(rem % s); rem = rem / s;"]
    src += [f"    e{k} += c * M[p{k} + 2 + d];" for k in range(nin)]
    src += ["  }"]
    for k, dt in enumerate(in_dtypes):
        addr = f"u32(M[p{k} + 1]) + u32(e{k}) * {ESIZE[dt]}u"
        src.append(f"  let x{k}: {TYPES[dt]} = {load(dt, f'M[p{k}]', addr)};")
    src += ["  " + ln for ln in lines] + [f"  return {res};", "}", entry()]
    src += ["  let n = u32(M[0]); let o = u32(M[2]) >> 2u; let stp = ng.x * 64u;"]
    if out_dtype is DType.BOOL:
        src += ["  for (var t = gid.x; t < (n + 3u) / 4u; t += stp) {",
                "    var w = 0u;",
                "    for (var k = 0u; k < 4u; k++) { let i = 4u * t + k;",
                "      if (i < n) { if (value_at(i)) { w |= 1u << (8u * k); } } }",
                "    A[o + t] = w;", "  }", "}"]
    elif out_dtype in HALVES:
        cv = "rlx_f32_f16" if out_dtype is DType.F16 else "rlx_f32_bf16"
        src += ["  for (var t = gid.x; t < (n + 1u) / 2u; t += stp) {",
                f"    var w = {cv}(value_at(2u * t));",
                f"    if (2u * t + 1u < n) {{ w |= {cv}(value_at(2u * t + 1u)) << 16u; }}",
                "    A[o + t] = w;", "  }", "}"]
    elif out_dtype is DType.I64:
        src += ["  for (var i = gid.x; i < n; i += stp) {",
                "    let v = value_at(i); A[o + 2u * i] = v.x; A[o + 2u * i + 1u] = v.y;", "  }", "}"]
    else:
        src += ["  for (var i = gid.x; i < n; i += stp) {",
                "    A[o + i] = bitcast<u32>(value_at(i));", "  }", "}"]
    return "\n".join(src) + "\n"


@cache
def copy32() -> str:
    """Strided 4-byte copy. Meta: n, rank, in_buf, in_off, out_off, in_base_elems, shape[rank],
    istride[rank], ostride[rank] (strides in elements, may be negative)."""
    return header() + entry() + """  let n = u32(M[0]); let rank = M[1];
  let ib = M[2]; let io = u32(M[3]) >> 2u; let oo = u32(M[4]) >> 2u;
  for (var i = gid.x; i < n; i += ng.x * 64u) {
    var rem = i; var ie = M[5]; var oe = 0;
    for (var d = rank - 1; d >= 0; d--) {
      let s = u32(M[6 + d]); let c = i32(rem % s); rem = rem / s;
      ie += c * M[6 + rank + d]; oe += c * M[6 + 2 * rank + d];
    }
    A[oo + u32(oe)] = rd(ib, (io + u32(ie)) * 4u);
  }
}
"""


@cache
def fill32() -> str:
    """Meta: n, out_off, bits."""
    return header() + entry() + """  let n = u32(M[0]); let o = u32(M[1]) >> 2u; let v = bitcast<u32>(M[2]);
  for (var i = gid.x; i < n; i += ng.x * 64u) { A[o + i] = v; }
}
"""


#: Every matmul shader's prologue: sizes, operand bases/offsets and the batch-broadcast offsets
#: (ae, be) of this workgroup's batch index.
_MATMUL_META = """  let Mr = M[0]; let N = M[1]; let K = M[2];
  let ab = M[3]; let bb = M[5]; let ao = u32(M[4]); let bo = u32(M[6]); let co = u32(M[7]);
  let br = M[8]; let bi = wid.z; var rem = bi; var ae = 0; var be = 0;
  for (var d = br - 1; d >= 0; d--) {
    let s = u32(M[9 + d]); let c = i32(rem % s); rem = rem / s;
    ae += c * M[9 + br + d]; be += c * M[9 + 2 * br + d];
  }
"""


def _conv(dt: DType) -> tuple[str, str, str]:
    """(WGSL type, load helper, store expression of ``acc``) for f32/i32."""
    t = TYPES[dt]
    return t, ("ldf" if dt is DType.F32 else "ldi"), "bitcast<u32>(acc)"


@cache
def matmul(dt: DType) -> str:
    """Tiled (16x16 workgroup memory) batched matmul, for GPUs. Meta: M, N, K, a_buf, a_off, b_buf,
    b_off, c_off, brank, bshape[brank], astride[brank], bstride[brank] (batch strides in elements)."""
    t, ld, st = _conv(dt)
    return header() + f"""var<workgroup> As: array<array<{t}, 16>, 16>;
var<workgroup> Bs: array<array<{t}, 16>, 16>;
""" + entry(16, 16) + _MATMUL_META + f"""  let row = i32(wid.y) * 16 + i32(lid.y);
  let col = i32(wid.x) * 16 + i32(lid.x);
  let ly = lid.y; let lx = lid.x;
  var acc: {t} = {t}(0);
  for (var k0 = 0; k0 < K; k0 += 16) {{
    let ka = k0 + i32(lx); let kb = k0 + i32(ly);
    var av: {t} = {t}(0); var bv: {t} = {t}(0);
    if (row < Mr && ka < K) {{ av = {ld}(ab, ao + u32(ae + row * K + ka) * 4u); }}
    if (kb < K && col < N) {{ bv = {ld}(bb, bo + u32(be + kb * N + col) * 4u); }}
    As[ly][lx] = av; Bs[ly][lx] = bv;
    workgroupBarrier();
    for (var k = 0u; k < 16u; k++) {{ acc += As[ly][k] * Bs[k][lx]; }}
    workgroupBarrier();
  }}
  if (row < Mr && col < N) {{ A[(co >> 2u) + bi * u32(Mr * N) + u32(row * N + col)] = {st}; }}
}}
"""


@cache
def matmul_simple(dt: DType, bufs: str = "AA") -> str:
    """Matmul without workgroup memory (one invocation per output column of four rows, 64 along N):
    what CPU implementations (lavapipe) run fastest, since barriers are costly there. ``bufs``: the
    storage arrays of A and B (``A`` arena, ``W`` constants), baked into the shader. Meta as
    :func:`matmul`."""
    t, _ld, _st = _conv(dt)
    ba, bb_ = bufs[0], bufs[1]
    return header() + entry() + _MATMUL_META + f"""  let r0 = min(i32(wid.y) * 4, max(Mr - 4, 0));
  let col = i32(gid.x);
  if (col >= N) {{ return; }}
  let pa = (ao >> 2u) + u32(ae + r0 * K); let pb = (bo >> 2u) + u32(be + col);
  var a0: {t} = {t}(0); var a1: {t} = {t}(0); var a2: {t} = {t}(0); var a3: {t} = {t}(0);
  let m1 = select(0, K, Mr > 1); let m2 = select(0, 2 * K, Mr > 2); let m3 = select(0, 3 * K, Mr > 3);
  for (var k = 0; k < K; k++) {{
    let bv = bitcast<{t}>({bb_}[pb + u32(k * N)]); let p = pa + u32(k);
    a0 += bitcast<{t}>({ba}[p]) * bv; a1 += bitcast<{t}>({ba}[p + u32(m1)]) * bv;
    a2 += bitcast<{t}>({ba}[p + u32(m2)]) * bv; a3 += bitcast<{t}>({ba}[p + u32(m3)]) * bv;
  }}
  let oc = (co >> 2u) + bi * u32(Mr * N) + u32(col);
  // the last block is shifted to stay in bounds: it recomputes some rows (same values)
  A[oc + u32(r0 * N)] = bitcast<u32>(a0);
  if (r0 + 1 < Mr) {{ A[oc + u32((r0 + 1) * N)] = bitcast<u32>(a1); }}
  if (r0 + 2 < Mr) {{ A[oc + u32((r0 + 2) * N)] = bitcast<u32>(a2); }}
  if (r0 + 3 < Mr) {{ A[oc + u32((r0 + 3) * N)] = bitcast<u32>(a3); }}
}}
"""


@cache
def matmul_4x4(dt: DType, bufs: str = "AA") -> str:
    """Untiled matmul computing a 4x4 block per invocation (M and N multiples of 4): sixteen
    multiply-adds per eight loads, for CPU adapters. Meta as :func:`matmul`."""
    t, _ld, _st = _conv(dt)
    v = f"vec4<{t}>"
    ba, bb_ = bufs[0], bufs[1]
    return header() + entry() + _MATMUL_META + f"""  let row = i32(wid.y) * 4; let col = i32(gid.x) * 4;
  if (col >= N) {{ return; }}
  let pa = (ao >> 2u) + u32(ae + row * K); let pb = (bo >> 2u) + u32(be + col);
  var c0 = {v}(); var c1 = {v}(); var c2 = {v}(); var c3 = {v}();
  let k1 = u32(K); let k2 = 2u * u32(K); let k3 = 3u * u32(K);
  for (var k = 0u; k < u32(K); k++) {{
    let q = pb + k * u32(N);
    let bv = bitcast<{v}>(vec4<u32>({bb_}[q], {bb_}[q + 1u], {bb_}[q + 2u], {bb_}[q + 3u]));
    let p = pa + k;
    c0 += bitcast<{t}>({ba}[p]) * bv; c1 += bitcast<{t}>({ba}[p + k1]) * bv;
    c2 += bitcast<{t}>({ba}[p + k2]) * bv; c3 += bitcast<{t}>({ba}[p + k3]) * bv;
  }}
  let oc = (co >> 2u) + bi * u32(Mr * N) + u32(row * N + col); let n1 = u32(N);
  let u0 = bitcast<vec4<u32>>(c0); let u1 = bitcast<vec4<u32>>(c1);
  let u2 = bitcast<vec4<u32>>(c2); let u3 = bitcast<vec4<u32>>(c3);
  for (var j = 0u; j < 4u; j++) {{
    A[oc + j] = u0[j]; A[oc + n1 + j] = u1[j]; A[oc + 2u * n1 + j] = u2[j]; A[oc + 3u * n1 + j] = u3[j];
  }}
}}
"""


@cache
def linear() -> str:
    """y[r, n] = sum_k x[r, k] * w[n, k] + b[n]. Meta: R, N, K, x_buf, x_off, w_buf, w_off, b_buf,
    b_off, out_off, wt (1: w is stored transposed, (K, N): the program pre-transposes constant
    weights so that neighbouring invocations read neighbouring words). Rows loop over the grid's y
    (at most 65535 workgroups a dimension)."""
    return header() + entry() + """  let R = M[0]; let N = M[1]; let K = M[2];
  let xb = M[3]; let xo = u32(M[4]) >> 2u; let wb = M[5]; let wo = u32(M[6]) >> 2u;
  let bb = M[7]; let bo = u32(M[8]); let oo = u32(M[9]) >> 2u; let wt = M[10];
  let col = i32(gid.x);
  if (col >= N) { return; }
  let bias = ldf(bb, bo + u32(col) * 4u);
  for (var row = i32(wid.y); row < R; row += i32(ng.y)) {
    let px = xo + u32(row * K);
    var acc = 0.0;
    if (wt == 1 && xb == 0 && wb == 1) {
      let pw = wo + u32(col);
      for (var k = 0; k < K; k++) { acc += bitcast<f32>(A[px + u32(k)]) * bitcast<f32>(W[pw + u32(k * N)]); }
    } else if (wt == 1) {
      for (var k = 0; k < K; k++) {
        acc += ldf(xb, (px + u32(k)) * 4u) * ldf(wb, (wo + u32(k * N + col)) * 4u);
      }
    } else {
      for (var k = 0; k < K; k++) {
        acc += ldf(xb, (px + u32(k)) * 4u) * ldf(wb, (wo + u32(col * K + k)) * 4u);
      }
    }
    A[oo + u32(row * N + col)] = bitcast<u32>(acc + bias);
  }
}
"""


@cache
def reduce(op: str, dt: DType) -> str:
    """One invocation per output element. Meta: nout, nkept, nred, in_buf, in_off, out_off, R,
    kept (size, stride)*, red (size, stride)*."""
    t, ld, _st = _conv(dt)
    init = {"reduce_sum": f"{t}(0)", "reduce_mean": "0.0", "reduce_prod": f"{t}(1)"}.get(op, "v0")
    if op in ("reduce_sum", "reduce_mean") and dt is DType.F32:
        # compensated (Kahan) sum; an infinity or NaN just propagates
        body = ("if (rlx_isinf(acc) || rlx_isinf(v) || rlx_isnan(v)) { acc += v; } else { let y = v - comp; "
                "let s = acc + y; comp = (s - acc) - y; acc = s; }")
    elif op in ("reduce_sum", "reduce_mean"):
        body = "acc += v;"
    elif op == "reduce_prod":
        body = "acc *= v;"
    else:
        cmp = ">" if op == "reduce_max" else "<"
        body = (f"if (v {cmp} acc || rlx_isnan(v)) {{ acc = v; }}" if dt is DType.F32
                else f"if (v {cmp} acc) {{ acc = v; }}")
    fin = "acc = acc / f32(R);" if op == "reduce_mean" else ""
    return header() + entry() + f"""  let n = u32(M[0]); let nk = M[1]; let nr = M[2]; let ib = M[3];
  let io = u32(M[4]); let oo = u32(M[5]) >> 2u; let R = M[6];
  for (var i = gid.x; i < n; i += ng.x * 64u) {{
    var rem = i; var e = 0;
    for (var d = nk - 1; d >= 0; d--) {{
      let s = u32(M[7 + 2 * d]); let c = i32(rem % s); rem = rem / s; e += c * M[8 + 2 * d];
    }}
    let rb = 7 + 2 * nk;
    var v0: {t} = {t}(0);
    if (R > 0) {{ v0 = {ld}(ib, io + u32(e) * 4u); }}
    var acc: {t} = {init}; var comp = 0.0;
    for (var r = 0; r < R; r++) {{
      var rr = u32(r); var f = e;
      for (var d = nr - 1; d >= 0; d--) {{
        let s = u32(M[rb + 2 * d]); let c = i32(rr % s); rr = rr / s; f += c * M[rb + 2 * d + 1];
      }}
      let v = {ld}(ib, io + u32(f) * 4u);
      {body}
    }}
    {fin}
    A[oo + i] = bitcast<u32>(acc);
  }}
}}
"""


@cache
def rows(op: str) -> str:
    """One invocation per row of ``cols`` contiguous f32. Meta: rows, cols, x_buf, x_off, out_off,
    eps bits, g_buf, g_off, b_buf, b_off."""
    x = "ldf(xb, xo + (r * u32(C) + u32(j)) * 4u)"
    out = "A[oo + r * u32(C) + u32(j)]"
    if op == "layer_norm":
        body = f"""
    var mean = 0.0; var comp = 0.0;
    for (var j = 0; j < C; j++) {{ let v = {x};
      if (rlx_isinf(mean) || rlx_isinf(v) || rlx_isnan(v)) {{ mean += v; continue; }}
      let y = v - comp; let s = mean + y; comp = (s - mean) - y; mean = s; }}
    mean = mean / f32(C);
    var vr = 0.0; comp = 0.0;
    for (var j = 0; j < C; j++) {{ let d = {x} - mean; let dd = d * d;
      if (rlx_isinf(vr) || rlx_isinf(dd) || rlx_isnan(d)) {{ vr += dd; continue; }}
      let y = dd - comp; let s = vr + y; comp = (s - vr) - y; vr = s; }}
    vr = vr / f32(C);
    let inv = 1.0 / sqrt(vr + eps);
    for (var j = 0; j < C; j++) {{
      {out} = bitcast<u32>(({x} - mean) * inv * ldf(gb, go + u32(j) * 4u) + ldf(bb, bo + u32(j) * 4u)); }}"""
    else:
        final = "({x} - mx) - rlx_log(s)" if op == "log_softmax" else "rlx_exp({x} - mx) / s"
        body = f"""
    var mx = -rlx_inf();
    for (var j = 0; j < C; j++) {{ let v = {x}; if (v > mx || rlx_isnan(v)) {{ mx = v; }} }}
    if (rlx_isinf(mx) && mx < 0.0) {{ mx = 0.0; }}
    var s = 0.0;
    for (var j = 0; j < C; j++) {{ s += rlx_exp({x} - mx); }}
    for (var j = 0; j < C; j++) {{ {out} = bitcast<u32>({final.format(x=x)}); }}"""
    return header() + entry() + f"""  let n = u32(M[0]); let C = M[1]; let xb = M[2]; let xo = u32(M[3]);
  let oo = u32(M[4]) >> 2u; let eps = bitcast<f32>(M[5]);
  let gb = M[6]; let go = u32(M[7]); let bb = M[8]; let bo = u32(M[9]);
  for (var r = gid.x; r < n; r += ng.x * 64u) {{{body}
  }}
}}
"""


@cache
def gather(idx_esize: int) -> str:
    """Meta: n, nidx, inner, D, x_buf, x_off, i_buf, i_off, out_off (4-byte elements).

    Indices follow ONNX ([-D, D-1], negatives once from the end). One outside (only possible when
    computed on the device: the host checks inputs and constants) gives 0 and reads nothing: an
    unchecked index would read other tensors of the arena. An i64 index counts only if its high
    word is the sign extension of its low word (2**32 + 1 must not become 1)."""
    hi = "ldi(ib, a + 4u)" if idx_esize == 8 else "lo >> 31u"
    return header() + entry() + f"""  let n = u32(M[0]); let ni = u32(M[1]); let inner = u32(M[2]);
  let D = M[3]; let xb = M[4]; let xo = u32(M[5]) >> 2u; let ib = M[6];
  let io = u32(M[7]); let oo = u32(M[8]) >> 2u;
  for (var i = gid.x; i < n; i += ng.x * 64u) {{
    let k = i % inner; let j = (i / inner) % ni; let o = i / (inner * ni);
    let a = io + j * {idx_esize}u; let lo = ldi(ib, a); let hi = {hi};
    var idx = lo; if (idx < 0) {{ idx += D; }}
    let ok = hi == (lo >> 31u) && idx >= 0 && idx < D;
    let src = xo + (o * u32(D) + u32(select(0, idx, ok))) * inner + k;
    var v = 0u;
    if (ok) {{ v = rd(xb, src * 4u); }}
    A[oo + i] = v;
  }}
}}
"""


@cache
def copy8() -> str:
    """Strided byte copy into a contiguous output, one invocation per output word. Meta as copy32
    (strides in bytes; the output strides are unused: it is contiguous)."""
    return header() + entry() + """  let n = u32(M[0]); let rank = M[1];
  let ib = M[2]; let io = u32(M[3]); let oo = u32(M[4]) >> 2u;
  for (var t = gid.x; t < (n + 3u) / 4u; t += ng.x * 64u) {
    var w = 0u;
    for (var k = 0u; k < 4u; k++) {
      let i = 4u * t + k; if (i >= n) { break; }
      var rem = i; var ie = M[5];
      for (var d = rank - 1; d >= 0; d--) {
        let s = u32(M[6 + d]); let c = i32(rem % s); rem = rem / s; ie += c * M[6 + rank + d];
      }
      let a = io + u32(ie);
      w |= ((rd(ib, a) >> ((a & 3u) * 8u)) & 0xffu) << (8u * k);
    }
    A[oo + t] = w;
  }
}
"""


@cache
def iota(dt: DType) -> str:
    """Meta: n, inner, D, out_off."""
    store = {DType.F32: "A[o + i] = bitcast<u32>(f32(v));", DType.I32: "A[o + i] = v;",
             DType.I64: "A[o + 2u * i] = v; A[o + 2u * i + 1u] = 0u;"}[dt]
    return header() + entry() + f"""  let n = u32(M[0]); let inner = u32(M[1]); let D = u32(M[2]);
  let o = u32(M[3]) >> 2u;
  for (var i = gid.x; i < n; i += ng.x * 64u) {{
    let v = (i / inner) % D; {store}
  }}
}}
"""


@cache
def scan(dt: DType) -> str:
    """cumsum, one invocation per line (sequential, as the reference). Meta: nlines, D, inner, x_buf,
    x_off, out_off, exclusive, reverse."""
    t, ld, _st = _conv(dt)
    return header() + entry() + f"""  let n = u32(M[0]); let D = M[1]; let inner = u32(M[2]);
  let xb = M[3]; let xo = u32(M[4]); let oo = u32(M[5]) >> 2u;
  let excl = M[6] != 0; let rev = M[7] != 0;
  for (var l = gid.x; l < n; l += ng.x * 64u) {{
    let base = (l / inner) * u32(D) * inner + l % inner;
    var s: {t} = {t}(0);
    for (var jj = 0; jj < D; jj++) {{
      let e = base + u32(select(jj, D - 1 - jj, rev)) * inner;
      let v = {ld}(xb, xo + e * 4u);
      s += v;
      A[oo + e] = bitcast<u32>(select(s, s - v, excl));
    }}
  }}
}}
"""


@cache
def argext(op: str, dt: DType) -> str:
    """argmax/argmin along one axis (first extreme; the first NaN wins), i64 result. Meta: n, D,
    inner, x_buf, x_off, out_off."""
    t, ld, _st = _conv(dt)
    cmp = ">" if op == "argmax" else "<"
    nan = "if (rlx_isnan(v)) { bi = j; break; }" if dt is DType.F32 else ""
    first_ok = "!rlx_isnan(best)" if dt is DType.F32 else "true"
    return header() + entry() + f"""  let n = u32(M[0]); let D = M[1]; let inner = u32(M[2]);
  let xb = M[3]; let xo = u32(M[4]); let oo = u32(M[5]) >> 2u;
  for (var i = gid.x; i < n; i += ng.x * 64u) {{
    let base = (i / inner) * u32(D) * inner + i % inner;
    var best: {t} = {ld}(xb, xo + base * 4u); var bi = 0;
    if ({first_ok}) {{
      for (var j = 1; j < D; j++) {{
        let v = {ld}(xb, xo + (base + u32(j) * inner) * 4u);
        {nan}
        if (v {cmp} best) {{ best = v; bi = j; }}
      }}
    }}
    A[oo + 2u * i] = u32(bi); A[oo + 2u * i + 1u] = 0u;
  }}
}}
"""


@cache
def conv2d(dt: DType) -> str:
    """Direct 2-D cross-correlation (NCHW x OIHW, strides, pads, dilations, groups), one invocation per
    output element. Meta: total, C, H, W, O, Cg, KH, KW, OH, OW, sh, sw, pt, pl, dh, dw, Og, x_buf,
    x_off, w_buf, w_off, out_off."""
    t, ld, _st = _conv(dt)
    return header() + entry() + f"""  let n = u32(M[0]);
  let C = M[1]; let H = M[2]; let Wd = M[3]; let O = M[4]; let Cg = M[5]; let KH = M[6]; let KW = M[7];
  let OH = M[8]; let OW = M[9]; let sh = M[10]; let sw = M[11]; let pt = M[12]; let pl = M[13];
  let dh = M[14]; let dw = M[15]; let Og = M[16];
  let xb = M[17]; let xo = u32(M[18]); let wb = M[19]; let wo = u32(M[20]); let oo = u32(M[21]) >> 2u;
  for (var i = gid.x; i < n; i += ng.x * 64u) {{
    let ow = i32(i % u32(OW)); let oh = i32((i / u32(OW)) % u32(OH));
    let o = i32((i / u32(OW * OH)) % u32(O)); let b = i32(i / u32(OW * OH * O));
    let g = o / Og;
    var acc: {t} = {t}(0);
    for (var c = 0; c < Cg; c++) {{
      let ci = g * Cg + c;
      for (var kh = 0; kh < KH; kh++) {{
        let ih = oh * sh - pt + kh * dh;
        if (ih < 0 || ih >= H) {{ continue; }}
        for (var kw = 0; kw < KW; kw++) {{
          let iw = ow * sw - pl + kw * dw;
          if (iw < 0 || iw >= Wd) {{ continue; }}
          acc += {ld}(xb, xo + u32(((b * C + ci) * H + ih) * Wd + iw) * 4u)
               * {ld}(wb, wo + u32(((o * Cg + c) * KH + kh) * KW + kw) * 4u);
        }}
      }}
    }}
    A[oo + i] = bitcast<u32>(acc);
  }}
}}
"""
