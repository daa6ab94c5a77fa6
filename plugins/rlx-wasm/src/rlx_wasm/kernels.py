"""Non-elementwise kernels: data movement, reductions, matmul (blocked, SIMD128), softmax,
layer_norm, linear, gather, iota, argmax/argmin and cumsum.

Every generator returns the name of a wasm function taking byte addresses (i32) in a fixed
order; equal shapes and attributes share one function. Shapes are static, so every loop bound
and stride is a constant of the generated code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import DType, TensorType, normalize_axis

from . import mathlib
from .elementwise import REPR, Emit, cast_expr, collapse, const, contiguous_strides
from .wat import Func, ModuleBuilder, f32, get, i32, mem, v128_f32

D = DType
VEC = mathlib.VECTOR


def _shape(t: TensorType) -> list[int]:
    return [int(d) for d in t.shape]


def _raw(isz: int) -> tuple[str, str, str]:
    """(valtype, load, store) moving ``isz`` bytes unchanged."""
    return {1: ("i32", "i32.load8_u", "i32.store8"), 2: ("i32", "i32.load16_u", "i32.store16"),
            4: ("i32", "i32.load", "i32.store"), 8: ("i64", "i64.load", "i64.store")}[isz]


def for_nest(fn: Func, dims: Sequence[tuple[int, Sequence[int]]], bases: Sequence[str],
             body: Callable[[list[str]], None]) -> None:
    """Nested loops over ``dims`` = [(count, byte strides per pointer)]; ``body(pointers)``."""
    if not dims:
        body(list(bases))
        return
    n, ss = dims[0]
    if n == 0:
        return
    ptrs = []
    for b in bases:
        p = fn.local("i32", "p")
        fn.set(p, b)
        ptrs.append(p)
    with fn.loop(n):
        for_nest(fn, dims[1:], [get(p) for p in ptrs], body)
        for p, s in zip(ptrs, ss):
            fn.inc(p, s)


# ---------------------------------------------------------------------------------------------
# Strided copies (reshape, transpose, expand, slice, concat, pad)


def copy_kernel(mb: ModuleBuilder, shape: Sequence[int], src_strides: Sequence[int], src_offset: int,
                dst_strides: Sequence[int], dst_offset: int, isz: int) -> str:
    """``(src, dst)``: dst[offset + idx . dst_strides] = src[offset + idx . src_strides] (elements)."""
    key = ("copy", tuple(shape), tuple(src_strides), src_offset, tuple(dst_strides), dst_offset, isz)

    def make(name: str) -> Func:
        fn = Func(name, [("$src", "i32"), ("$dst", "i32")])
        if math.prod(shape) == 0:
            return fn
        dims = collapse(shape, [src_strides, dst_strides])
        vt, ld, st = _raw(isz)
        s0 = f"(i32.add (local.get $src) {i32(src_offset * isz)})" if src_offset else "(local.get $src)"
        d0 = f"(i32.add (local.get $dst) {i32(dst_offset * isz)})" if dst_offset else "(local.get $dst)"
        if dims and dims[-1][1] == [1, 1]:
            run = dims[-1][0] * isz
            outer = [(n, [s * isz, d * isz]) for n, (s, d) in dims[:-1]]
            for_nest(fn, outer, [s0, d0], lambda p: fn.emit(f"(memory.copy {p[1]} {p[0]} {i32(run)})"))
            return fn
        if not dims:
            fn.emit(mem(st, d0, 0, mem(ld, s0)))
            return fn
        n, (ss, ds) = dims[-1]
        outer = [(m, [s * isz, d * isz]) for m, (s, d) in dims[:-1]]

        def inner(p: list[str]) -> None:
            ps, pd = fn.local("i32", "s"), fn.local("i32", "d")
            fn.set(ps, p[0])
            fn.set(pd, p[1])
            with fn.loop(n):
                fn.emit(mem(st, get(pd), 0, mem(ld, get(ps))))
                fn.inc(ps, ss * isz)
                fn.inc(pd, ds * isz)

        for_nest(fn, outer, [s0, d0], inner)
        return fn

    return mb.kernel(key, make)


def fill_kernel(mb: ModuleBuilder, nbytes: int, dtype: DType, value: float) -> str:
    """``(dst)``: fill ``nbytes`` with ``value`` of ``dtype``."""
    with np.errstate(all="ignore"):
        raw = np.asarray(value).astype(dtype.np) if dtype is not D.BOOL else np.asarray(value != 0)
    pattern = raw.tobytes()
    key = ("fill", nbytes, pattern)

    def make(name: str) -> Func:
        fn = Func(name, [("$dst", "i32")])
        if nbytes == 0:
            return fn
        if len(set(pattern)) == 1:
            fn.emit(f"(memory.fill (local.get $dst) {i32(pattern[0])} {i32(nbytes)})")
            return fn
        isz = len(pattern)
        vt, _, st = _raw(isz)
        word = int.from_bytes(pattern, "little")
        c = f"(i64.const {word - (1 << 64) if word >= 1 << 63 else word})" if vt == "i64" else i32(word)
        p = fn.local("i32", "p")
        fn.set(p, "(local.get $dst)")
        with fn.loop(nbytes // isz):
            fn.emit(mem(st, get(p), 0, c))
            fn.inc(p, isz)
        return fn

    return mb.kernel(key, make)


def transpose_args(in_shape: Sequence[int], perm: Sequence[int] | None) -> tuple[list[int], list[int]]:
    r = len(in_shape)
    axes = [normalize_axis(p, r) for p in perm] if perm is not None else list(reversed(range(r)))
    own = contiguous_strides(in_shape)
    out_shape = [in_shape[p] for p in axes]
    return out_shape, [own[p] for p in axes]


# ---------------------------------------------------------------------------------------------
# Gather and iota


#: The trap an out-of-range index raises (the runtime turns it into an InputError).
INDEX_TRAP = "unreachable"


def bounded_index(fn: Func, k: str, addr: str, dtype: D, n: int) -> None:
    """``k`` = the index at ``addr`` along an axis of ``n``, negative counted from the end once
    (ONNX); anything still outside ``[0, n)`` traps (``unreachable``) before any memory access:
    linear memory holds every tensor, so an unchecked index would read or write its neighbours. An
    i64 index is checked before it is narrowed (2**32 + 1 must not become 1)."""
    if dtype is D.I64:
        w = fn.local("i64", "w")
        fn.set(w, f"(i64.load {addr})")
        fn.set(w, f"(select (i64.add {get(w)} {i64c(n)}) {get(w)} (i64.lt_s {get(w)} (i64.const 0)))")
        fn.emit(f"(if (i64.ge_u {get(w)} {i64c(n)}) (then {INDEX_TRAP}))")
        fn.set(k, f"(i32.wrap_i64 {get(w)})")
        return
    fn.set(k, f"(i32.load {addr})")
    fn.set(k, f"(select (i32.add {get(k)} {i32(n)}) {get(k)} (i32.lt_s {get(k)} {i32(0)}))")
    fn.emit(f"(if (i32.ge_u {get(k)} {i32(n)}) (then {INDEX_TRAP}))")


def gather_kernel(mb: ModuleBuilder, x: TensorType, idx: TensorType, axis: int) -> str:
    """``(x, indices, out)``: NumPy ``take`` along ``axis``; negative indices count from the end."""
    key = ("gather", x, idx, axis)

    def make(name: str) -> Func:
        fn = Func(name, [("$x", "i32"), ("$idx", "i32"), ("$out", "i32")])
        s = _shape(x)
        ax = normalize_axis(axis, len(s))
        outer, n, inner = math.prod(s[:ax]), s[ax], math.prod(s[ax + 1:])
        nidx = math.prod(_shape(idx))
        isz = REPR[x.dtype].size
        if outer * nidx * inner == 0:
            return fn
        row = inner * isz
        k = fn.local("i32", "k")
        pi = fn.local("i32", "pi")
        po = fn.local("i32", "po")
        px = fn.local("i32", "px")
        fn.set(po, "(local.get $out)")
        fn.set(px, "(local.get $x)")
        vt, l1, s1 = _raw(isz)
        with fn.loop(outer):
            fn.set(pi, "(local.get $idx)")
            with fn.loop(nidx):
                bounded_index(fn, k, get(pi), idx.dtype, n)
                src = f"(i32.add {get(px)} (i32.mul {get(k)} {i32(row)}))"
                if inner == 1:
                    fn.emit(mem(s1, get(po), 0, mem(l1, src)))
                else:
                    fn.emit(f"(memory.copy {get(po)} {src} {i32(row)})")
                fn.inc(po, row)
                fn.inc(pi, REPR[idx.dtype].size)
            fn.inc(px, n * row)
        return fn

    return mb.kernel(key, make)


def iota_kernel(mb: ModuleBuilder, out: TensorType, axis: int) -> str:
    key = ("iota", out, axis)

    def make(name: str) -> Func:
        fn = Func(name, [("$out", "i32")])
        s = _shape(out)
        if math.prod(s) == 0:
            return fn
        r = REPR[out.dtype]
        em = Emit(fn, mb)
        if not s:
            fn.emit(mem(r.store, "(local.get $out)", 0, cast_expr(em, i32(0), D.I32, out.dtype)))
            return fn
        ax = normalize_axis(axis, len(s))
        outer, n, inner = math.prod(s[:ax]), s[ax], math.prod(s[ax + 1:])
        p = fn.local("i32", "p")
        a = fn.local("i32", "a")
        v = fn.local(r.vt, "v")
        fn.set(p, "(local.get $out)")
        with fn.loop(outer):
            with fn.loop(n, a):
                fn.set(v, cast_expr(em, get(a), D.I32, out.dtype))
                with fn.loop(inner):
                    fn.emit(mem(r.store, get(p), 0, get(v)))
                    fn.inc(p, r.size)
        return fn

    return mb.kernel(key, make)


# ---------------------------------------------------------------------------------------------
# Reductions


_IDENT = {"reduce_sum": 0.0, "reduce_mean": 0.0, "reduce_prod": 1.0, "reduce_max": -math.inf,
          "reduce_min": math.inf}


def _ident(op: str, dt: DType) -> str:
    if dt.is_int:
        info = np.iinfo(dt.np)
        if op in ("reduce_max", "reduce_min"):
            return const(dt, int(info.min) if op == "reduce_max" else int(info.max))
        return const(dt, int(_IDENT[op]))
    return const(dt, _IDENT[op])


def _combine(op: str, dt: DType, a: str, b: str) -> str:
    p = REPR[dt].vt
    if op in ("reduce_sum", "reduce_mean"):
        return f"({p}.add {a} {b})"
    if op == "reduce_prod":
        return f"({p}.mul {a} {b})"
    if dt.is_float:
        return f"({p}.{'max' if op == 'reduce_max' else 'min'} {a} {b})"
    cmp = "gt_s" if op == "reduce_max" else "lt_s"
    return f"(select {a} {b} ({p}.{cmp} {a} {b}))"


def _vcombine(op: str, a: str, b: str) -> str:
    name = {"reduce_sum": "add", "reduce_mean": "add", "reduce_prod": "mul", "reduce_max": "max",
            "reduce_min": "min"}[op]
    return f"(f32x4.{name} {a} {b})"


def _finish(op: str, dt: DType, acc: str, count: int) -> str:
    if op != "reduce_mean":
        return acc
    p = REPR[dt].vt
    return f"({p}.div {acc} ({p}.const {count}))"


def reduce_kernel(mb: ModuleBuilder, op: str, x: TensorType, axes: Sequence[int] | None) -> str:
    """``(x, out)``: reduce ``axes`` (None: all) of a contiguous ``x`` into a contiguous ``out``."""
    s = _shape(x)
    red = set(range(len(s))) if axes is None else {normalize_axis(a, len(s)) for a in axes}
    key = ("reduce", op, x, tuple(sorted(red)), mb.simd)

    def make(name: str) -> Func:
        fn = Func(name, [("$x", "i32"), ("$out", "i32")])
        dt = x.dtype
        r = REPR[dt]
        isz = r.size
        out_numel = math.prod(n for i, n in enumerate(s) if i not in red)
        count = math.prod(n for i, n in enumerate(s) if i in red)
        if out_numel == 0:
            return fn
        # (size, reduced?) dims, size-1 dims dropped, neighbours of one kind merged
        dims: list[list[Any]] = []
        for i, n in enumerate(s):
            if n == 1:
                continue
            kind = i in red
            if dims and dims[-1][1] == kind:
                dims[-1][0] *= n
            else:
                dims.append([n, kind])
        xs = contiguous_strides([d[0] for d in dims])
        kept = [(d[0], xs[i]) for i, d in enumerate(dims) if not d[1]]
        ost = contiguous_strides([n for n, _ in kept])
        kept_dims = [(n, [st * isz, ost[j] * isz]) for j, (n, st) in enumerate(kept)]
        red_dims = [(d[0], [xs[i] * isz]) for i, d in enumerate(dims) if d[1]]
        if not red_dims:  # nothing to reduce: a copy (mean divides by 1)
            fn.emit(f"(memory.copy (local.get $out) (local.get $x) {i32(out_numel * isz)})")
            return fn
        vec_ok = mb.simd and dt is D.F32
        if dims[-1][1]:  # the innermost dim is reduced: one accumulator per output element
            n_in = red_dims[-1][0]
            vec = vec_ok and n_in >= 4

            def row(p: list[str]) -> None:
                acc = fn.local(r.vt, "acc")
                fn.set(acc, _ident(op, dt))
                vacc = None
                if vec:
                    vacc = fn.local("v128", "vacc")
                    fn.set(vacc, f"(f32x4.splat {_ident(op, dt)})")

                def inner(q: list[str]) -> None:
                    px = fn.local("i32", "px")
                    fn.set(px, q[0])
                    rest = n_in
                    if vec:
                        with fn.loop(n_in // 4):
                            fn.set(vacc, _vcombine(op, get(vacc), mem("v128.load", get(px))))  # type: ignore[arg-type]
                            fn.inc(px, 16)
                        rest = n_in % 4
                    with fn.loop(rest):
                        fn.set(acc, _combine(op, dt, get(acc), mem(r.load, get(px))))
                        fn.inc(px, isz)

                for_nest(fn, [(n, [st[0]]) for n, st in red_dims[:-1]], [p[0]], inner)
                if vec:
                    for lane in range(4):
                        fn.set(acc, _combine(op, dt, get(acc), f"(f32x4.extract_lane {lane} {get(vacc)})"))  # type: ignore[arg-type]
                fn.emit(mem(r.store, p[1], 0, _finish(op, dt, get(acc), count)))

            for_nest(fn, kept_dims, ["(local.get $x)", "(local.get $out)"], row)
            return fn

        # the innermost dim is kept: accumulate whole output rows (vectorised along them)
        m = kept_dims[-1][0]
        vec = vec_ok and m >= 4

        def block(p: list[str]) -> None:
            po = fn.local("i32", "po")

            def over_row(body: Callable[[str, str | None, bool], None], px: str | None) -> None:
                fn.set(po, p[1])
                q = None
                if px is not None:
                    q = fn.local("i32", "qx")
                    fn.set(q, px)
                rest = m
                if vec:
                    with fn.loop(m // 4):
                        body(get(po), get(q) if q else None, True)
                        fn.inc(po, 16)
                        if q:
                            fn.inc(q, 16)
                    rest = m % 4
                with fn.loop(rest):
                    body(get(po), get(q) if q else None, False)
                    fn.inc(po, isz)
                    if q:
                        fn.inc(q, isz)

            def init(o: str, _x: str | None, v: bool) -> None:
                val = f"(f32x4.splat {_ident(op, dt)})" if v else _ident(op, dt)
                fn.emit(mem("v128.store" if v else r.store, o, 0, val))

            def acc(o: str, xx: str | None, v: bool) -> None:
                if v:
                    fn.emit(mem("v128.store", o, 0, _vcombine(op, mem("v128.load", o), mem("v128.load", xx))))  # type: ignore[arg-type]
                else:
                    fn.emit(mem(r.store, o, 0, _combine(op, dt, mem(r.load, o), mem(r.load, xx))))  # type: ignore[arg-type]

            def fin(o: str, _x: str | None, v: bool) -> None:
                if v:
                    c = f"(f32x4.splat ({r.vt}.const {count}))"
                    fn.emit(mem("v128.store", o, 0, f"(f32x4.div {mem('v128.load', o)} {c})"))
                else:
                    fn.emit(mem(r.store, o, 0, _finish(op, dt, mem(r.load, o), count)))

            over_row(init, None)
            for_nest(fn, [(n, st) for n, st in red_dims], [p[0]], lambda q: over_row(acc, q[0]))
            if op == "reduce_mean":
                over_row(fin, None)

        for_nest(fn, kept_dims[:-1], ["(local.get $x)", "(local.get $out)"], block)
        return fn

    return mb.kernel(key, make)


def arg_kernel(mb: ModuleBuilder, op: str, x: TensorType, axis: int) -> str:
    """``(x, out)``: argmax/argmin (i64) along ``axis``; the first extreme wins, NaN counts as extreme."""
    key = ("arg", op, x, axis)

    def make(name: str) -> Func:
        fn = Func(name, [("$x", "i32"), ("$out", "i32")])
        s = _shape(x)
        ax = normalize_axis(axis, len(s))
        outer, n, inner = math.prod(s[:ax]), s[ax], math.prod(s[ax + 1:])
        if outer * inner == 0 or n == 0:
            return fn
        r = REPR[x.dtype]
        p = r.vt
        best, bi, v, k = fn.local(p, "b"), fn.local("i32", "bi"), fn.local(p, "v"), fn.local("i32", "k")
        px, pr, po = fn.local("i32", "px"), fn.local("i32", "pr"), fn.local("i32", "po")
        fn.set(px, "(local.get $x)")
        fn.set(po, "(local.get $out)")
        isf = x.dtype.is_float
        better = "gt" if op == "argmax" else "lt"
        with fn.loop(outer):
            with fn.loop(inner):
                fn.set(pr, get(px))
                fn.set(best, mem(r.load, get(pr)))
                fn.set(bi, i32(0))
                with fn.loop(n - 1, k):
                    fn.inc(pr, inner * r.size)
                    fn.set(v, mem(r.load, get(pr)))
                    if isf:
                        # take v if it is better, or NaN while best is not NaN
                        cond = (f"(i32.and ({p}.eq {get(best)} {get(best)}) (i32.or ({p}.{better} {get(v)} "
                                f"{get(best)}) ({p}.ne {get(v)} {get(v)})))")
                    else:
                        cond = f"({p}.{better}_s {get(v)} {get(best)})"
                    fn.emit(f"(if {cond} (then (local.set {best} {get(v)}) "
                            f"(local.set {bi} (i32.add {get(k)} {i32(1)}))))")
                fn.emit(mem("i64.store", get(po), 0, f"(i64.extend_i32_u {get(bi)})"))
                fn.inc(po, 8)
                fn.inc(px, r.size)
            fn.inc(px, (n - 1) * inner * r.size)
        return fn

    return mb.kernel(key, make)


def cumsum_kernel(mb: ModuleBuilder, x: TensorType, axis: int, exclusive: bool, reverse: bool) -> str:
    key = ("cumsum", x, axis, exclusive, reverse)

    def make(name: str) -> Func:
        fn = Func(name, [("$x", "i32"), ("$out", "i32")])
        s = _shape(x)
        r = REPR[x.dtype]
        p = r.vt
        if math.prod(s) == 0:
            return fn
        zero = const(x.dtype, 0)
        if not s:
            fn.emit(mem(r.store, "(local.get $out)", 0, zero if exclusive else mem(r.load, "(local.get $x)")))
            return fn
        ax = normalize_axis(axis, len(s))
        outer, n, inner = math.prod(s[:ax]), s[ax], math.prod(s[ax + 1:])
        step = inner * r.size * (-1 if reverse else 1)
        start = (n - 1) * inner * r.size if reverse else 0
        acc, v = fn.local(p, "acc"), fn.local(p, "v")
        px, po, bx, bo = (fn.local("i32", h) for h in ("px", "po", "bx", "bo"))
        fn.set(bx, "(local.get $x)")
        fn.set(bo, "(local.get $out)")
        with fn.loop(outer):
            with fn.loop(inner):
                fn.set(px, f"(i32.add {get(bx)} {i32(start)})")
                fn.set(po, f"(i32.add {get(bo)} {i32(start)})")
                fn.set(acc, zero)
                with fn.loop(n):
                    fn.set(v, mem(r.load, get(px)))
                    if exclusive:
                        fn.emit(mem(r.store, get(po), 0, get(acc)))
                        fn.set(acc, f"({p}.add {get(acc)} {get(v)})")
                    else:
                        fn.set(acc, f"({p}.add {get(acc)} {get(v)})")
                        fn.emit(mem(r.store, get(po), 0, get(acc)))
                    fn.inc(px, step)
                    fn.inc(po, step)
                fn.inc(bx, r.size)
                fn.inc(bo, r.size)
            fn.inc(bx, (n - 1) * inner * r.size)
            fn.inc(bo, (n - 1) * inner * r.size)
        return fn

    return mb.kernel(key, make)


# ---------------------------------------------------------------------------------------------
# Matmul


#: Broadcast A values with ``v128.load32_splat`` (a load-port broadcast on AVX hosts) rather than
#: a vector load plus lane shuffles.
SPLAT_LOADS = False
#: Register tile of the f32x4 GEMM: rows x (4 * vectors) columns.
TILE_ROWS = 4
TILE_VECS = 2
#: k steps per loop iteration of the f32x4 GEMM, by tuning (wat.TUNINGS). Cranelift (wasmtime)
#: compiles the loop as written, so k is unrolled by 4 with A read 4 values at a time and broadcast
#: by lane shuffles. V8's TurboFan hoists every load of an iteration above its arithmetic and
#: unrolls small loops itself: unrolled by hand, the 4 x 8 tile no longer fits in 16 xmm registers
#: and spills, while one k step per iteration with A broadcast by ``v128.load32_splat``
#: (vbroadcastss) stays in registers (MiniLM under Node.js: ~20 % less CPU time; the same change
#: costs ~25 % under wasmtime).
K_UNROLL = {"wasmtime": 4, "js": 1}
#: Bytes of A (rows x k) one row block of the GEMM keeps in cache.
GEMM_A_BLOCK_BYTES = 96 * 1024


def gemm_panels(n: int, isz: int, simd: bool) -> list[tuple[int, list[tuple[str, int]]]]:
    """Column panels of the GEMM: (first column, column groups), a group being a vector of 4
    lanes ("v") or one scalar column ("s") at a byte offset inside the panel's row."""
    panels: list[tuple[int, list[tuple[str, int]]]] = []
    j = 0
    if simd:
        while j + 4 * TILE_VECS <= n:
            panels.append((j, [("v", 16 * i) for i in range(TILE_VECS)]))
            j += 4 * TILE_VECS
        if TILE_VECS > 2 and j + 8 <= n:
            panels.append((j, [("v", 0), ("v", 16)]))
            j += 8
        if j + 4 <= n:
            panels.append((j, [("v", 0)]))
            j += 4
    else:
        while j + 4 <= n:
            panels.append((j, [("s", 0), ("s", isz), ("s", 2 * isz), ("s", 3 * isz)]))
            j += 4
    while j < n:
        panels.append((j, [("s", 0)]))
        j += 1
    return panels


def _panel_width(groups: list[tuple[str, int]], isz: int) -> int:
    return sum(4 if g == "v" else 1 for g, _ in groups)


def pack_b(b: np.ndarray, simd: bool) -> np.ndarray:
    """B (k, n) rearranged panel by panel (each panel k x width, row-major), as the GEMM with
    ``packed=True`` reads it: every k step of a tile then reads one contiguous run."""
    k, n = b.shape
    simd = simd and b.dtype == np.float32
    parts = []
    for j0, groups in gemm_panels(n, b.dtype.itemsize, simd):
        w = _panel_width(groups, b.dtype.itemsize)
        parts.append(np.ascontiguousarray(b[:, j0:j0 + w]).reshape(-1))
    return np.concatenate(parts) if parts else np.zeros(0, b.dtype)


def gemm_kernel(mb: ModuleBuilder, m: int, k: int, n: int, dt: DType, bias: bool = False,
                packed: bool = False) -> str:
    """``(a, b, c[, bias])``: C[m,n] = A[m,k] @ B[k,n] (+ bias[n]), all row-major and contiguous.

    Register-blocked: tiles of 4 rows x 8 columns (two f32x4 accumulators per row, 8 in all),
    column panels outermost so a K x 8 panel of B stays in cache across row tiles; remainders take
    4-wide and single-column / single-row tiles. The scalar form uses 4 x 4 tiles of scalars.
    Sums run in order over k (the error bound of the conformance tolerance).
    """
    simd = mb.simd and dt is D.F32
    key = ("gemm", m, k, n, dt, bias, simd, packed)

    def make(name: str) -> Func:
        params = [("$a", "i32"), ("$b", "i32"), ("$c", "i32")] + ([("$bias", "i32")] if bias else [])
        fn = Func(name, params)
        if m * n == 0:
            return fn
        r = REPR[dt]
        isz = r.size
        vt = r.vt
        zero = const(dt, 0)

        def tile(rows: int, groups: list[tuple[str, int]], pa: str, pb: str, pc: str, pbias: str,
                 ldb: int) -> None:
            """One tile: ``rows`` rows starting at row pointer pa (A) / pc (C); column groups at
            byte offsets (vector: 4 lanes, scalar: 1) from pb (B column) and pc."""
            accs = [[fn.local("v128" if g == "v" else vt, "c") for g, _ in groups] for _ in range(rows)]
            for rr in range(rows):
                for gi, (g, _off) in enumerate(groups):
                    fn.set(accs[rr][gi], v128_f32(0.0) if g == "v" else zero)
            if k > 0:
                # One A pointer: the other rows are constant offsets in the load's memarg, so a k
                # step advances two pointers whatever the tile height (fewer integer ops per step).
                qa0 = fn.local("i32", "qa")
                qb = fn.local("i32", "qb")
                fn.set(qa0, pa)
                fn.set(qb, pb)
                roff = [rr * k * isz for rr in range(rows)]
                any_vec = any(g == "v" for g, _ in groups)

                def kbody(u: int) -> None:
                    """``u`` steps of k; with u == 4 (vector tiles) A is read 4 values at a time and
                    each value is broadcast by a lane shuffle."""
                    avs = []
                    if u == 4 and not SPLAT_LOADS:
                        for rr in range(rows):
                            loc = fn.local("v128", "a4")
                            fn.set(loc, mem("v128.load", get(qa0), roff[rr]))
                            avs.append(get(loc))
                    for kk in range(u):
                        bl = []
                        for g, off in groups:
                            loc = fn.local("v128" if g == "v" else vt, "bv")
                            boff = off + kk * ldb
                            fn.set(loc, mem("v128.load" if g == "v" else r.load, get(qb), boff))
                            bl.append(get(loc))
                        for rr in range(rows):
                            if u == 4 and SPLAT_LOADS:
                                a_v = fn.local("v128", "av")
                                fn.set(a_v, mem("v128.load32_splat", get(qa0), roff[rr] + kk * isz))
                                a_s = f"(f32x4.extract_lane 0 {get(a_v)})"
                            elif u == 4:
                                lanes = " ".join(str(4 * kk + i) for i in range(4))
                                a_v = fn.local("v128", "av")
                                shuf = f"{lanes} {lanes} {lanes} {lanes}"
                                fn.set(a_v, f"(i8x16.shuffle {shuf} {avs[rr]} {avs[rr]})")
                                a_s = f"(f32x4.extract_lane 0 {get(a_v)})"
                            elif any_vec and all(g == "v" for g, _ in groups):
                                a_v = fn.local("v128", "av")
                                fn.set(a_v, mem("v128.load32_splat", get(qa0), roff[rr] + kk * isz))
                                a_s = ""
                            else:
                                loc = fn.local(vt, "as")
                                fn.set(loc, mem(r.load, get(qa0), roff[rr] + kk * isz))
                                a_s = get(loc)
                                a_v = None
                                if any_vec:
                                    a_v = fn.local("v128", "av")
                                    fn.set(a_v, f"(f32x4.splat {a_s})")
                            for gi, (g, _off) in enumerate(groups):
                                acc = accs[rr][gi]
                                if g == "v":
                                    fn.set(acc, f"(f32x4.add {get(acc)} (f32x4.mul {get(a_v)} {bl[gi]}))")  # type: ignore[arg-type]
                                else:
                                    fn.set(acc, f"({vt}.add {get(acc)} ({vt}.mul {a_s} {bl[gi]}))")
                    fn.inc(qa0, u * isz)
                    fn.inc(qb, u * ldb)

                ku = K_UNROLL[mb.tune]
                unroll = ku if any_vec and k >= ku else 1
                with fn.loop(k // unroll):
                    kbody(unroll)
                if unroll > 1:
                    with fn.loop(k % unroll):
                        kbody(1)
            for rr in range(rows):
                for gi, (g, off) in enumerate(groups):
                    val = get(accs[rr][gi])
                    if bias:
                        if g == "v":
                            val = f"(f32x4.add {val} {mem('v128.load', pbias, off)})"
                        else:
                            val = f"({vt}.add {val} {mem(r.load, pbias, off)})"
                    fn.emit(mem("v128.store" if g == "v" else r.store,
                                f"(i32.add {pc} {i32(rr * n * isz)})" if rr else pc, off, val))

        panels = gemm_panels(n, isz, simd)
        tr = TILE_ROWS if simd else 4
        # Row blocks small enough that their slice of A stays in cache while every column panel
        # of B streams past it (A is re-read once per panel).
        mblock = max(tr, min(m, GEMM_A_BLOCK_BYTES // max(k * isz, 1)) // tr * tr)

        def rows(mr: int, a0: str, c0: str) -> None:
            """All column panels for ``mr`` rows starting at A row pointer a0 / C row pointer c0."""
            rows_main = mr // tr * tr
            idx = 0
            while idx < len(panels):  # consecutive identical panels share one loop
                j0, groups = panels[idx]
                cnt = 1
                width = _panel_width(groups, isz)
                ldb = width * isz if packed else n * isz
                while idx + cnt < len(panels) and panels[idx + cnt][1] == groups:
                    cnt += 1
                pj = fn.local("i32", "pj")
                fn.set(pj, i32(j0 * isz))
                pjb = pj
                if packed:
                    pjb = fn.local("i32", "pjb")
                    fn.set(pjb, i32(j0 * k * isz))
                with fn.loop(cnt):
                    pa, pc = fn.local("i32", "pa"), fn.local("i32", "pc")
                    fn.set(pa, a0)
                    fn.set(pc, f"(i32.add {c0} {get(pj)})")
                    pb = f"(i32.add (local.get $b) {get(pjb)})"
                    pbias = f"(i32.add (local.get $bias) {get(pj)})" if bias else ""
                    with fn.loop(rows_main // tr):
                        tile(tr, groups, get(pa), pb, get(pc), pbias, ldb)
                        fn.inc(pa, tr * k * isz)
                        fn.inc(pc, tr * n * isz)
                    with fn.loop(mr - rows_main):
                        tile(1, groups, get(pa), pb, get(pc), pbias, ldb)
                        fn.inc(pa, k * isz)
                        fn.inc(pc, n * isz)
                    fn.inc(pj, width * isz)
                    if packed:
                        fn.inc(pjb, width * k * isz)
                idx += cnt

        ra, rc = fn.local("i32", "ra"), fn.local("i32", "rc")
        fn.set(ra, "(local.get $a)")
        fn.set(rc, "(local.get $c)")
        with fn.loop(m // mblock):
            rows(mblock, get(ra), get(rc))
            fn.inc(ra, mblock * k * isz)
            fn.inc(rc, mblock * n * isz)
        if m % mblock:
            rows(m % mblock, get(ra), get(rc))
        return fn

    return mb.kernel(key, make)


def matmul_plan(a: TensorType, b: TensorType) -> tuple[list[tuple[int, list[int]]], int, int, int]:
    """(batch dims with byte strides for a, b, c; m, k, n) of a broadcasting matmul."""
    sa, sb = _shape(a), _shape(b)
    a2 = [1] + sa if len(sa) == 1 else sa
    b2 = sb + [1] if len(sb) == 1 else sb
    m, k = a2[-2], a2[-1]
    n = b2[-1]
    ba, bb = a2[:-2], b2[:-2]
    r = max(len(ba), len(bb))
    ba = [1] * (r - len(ba)) + ba
    bb = [1] * (r - len(bb)) + bb
    batch = [max(x, y) if min(x, y) != 0 else 0 for x, y in zip(ba, bb)]
    isz = REPR[a.dtype].size
    sa_ = contiguous_strides(ba)
    sb_ = contiguous_strides(bb)
    sc_ = contiguous_strides(batch)
    strides = [[(sa_[i] * m * k if ba[i] != 1 else 0) * isz, (sb_[i] * k * n if bb[i] != 1 else 0) * isz,
                sc_[i] * m * n * isz] for i in range(r)]
    dims = collapse(batch, [[s[0] for s in strides], [s[1] for s in strides], [s[2] for s in strides]])
    return dims, m, k, n


def matmul_kernel(mb: ModuleBuilder, a: TensorType, b: TensorType, out: TensorType) -> str:
    key = ("matmul", a, b, mb.simd)

    def make(name: str) -> Func:
        fn = Func(name, [("$a", "i32"), ("$b", "i32"), ("$c", "i32")])
        dims, m, k, n = matmul_plan(a, b)
        if math.prod(_shape(out)) == 0:
            return fn
        # b shared by every batch and a contiguous: fold the batch into the rows of one GEMM
        if len(dims) == 1 and dims[0][1][1] == 0 and dims[0][1][0] == m * k * REPR[a.dtype].size:
            g = gemm_kernel(mb, dims[0][0] * m, k, n, a.dtype)
            fn.emit(f"(call {g} (local.get $a) (local.get $b) (local.get $c))")
            return fn
        g = gemm_kernel(mb, m, k, n, a.dtype)
        for_nest(fn, dims, ["(local.get $a)", "(local.get $b)", "(local.get $c)"],
                 lambda p: fn.emit(f"(call {g} {p[0]} {p[1]} {p[2]})"))
        return fn

    return mb.kernel(key, make)


def linear_kernel(mb: ModuleBuilder, x: TensorType, w: TensorType, transposed_w: bool) -> str:
    """``(x, wt_or_w, b, out[, scratch])``: x @ w.T + b. With ``transposed_w`` the second operand is
    W^T (k, n) already packed in GEMM panels (:func:`pack_b`; a constant prepared at compile time);
    otherwise it is W (n, k) and is transposed into scratch memory first."""
    key = ("linear", x, w, transposed_w, mb.simd)
    sx = _shape(x)
    n, k = _shape(w)
    m = math.prod(sx[:-1])
    isz = REPR[x.dtype].size
    if not transposed_w:
        mb.need_scratch(n * k * isz)

    def make(name: str) -> Func:
        params = [("$x", "i32"), ("$w", "i32"), ("$b", "i32"), ("$out", "i32")]
        if not transposed_w:
            params.append(("$scratch", "i32"))
        fn = Func(name, params)
        if m * n == 0:
            return fn
        g = gemm_kernel(mb, m, k, n, x.dtype, bias=True, packed=transposed_w)
        wt = "(local.get $w)"
        if not transposed_w:
            t = copy_kernel(mb, [k, n], [1, k], 0, [n, 1], 0, isz)
            fn.emit(f"(call {t} (local.get $w) (local.get $scratch))")
            wt = "(local.get $scratch)"
        fn.emit(f"(call {g} (local.get $x) {wt} (local.get $out) (local.get $b))")
        return fn

    return mb.kernel(key, make)


# ---------------------------------------------------------------------------------------------
# Row-wise HIR kernels: softmax, log_softmax, layer_norm (f32)


def _hsum(expr: str) -> str:
    lanes = [f"(f32x4.extract_lane {i} {expr})" for i in range(4)]
    return f"(f32.add (f32.add {lanes[0]} {lanes[1]}) (f32.add {lanes[2]} {lanes[3]}))"


def _hmax(expr: str) -> str:
    lanes = [f"(f32x4.extract_lane {i} {expr})" for i in range(4)]
    return f"(f32.max (f32.max {lanes[0]} {lanes[1]}) (f32.max {lanes[2]} {lanes[3]}))"


class _Row:
    """Passes over one row of ``n`` f32 at byte stride ``stride`` (4: contiguous, vectorised)."""

    def __init__(self, fn: Func, n: int, stride: int, vec: bool) -> None:
        self.fn, self.n, self.stride = fn, n, stride
        self.vec = vec and stride == 4 and n >= 4

    def run(self, ptrs: Sequence[str], body: Callable[[list[str], bool], None]) -> None:
        fn = self.fn
        qs = []
        for p in ptrs:
            q = fn.local("i32", "q")
            fn.set(q, p)
            qs.append(q)
        rest = self.n
        if self.vec:
            with fn.loop(self.n // 4):
                body([get(q) for q in qs], True)
                for q in qs:
                    fn.inc(q, 16)
            rest = self.n % 4
        with fn.loop(rest):
            body([get(q) for q in qs], False)
            for q in qs:
                fn.inc(q, self.stride)


def softmax_kernel(mb: ModuleBuilder, x: TensorType, axis: int, log: bool) -> str:
    key = ("softmax", x, axis, log, mb.simd)

    def make(name: str) -> Func:
        fn = Func(name, [("$x", "i32"), ("$out", "i32")])
        s = _shape(x)
        ax = normalize_axis(axis, len(s))
        outer, n, inner = math.prod(s[:ax]), s[ax], math.prod(s[ax + 1:])
        if outer * n * inner == 0:
            return fn
        em = Emit(fn, mb)
        row = _Row(fn, n, inner * 4, mb.simd)
        mx, sm = fn.local("f32", "mx"), fn.local("f32", "sm")
        vm = fn.local("v128", "vm") if row.vec else ""
        vs = fn.local("v128", "vs") if row.vec else ""
        bx, bo = fn.local("i32", "bx"), fn.local("i32", "bo")
        fn.set(bx, "(local.get $x)")
        fn.set(bo, "(local.get $out)")

        def exp(e: str, v: bool) -> str:
            return mathlib.call(mb, "exp", e, v)

        with fn.loop(outer):
            with fn.loop(inner):
                fn.set(mx, f32(-math.inf))
                if row.vec:
                    fn.set(vm, v128_f32(-math.inf))

                def p_max(p: list[str], v: bool) -> None:
                    if v:
                        fn.set(vm, f"(f32x4.max {get(vm)} {mem('v128.load', p[0])})")
                    else:
                        fn.set(mx, f"(f32.max {get(mx)} {mem('f32.load', p[0])})")

                row.run([get(bx)], p_max)
                if row.vec:
                    fn.set(mx, f"(f32.max {get(mx)} {_hmax(get(vm))})")
                fn.set(sm, f32(0.0))
                mxv = ""
                if row.vec:
                    fn.set(vs, v128_f32(0.0))
                    mxv = em.let(f"(f32x4.splat {get(mx)})", "v128", "mv")

                def p_exp(p: list[str], v: bool) -> None:
                    if v:
                        e = em.let(exp(f"(f32x4.sub {mem('v128.load', p[0])} {mxv})", True), "v128", "e")
                        if not log:
                            fn.emit(mem("v128.store", p[1], 0, e))
                        fn.set(vs, f"(f32x4.add {get(vs)} {e})")
                    else:
                        e = em.let(exp(f"(f32.sub {mem('f32.load', p[0])} {get(mx)})", False), "f32", "e")
                        if not log:
                            fn.emit(mem("f32.store", p[1], 0, e))
                        fn.set(sm, f"(f32.add {get(sm)} {e})")

                row.run([get(bx), get(bo)], p_exp)
                if row.vec:
                    fn.set(sm, f"(f32.add {get(sm)} {_hsum(get(vs))})")
                if log:
                    lse = em.let(mathlib.call(mb, "log", get(sm), False), "f32", "l")
                    lv = em.let(f"(f32x4.splat {lse})", "v128", "lv") if row.vec else ""

                    def p_log(p: list[str], v: bool) -> None:
                        if v:
                            val = f"(f32x4.sub (f32x4.sub {mem('v128.load', p[0])} {mxv}) {lv})"
                            fn.emit(mem("v128.store", p[1], 0, val))
                        else:
                            val = f"(f32.sub (f32.sub {mem('f32.load', p[0])} {get(mx)}) {lse})"
                            fn.emit(mem("f32.store", p[1], 0, val))

                    row.run([get(bx), get(bo)], p_log)
                else:
                    inv = em.let(f"(f32.div {f32(1.0)} {get(sm)})", "f32", "r")
                    iv = em.let(f"(f32x4.splat {inv})", "v128", "rv") if row.vec else ""

                    def p_div(p: list[str], v: bool) -> None:
                        if v:
                            fn.emit(mem("v128.store", p[0], 0, f"(f32x4.mul {mem('v128.load', p[0])} {iv})"))
                        else:
                            fn.emit(mem("f32.store", p[0], 0, f"(f32.mul {mem('f32.load', p[0])} {inv})"))

                    row.run([get(bo)], p_div)
                fn.inc(bx, 4)
                fn.inc(bo, 4)
            fn.inc(bx, (n - 1) * inner * 4)
            fn.inc(bo, (n - 1) * inner * 4)
        return fn

    return mb.kernel(key, make)


def layer_norm_kernel(mb: ModuleBuilder, x: TensorType, axis: int, eps: float) -> str:
    """``(x, gamma, beta, out)``: rows of the trailing dims from ``axis``; mean, variance of the
    centred values, then ``(x - mean) * rsqrt(var + eps) * gamma + beta``."""
    key = ("layer_norm", x, axis, float(eps), mb.simd)

    def make(name: str) -> Func:
        fn = Func(name, [("$x", "i32"), ("$g", "i32"), ("$b", "i32"), ("$out", "i32")])
        s = _shape(x)
        ax = normalize_axis(axis, len(s))
        rows, n = math.prod(s[:ax]), math.prod(s[ax:])
        if rows * n == 0:
            return fn
        em = Emit(fn, mb)
        row = _Row(fn, n, 4, mb.simd)
        sm = fn.local("f32", "sm")
        vs = fn.local("v128", "vs") if row.vec else ""
        bx, bo = fn.local("i32", "bx"), fn.local("i32", "bo")
        fn.set(bx, "(local.get $x)")
        fn.set(bo, "(local.get $out)")
        nf = f32(float(n))
        with fn.loop(rows):
            fn.set(sm, f32(0.0))
            if row.vec:
                fn.set(vs, v128_f32(0.0))

            def p_sum(p: list[str], v: bool) -> None:
                if v:
                    fn.set(vs, f"(f32x4.add {get(vs)} {mem('v128.load', p[0])})")
                else:
                    fn.set(sm, f"(f32.add {get(sm)} {mem('f32.load', p[0])})")

            row.run([get(bx)], p_sum)
            total = f"(f32.add {get(sm)} {_hsum(get(vs))})" if row.vec else get(sm)
            mean = em.let(f"(f32.div {total} {nf})", "f32", "mean")
            mv = em.let(f"(f32x4.splat {mean})", "v128", "meanv") if row.vec else ""
            fn.set(sm, f32(0.0))
            if row.vec:
                fn.set(vs, v128_f32(0.0))

            def p_var(p: list[str], v: bool) -> None:
                if v:
                    c = em.let(f"(f32x4.sub {mem('v128.load', p[0])} {mv})", "v128", "c")
                    fn.set(vs, f"(f32x4.add {get(vs)} (f32x4.mul {c} {c}))")
                else:
                    c = em.let(f"(f32.sub {mem('f32.load', p[0])} {mean})", "f32", "c")
                    fn.set(sm, f"(f32.add {get(sm)} (f32.mul {c} {c}))")

            row.run([get(bx)], p_var)
            total = f"(f32.add {get(sm)} {_hsum(get(vs))})" if row.vec else get(sm)
            var = f"(f32.div {total} {nf})"
            inv = em.let(f"(f32.div {f32(1.0)} (f32.sqrt (f32.add {var} {f32(float(np.float32(eps)))})))",
                         "f32", "inv")
            iv = em.let(f"(f32x4.splat {inv})", "v128", "invv") if row.vec else ""

            def p_out(p: list[str], v: bool) -> None:
                if v:
                    c = f"(f32x4.sub {mem('v128.load', p[0])} {mv})"
                    val = (f"(f32x4.add (f32x4.mul (f32x4.mul {c} {iv}) "
                           f"{mem('v128.load', p[1])}) {mem('v128.load', p[2])})")
                    fn.emit(mem("v128.store", p[3], 0, val))
                else:
                    val = (f"(f32.add (f32.mul (f32.mul (f32.sub {mem('f32.load', p[0])} {mean}) {inv}) "
                           f"{mem('f32.load', p[1])}) {mem('f32.load', p[2])})")
                    fn.emit(mem("f32.store", p[3], 0, val))

            row.run([get(bx), "(local.get $g)", "(local.get $b)", get(bo)], p_out)
            fn.inc(bx, n * 4)
            fn.inc(bo, n * 4)
        return fn

    return mb.kernel(key, make)


# ---------------------------------------------------------------------------------------------
# conv2d (im2col into scratch memory, then the GEMM) and scatter_add


def conv2d_kernel(mb: ModuleBuilder, x: TensorType, w: TensorType, out: TensorType, attrs: Any) -> str:
    """``(x, w, out, scratch)``: NCHW x OIHW cross-correlation with strides, pads, dilations, groups.

    Per image and group, the (Cg*kh*kw, Ho*Wo) patch matrix is built in scratch memory (zeros
    where the window reads padding; one strided copy per kernel tap), then
    ``out[n, group] = W[group] (og, Cg*kh*kw) @ patches`` with the blocked GEMM.
    """
    (sh, sw), (pt, pl, _pb, _pr), (dh, dw) = attrs["strides"], attrs["pads"], attrs["dilations"]
    groups = int(attrs["groups"])
    n, c, h, wd = _shape(x)
    o, cg, kh, kw = _shape(w)
    _, _, ho, wo = _shape(out)
    og = o // groups
    kk = cg * kh * kw
    p = ho * wo
    isz = REPR[x.dtype].size
    mb.need_scratch(kk * p * isz)
    key = ("conv2d", x, w, out, tuple(attrs["strides"]), tuple(attrs["pads"]), tuple(attrs["dilations"]),
           groups, mb.simd)

    def make(name: str) -> Func:
        fn = Func(name, [("$x", "i32"), ("$w", "i32"), ("$out", "i32"), ("$scratch", "i32")])
        if n * o * p == 0:
            return fn
        gemm = gemm_kernel(mb, og, kk, p, x.dtype)
        taps = []
        for i in range(kh):
            # output rows/cols whose tap (i, j) reads inside the image
            r0 = max(0, -(-(pt - i * dh) // sh))
            r1 = min(ho, (h - 1 + pt - i * dh) // sh + 1) if h - 1 + pt - i * dh >= 0 else 0
            for j in range(kw):
                c0 = max(0, -(-(pl - j * dw) // sw))
                c1 = min(wo, (wd - 1 + pl - j * dw) // sw + 1) if wd - 1 + pl - j * dw >= 0 else 0
                if r1 <= r0 or c1 <= c0:
                    continue
                src_off = (r0 * sh + i * dh - pt) * wd + (c0 * sw + j * dw - pl)
                dst_off = (i * kw + j) * p + r0 * wo + c0
                cp = copy_kernel(mb, [cg, r1 - r0, c1 - c0], [h * wd, sh * wd, sw], src_off,
                                 [kh * kw * p, wo, 1], dst_off, isz)
                taps.append(cp)
        px, po = fn.local("i32", "px"), fn.local("i32", "po")
        fn.set(px, "(local.get $x)")
        fn.set(po, "(local.get $out)")
        with fn.loop(n):
            with fn.loop(groups, fn.local("i32", "g")) as gvar:
                fn.emit(f"(memory.fill (local.get $scratch) {i32(0)} {i32(kk * p * isz)})")
                for cp in taps:
                    fn.emit(f"(call {cp} {get(px)} (local.get $scratch))")
                wg = f"(i32.add (local.get $w) (i32.mul {get(gvar)} {i32(og * kk * isz)}))"  # type: ignore[arg-type]
                fn.emit(f"(call {gemm} {wg} (local.get $scratch) {get(po)})")
                fn.inc(px, cg * h * wd * isz)
                fn.inc(po, og * p * isz)
        return fn

    return mb.kernel(key, make)


def scatter_add_kernel(mb: ModuleBuilder, x: TensorType, idx: TensorType, axis: int) -> str:
    """``(x, indices, updates, out)``: out = x, then out[.., indices[i], ..] += updates[i] (indices in
    [-n, n-1], negatives once from the end; anything else traps, see :func:`bounded_index`)."""
    key = ("scatter_add", x, idx, axis)

    def make(name: str) -> Func:
        fn = Func(name, [("$x", "i32"), ("$idx", "i32"), ("$upd", "i32"), ("$out", "i32")])
        s = _shape(x)
        si = _shape(idx)
        r = REPR[x.dtype]
        isz = r.size
        if math.prod(s):
            fn.emit(f"(memory.copy (local.get $out) (local.get $x) {i32(math.prod(s) * isz)})")
        if math.prod(si) == 0 or math.prod(s) == 0:
            return fn
        ax = normalize_axis(axis, len(s))
        xs = contiguous_strides(s)
        us = contiguous_strides(si)
        ib = REPR[idx.dtype].size
        dims = [(si[d], [us[d] * ib, us[d] * isz, 0 if d == ax else xs[d] * isz]) for d in range(len(si))]
        nax = s[ax]
        k = fn.local("i32", "k")
        em = Emit(fn, mb)

        def body(ptr: list[str]) -> None:
            bounded_index(fn, k, ptr[0], idx.dtype, nax)  # ONNX range; it used to wrap modulo n
            addr = em.let(f"(i32.add {ptr[2]} (i32.mul {get(k)} {i32(xs[ax] * isz)}))", "i32", "a")
            val = f"({r.vt}.add {mem(r.load, addr)} {mem(r.load, ptr[1])})"
            from .elementwise import canon

            fn.emit(mem(r.store, addr, 0, canon(x.dtype, val)))

        for_nest(fn, dims, ["(local.get $idx)", "(local.get $upd)", "(local.get $out)"], body)
        return fn

    return mb.kernel(key, make)


def i64c(n: int) -> str:
    return f"(i64.const {int(n)})"
