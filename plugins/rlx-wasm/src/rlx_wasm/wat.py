"""A tiny WebAssembly text (WAT) writer: functions with named locals, counted loops, a module.

Kernels are generated as folded s-expressions. Everything here is plain string building; the
module is assembled by ``wasmtime.wat2wasm`` (no external toolchain).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager


def i32(n: int) -> str:
    n = int(n)
    if n >= 2**31:
        n -= 2**32
    return f"(i32.const {n})"


def i64(n: int) -> str:
    n = int(n)
    if n >= 2**63:
        n -= 2**64
    return f"(i64.const {n})"


def f32(x: float) -> str:
    """An exact f32 literal (NaN and infinities included), written through its bit pattern."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    if not math.isfinite(x):
        return f"(f32.reinterpret_i32 {i32(bits)})"
    return f"(f32.const {float_hex32(bits)})"


def f64(x: float) -> str:
    if not math.isfinite(x):
        bits = struct.unpack("<Q", struct.pack("<d", x))[0]
        return f"(f64.reinterpret_i64 {i64(bits)})"
    return f"(f64.const {float(x).hex()})"


def float_hex32(bits: int) -> str:
    return struct.unpack("<f", struct.pack("<I", bits))[0].hex()


def v128_f32(x: float) -> str:
    """A v128 splat of an f32 constant (a constant vector, hoisted by the compiler)."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return f"(v128.const i32x4 {bits} {bits} {bits} {bits})"


def v128_i32(n: int) -> str:
    n = int(n) & 0xFFFFFFFF
    return f"(v128.const i32x4 {n} {n} {n} {n})"


def get(name: str) -> str:
    return f"(local.get {name})"


def setl(name: str, expr: str) -> str:
    return f"(local.set {name} {expr})"


def add_ptr(base: str, off: int) -> str:
    return base if off == 0 else f"(i32.add {base} {i32(off)})"


def mem(op: str, addr: str, offset: int = 0, *rest: str) -> str:
    """A load/store with a constant byte offset folded into the memarg when it is non-negative."""
    if offset < 0:
        addr, offset = f"(i32.sub {addr} {i32(-offset)})", 0
    off = f" offset={offset}" if offset else ""
    tail = (" " + " ".join(rest)) if rest else ""
    return f"({op}{off} {addr}{tail})"


class Func:
    """One wasm function: parameters, typed locals allocated on demand, a list of body lines."""

    def __init__(self, name: str, params: Sequence[tuple[str, str]] = (), result: str | None = None) -> None:
        self.name = name
        self.params = list(params)
        self.result = result
        self.locals: dict[str, str] = {}
        self.body: list[str] = []
        self._n = 0
        self._labels = 0

    def local(self, ty: str, hint: str = "t") -> str:
        self._n += 1
        name = f"${hint}{self._n}"
        self.locals[name] = ty
        return name

    def label(self, hint: str = "L") -> str:
        self._labels += 1
        return f"${hint}{self._labels}"

    def emit(self, *lines: str) -> None:
        self.body.extend(lines)

    def set(self, name: str, expr: str) -> None:
        self.body.append(setl(name, expr))

    def inc(self, name: str, by: int) -> None:
        if by:
            self.body.append(setl(name, f"(i32.add {get(name)} {i32(by)})"))

    @contextmanager
    def loop(self, count: int, var: str | None = None) -> Iterator[str | None]:
        """``for var in range(count)`` with a compile-time count (no code when ``count <= 0``).

        Written as a do-while loop (the count is known to be positive). The body is emitted by
        the ``with`` block; the counter is local ``var`` (a new one when ``None``).
        """
        if count <= 0:
            saved = self.body
            self.body = []
            try:
                yield var
            finally:
                self.body = saved
            return
        if count == 1 and var is None:
            yield None
            return
        v = var or self.local("i32", "i")
        lab = self.label("l")
        self.set(v, i32(0))
        self.emit(f"(loop {lab}")
        yield v
        self.set(v, f"(i32.add {get(v)} {i32(1)})")
        self.emit(f"(br_if {lab} (i32.lt_u {get(v)} {i32(count)})))")

    @contextmanager
    def loop_dyn(self, var: str, start: str, end: str, step: int = 1) -> Iterator[str]:
        """``for var in range(start, end, step)`` with run-time bounds (may run zero times)."""
        blk, lab = self.label("b"), self.label("l")
        self.set(var, start)
        self.emit(f"(block {blk} (loop {lab}", f"(br_if {blk} (i32.ge_s {get(var)} {end}))")
        yield var
        self.set(var, f"(i32.add {get(var)} {i32(step)})")
        self.emit(f"(br {lab})))")

    def render(self, export: str | None = None) -> str:
        head = f"(func {self.name}"
        if export:
            head += f' (export "{export}")'
        for p, t in self.params:
            head += f" (param {p} {t})"
        if self.result:
            head += f" (result {self.result})"
        lines = [head]
        lines += [f"  (local {n} {t})" for n, t in self.locals.items()]
        lines += ["  " + b for b in self.body]
        lines.append(")")
        return "\n".join(lines)


#: Engines the generated code can be tuned for: "wasmtime" (Cranelift, the in-process runtime) and
#: "js" (V8 in Node.js and Chromium: exported modules).
TUNINGS = ("wasmtime", "js")


class ModuleBuilder:
    """Functions deduplicated by key (kernels with equal shapes share one function), helpers on demand."""

    def __init__(self, simd: bool, tune: str = "wasmtime") -> None:
        self.simd = simd
        #: the engine the code is tuned for: changes instruction choice and speed, never results
        self.tune = tune
        self.funcs: list[str] = []
        self._by_key: dict[object, str] = {}
        self._helpers: dict[str, str] = {}
        self.scratch_bytes = 0

    def kernel(self, key: object, make: Callable[[str], Func]) -> str:
        """The function for ``key``, generated by ``make(name)`` the first time."""
        name = self._by_key.get(key)
        if name is None:
            name = f"$k{len(self._by_key)}"
            self._by_key[key] = name
            self.funcs.append(make(name).render())
        return name

    def helper(self, name: str, make: Callable[[ModuleBuilder], str]) -> str:
        """A named library function (exp, log, ...), emitted once when first used."""
        if name not in self._helpers:
            self._helpers[name] = ""  # reserve: helpers may call helpers
            self._helpers[name] = make(self)
        return name

    def need_scratch(self, nbytes: int) -> None:
        self.scratch_bytes = max(self.scratch_bytes, nbytes)

    def render(self, pages: int, extra: Sequence[str] = ()) -> str:
        parts = ["(module", f'  (memory (export "memory") {pages})']
        parts += [h for h in self._helpers.values() if h]
        parts += self.funcs
        parts += list(extra)
        parts.append(")")
        return "\n".join(parts)
