"""The WebGPU executable, on the device kit: a :class:`~rlx_core.plugin.KitProgram` with one arena
buffer laid out by ``program.plan``, one constants buffer and one launch-parameter ("meta") buffer
holding every dispatch's parameters at its own aligned offset (bound with a dynamic offset). WebGPU
command buffers are single-use, so nothing is replayed: at bind time every dispatch is resolved to
(pipeline, offset, workgroups) and a run encodes one compute pass from that list and submits it
(WebGPU orders the dispatches of a pass itself). The kit copies inputs in, runs, copies outputs out;
this module lowers each LIR step to WGSL dispatches. The lowering is also what ``rlx export --target
webgpu`` writes out (:mod:`rlx_webgpu.export`), with a recording runtime instead of a device."""

from __future__ import annotations

import math
import struct
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import (
    DType,
    HostAllocator,
    KitProgram,
    Launch,
    Program,
    Step,
    normalize_axis,
    single_op_program,
)

from . import wgsl


def cstrides(shape: tuple[int, ...]) -> list[int]:
    s, acc = [], 1
    for d in reversed(shape):
        s.append(acc)
        acc *= d
    return list(reversed(s))


def bstrides(src: tuple[int, ...], out: tuple[int, ...]) -> list[int]:
    """Element strides of ``src`` broadcast (right-aligned) to ``out``."""
    cs = cstrides(src)
    pad = len(out) - len(src)
    return [0 if i < pad or src[i - pad] == 1 else cs[i - pad] for i in range(len(out))]


# Checked reads of a step's attributes (the op's schema has given them these types); ``default``
# stands in for an absent attribute.
def _int(s: Step, name: str, default: int | None = None) -> int:
    v = s.attrs[name] if default is None else s.attrs.get(name, default)
    if not isinstance(v, (int, float)):
        raise TypeError(f"{s.op}: attribute {name!r} = {v!r} is not an int")
    return int(v)


def _float(s: Step, name: str, default: float) -> float:
    v = s.attrs.get(name, default)
    if not isinstance(v, (int, float)):
        raise TypeError(f"{s.op}: attribute {name!r} = {v!r} is not a number")
    return float(v)


def _ints(s: Step, name: str, default: tuple[int, ...] | None = None) -> tuple[int, ...]:
    v = s.attrs[name] if default is None else s.attrs.get(name, default)
    if not isinstance(v, tuple):
        raise TypeError(f"{s.op}: attribute {name!r} = {v!r} is not a tuple of ints")
    return v


def _opt_ints(s: Step, name: str) -> tuple[int, ...] | None:
    """An ``ints`` attribute that may be absent or ``None``."""
    return None if s.attrs.get(name) is None else _ints(s, name)


def f2i(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", float(x)))[0]


def meta_layout(launches: Sequence[Launch], align: int) -> tuple[np.ndarray, list[int], int]:
    """Every launch's parameters at its own ``align``-byte offset in one int32 array: (array, byte
    offsets, the binding size every dispatch sees)."""
    size = max([4 * len(ln.params) for ln in launches] + [4])
    stride = -(-size // align) * align
    meta = np.zeros(max(len(launches), 1) * stride // 4, np.int32)
    offsets = []
    for i, ln in enumerate(launches):
        at = i * stride // 4
        meta[at:at + len(ln.params)] = np.asarray(ln.params, np.int64).astype(np.int32)
        offsets.append(i * stride)
    return meta, offsets, size


class GpuAllocator:
    """wgpu storage buffers, written and read through the queue."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def alloc(self, nbytes: int) -> Any:
        return self.ctx.buffer(nbytes)

    def copyin(self, buf: Any, offset: int, data: np.ndarray) -> None:
        self.ctx.write(buf, offset, data)

    def copyout(self, buf: Any, offset: int, nbytes: int) -> np.ndarray:
        return self.ctx.read(buf, offset, nbytes)


class GpuRuntime:
    """A compute pipeline per WGSL source (the context memoises them per process); one bind group
    (arena, constants, parameters with a dynamic offset) per program; a run encodes every dispatch
    into one compute pass and submits it."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def load(self, sources: Sequence[str]) -> Mapping[str, Any]:
        return {src: self.ctx.pipeline(src) for src in dict.fromkeys(sources)}

    def bind(self, prog: KitProgram) -> Callable[[], None]:
        assert isinstance(prog, WebGPUProgram)
        ctx = self.ctx
        launches = prog.all_launches()
        if not launches:
            return lambda: None
        meta, offsets, size = meta_layout(launches, ctx.offset_align)
        prog.metabuf = ctx.buffer(meta.nbytes)
        ctx.write(prog.metabuf, 0, meta)
        group = ctx.device.create_bind_group(layout=ctx.bind_layout, entries=[
            {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
            for i, b in enumerate((prog.arena, prog.constant_buf))] + [
            {"binding": 2, "resource": {"buffer": prog.metabuf, "offset": 0, "size": size}}])
        calls = [(prog.functions[ln.source], [off], ln.grid) for ln, off in zip(launches, offsets)]
        device = ctx.device

        def run() -> None:
            enc = device.create_command_encoder()
            cp = enc.begin_compute_pass()
            for pipe, dyn, grid in calls:
                cp.set_pipeline(pipe)
                cp.set_bind_group(0, group, dyn)
                cp.dispatch_workgroups(*grid)
            cp.end()
            device.queue.submit([enc.finish()])

        run.group = group  # type: ignore[attr-defined]
        return run


class RecordingRuntime:
    """No device: keeps the launches (what ``rlx export --target webgpu`` writes out)."""

    def load(self, sources: Sequence[str]) -> Mapping[str, Any]:
        return {src: None for src in dict.fromkeys(sources)}

    def bind(self, prog: KitProgram) -> Callable[[], None]:
        def run() -> None:
            raise RuntimeError("an export-only program does not run")
        return run


class WebGPUProgram(KitProgram):
    def __init__(self, program: Program, ctx: Any = None, *, tiled: bool | None = None,
                 max_groups: int = 65535) -> None:
        """``ctx``: the :class:`~rlx_webgpu.gpu.Context` to run on, or None for an export-only program
        (host buffers, nothing compiled); ``tiled``: the workgroup-memory matmul (GPUs) instead of
        the untiled one (CPU adapters); default: tiled unless the adapter is a CPU."""
        self.ctx = ctx
        self.tiled = (not ctx.cpu_device if ctx is not None else True) if tiled is None else tiled
        self.max_groups = ctx.max_groups if ctx is not None else max_groups
        #: constant linear weights, uploaded once more transposed to (in, out): contiguous loads
        self.transposed: dict[str, str] = {}
        self.metabuf: Any = None
        self._out: list[Launch] = []
        if ctx is None:
            super().__init__(program, HostAllocator(), RecordingRuntime(), lambda s, p: self._lower(s))
        else:
            super().__init__(program, GpuAllocator(ctx), GpuRuntime(ctx), lambda s, p: self._lower(s))
        #: dispatches per claim name (a concat records one per input, a pad two, an empty tensor or a
        #: folded constant transpose none)
        self.dispatch_counts: Counter[str] = Counter()
        for s, lns in self.launches:
            self.dispatch_counts[s.kernel] += sum(not ln.empty for ln in lns)

    def constants(self) -> dict[str, np.ndarray]:
        consts = super().constants()
        outs = {v for _, v in self.program.outputs}
        for s in self.program.kernels:  # transposes of constants: folded once, here (no dispatch per run)
            if s.kernel == "webgpu.transpose" and s.inputs[0] in consts and s.outputs[0] not in outs:
                perm = s.attrs.get("perm")
                consts[s.outputs[0]] = np.ascontiguousarray(np.transpose(consts[s.inputs[0]], perm))
        for s in self.program.kernels:
            if s.kernel == "webgpu.linear" and s.inputs[1] in consts and s.inputs[1] + ".T" not in consts:
                consts[s.inputs[1] + ".T"] = np.ascontiguousarray(consts[s.inputs[1]].T)
                self.transposed[s.inputs[1]] = s.inputs[1] + ".T"
        return consts

    def _lower(self, s: Step) -> list[Launch]:
        self._step, self._out = s, []
        getattr(self, "_k_" + s.kernel.split(".", 1)[1])(s)
        return self._out

    # -- helpers ----------------------------------------------------------------------------------
    def emit(self, src: str, meta: list[int], n: int | None = None,
             groups: tuple[int, int, int] | None = None) -> None:
        if groups is None:
            if not n:
                return
            groups = (max(1, min(-(-n // wgsl.WG), self.max_groups)), 1, 1)
        if 0 in groups:
            return
        self._out.append(Launch(self._step.kernel, src, (), [int(x) for x in meta], groups))

    def _copy(self, n: int, shape: list[int], src: str, in_base: int, ist: list[int], out_off: int,
              ost: list[int]) -> None:
        """Strided copy of ``shape`` elements (strides in elements) of ``src``'s dtype."""
        b, off = self.locate(src)
        dt = self.types[src].dtype
        if dt is DType.BOOL:  # bytes; the output is contiguous (claims guarantee it)
            self.emit(wgsl.copy8(), [n, len(shape), b, off, out_off, in_base, *shape, *ist, *ost],
                      -(-n // 4))
            return
        if dt.np.itemsize == 8:  # two words per element: one more (innermost) dim of 2
            shape, ist, ost = [*shape, 2], [2 * x for x in ist] + [1], [2 * x for x in ost] + [1]
            n, in_base = 2 * n, 2 * in_base
        self.emit(wgsl.copy32(), [n, len(shape), b, off, out_off, in_base, *shape, *ist, *ost], n)

    # -- kernels ----------------------------------------------------------------------------------
    def _elementwise(self, s: Step, program: str) -> None:
        out = self.shape(s.outputs[0])
        n = math.prod(out)
        dts = tuple(self.types[i].dtype for i in s.inputs)
        src = wgsl.elementwise(program, dts, self.types[s.outputs[0]].dtype)
        meta = [n, len(out), self.locate(s.outputs[0])[1], 0, *out]
        for i in s.inputs:
            meta += [*self.locate(i), *bstrides(self.shape(i), out)]
        per_word = {DType.BOOL: 4, DType.F16: 2, DType.BF16: 2}.get(self.types[s.outputs[0]].dtype, 1)
        self.emit(src, meta, -(-n // per_word))

    def _k_fused_elementwise(self, s: Step) -> None:
        self._elementwise(s, str(s.attrs["program"]))

    def _k_matmul(self, s: Step) -> None:
        a, b = (self.shape(i) for i in s.inputs)
        a2 = (1, *a) if len(a) == 1 else a
        b2 = (*b, 1) if len(b) == 1 else b
        M, K, N = a2[-2], a2[-1], b2[-1]  # noqa: N806
        ab, bb = a2[:-2], b2[:-2]
        batch = tuple(np.broadcast_shapes(ab, bb))
        ast = [x * M * K for x in bstrides(ab, batch)] if ab else [0] * len(batch)
        bst = [x * K * N for x in bstrides(bb, batch)] if bb else [0] * len(batch)
        nb = math.prod(batch)
        meta = [M, N, K, *self.locate(s.inputs[0]), *self.locate(s.inputs[1]), self.locate(s.outputs[0])[1],
                len(batch), *batch, *ast, *bst]
        dt = self.types[s.outputs[0]].dtype
        bufs = "".join("AW"[self.locate(v)[0]] for v in s.inputs)  # storage arrays baked into the shader
        if not self.tiled and M % 4 == 0 and N % 4 == 0:  # CPU adapters: 4x4 register blocks
            self.emit(wgsl.matmul_4x4(dt, bufs), meta, groups=(-(-N // (4 * wgsl.WG)), M // 4, nb))
        elif not self.tiled:  # CPU adapters (lavapipe): no workgroup-memory tiles, barriers are costly there
            self.emit(wgsl.matmul_simple(dt, bufs), meta, groups=(-(-N // wgsl.WG), -(-M // 4), nb))
        else:
            self.emit(wgsl.matmul(dt), meta, groups=(-(-N // 16), -(-M // 16), nb))

    def _k_linear(self, s: Step) -> None:
        x, w = self.shape(s.inputs[0]), self.shape(s.inputs[1])
        N, K = w  # noqa: N806
        R = math.prod(x[:-1])  # noqa: N806
        wname = self.transposed.get(s.inputs[1], s.inputs[1])
        meta = [R, N, K, *self.locate(s.inputs[0]), *self.locate(wname), *self.locate(s.inputs[2]),
                self.locate(s.outputs[0])[1], 1 if wname != s.inputs[1] else 0]
        self.emit(wgsl.linear(), meta, groups=(-(-N // wgsl.WG), min(R, self.max_groups), 1))

    def _reduce(self, s: Step) -> None:
        x = self.shape(s.inputs[0])
        given = _opt_ints(s, "axes")
        axes = set(range(len(x))) if given is None else {normalize_axis(int(a), len(x)) for a in given}
        cs = cstrides(x)
        kept = [(x[d], cs[d]) for d in range(len(x)) if d not in axes]
        red = [(x[d], cs[d]) for d in range(len(x)) if d in axes]
        n = math.prod(k for k, _ in kept)
        meta = [n, len(kept), len(red), *self.locate(s.inputs[0]), self.locate(s.outputs[0])[1],
                math.prod(r for r, _ in red)]
        for k in kept + red:
            meta += list(k)
        self.emit(wgsl.reduce(s.op, self.types[s.inputs[0]].dtype), meta, n)

    _k_reduce_sum = _k_reduce_prod = _k_reduce_mean = _k_reduce_max = _k_reduce_min = _reduce

    def _rows(self, s: Step) -> None:
        x = self.shape(s.inputs[0])
        ax = normalize_axis(_int(s, "axis", -1), len(x))
        rows, cols = math.prod(x[:ax]), math.prod(x[ax:])
        eps = f2i(_float(s, "eps", 0.0))
        gb = self.locate(s.inputs[1]) if len(s.inputs) > 1 else (0, 0)
        bb = self.locate(s.inputs[2]) if len(s.inputs) > 2 else (0, 0)
        meta = [rows, cols, *self.locate(s.inputs[0]), self.locate(s.outputs[0])[1], eps, *gb, *bb]
        self.emit(wgsl.rows(s.op), meta, rows if cols else 0)

    _k_softmax = _k_log_softmax = _k_layer_norm = _rows

    def _k_reshape(self, s: Step) -> None:
        n = math.prod(self.shape(s.outputs[0]))
        self._copy(n, [n], s.inputs[0], 0, [1], self.locate(s.outputs[0])[1], [1])

    def _k_transpose(self, s: Step) -> None:
        if s.outputs[0] in self.constant_offsets:  # a constant, transposed at compile time
            return
        x = self.shape(s.inputs[0])
        given = _opt_ints(s, "perm")
        perm = (list(reversed(range(len(x)))) if given is None
                else [normalize_axis(int(p), len(x)) for p in given])
        out = self.shape(s.outputs[0])
        cs = cstrides(x)
        self._copy(math.prod(out), list(out), s.inputs[0], 0, [cs[p] for p in perm],
                   self.locate(s.outputs[0])[1], cstrides(out))

    def _k_expand(self, s: Step) -> None:
        out = self.shape(s.outputs[0])
        self._copy(math.prod(out), list(out), s.inputs[0], 0, bstrides(self.shape(s.inputs[0]), out),
                   self.locate(s.outputs[0])[1], cstrides(out))

    def _k_slice(self, s: Step) -> None:
        x = self.shape(s.inputs[0])
        out = self.shape(s.outputs[0])
        cs = cstrides(x)
        ist = list(cs)
        base = 0
        starts, stops = _ints(s, "starts"), _ints(s, "stops")
        axes = _opt_ints(s, "axes") or tuple(range(len(starts)))
        steps = _opt_ints(s, "steps") or (1,) * len(starts)
        for st, sp, given, step in zip(starts, stops, axes, steps):
            ax = normalize_axis(int(given), len(x))
            r = range(*slice(int(st), int(sp), int(step)).indices(x[ax]))
            if len(r):
                base += r.start * cs[ax]
            ist[ax] = cs[ax] * int(step)
        self._copy(math.prod(out), list(out), s.inputs[0], base, ist, self.locate(s.outputs[0])[1],
                   cstrides(out))

    def _k_concat(self, s: Step) -> None:
        out = self.shape(s.outputs[0])
        ax = normalize_axis(_int(s, "axis"), len(out))
        co = cstrides(out)
        o = self.locate(s.outputs[0])[1]
        pos = 0
        esz = self.types[s.outputs[0]].dtype.np.itemsize
        for i in s.inputs:
            x = self.shape(i)
            self._copy(math.prod(x), list(x), i, 0, cstrides(x), o + esz * pos * co[ax], co)
            pos += x[ax]

    def _k_pad(self, s: Step) -> None:
        x = self.shape(s.inputs[0])
        out = self.shape(s.outputs[0])
        r = len(x)
        pads = _ints(s, "pads")
        o = self.locate(s.outputs[0])[1]
        v = _float(s, "value", 0.0)
        bits = f2i(v) if self.types[s.outputs[0]].dtype is DType.F32 else int(np.int32(int(v)))
        n = math.prod(out)
        self.emit(wgsl.fill32(), [n, o, bits], n)
        co = cstrides(out)
        off = o + 4 * sum(int(pads[i]) * co[i] for i in range(r))
        self._copy(math.prod(x), list(x), s.inputs[0], 0, cstrides(x), off, co)

    def _k_gather(self, s: Step) -> None:
        x = self.shape(s.inputs[0])
        idx = self.shape(s.inputs[1])
        ax = normalize_axis(_int(s, "axis"), len(x))
        n = math.prod(self.shape(s.outputs[0]))
        esz = 8 if self.types[s.inputs[1]].dtype is DType.I64 else 4
        words = self.types[s.inputs[0]].dtype.np.itemsize // 4
        n *= words
        meta = [n, math.prod(idx), math.prod(x[ax + 1:]) * words, x[ax], *self.locate(s.inputs[0]),
                *self.locate(s.inputs[1]), self.locate(s.outputs[0])[1]]
        self.emit(wgsl.gather(esz), meta, n)

    def _axis_split(self, s: Step) -> tuple[int, int, int]:
        x = self.shape(s.inputs[0]) or (1,)
        ax = normalize_axis(_int(s, "axis", -1), len(x))
        return math.prod(x[:ax]), x[ax], math.prod(x[ax + 1:])

    def _k_cumsum(self, s: Step) -> None:
        outer, d, inner = self._axis_split(s)
        n = outer * inner
        meta = [n, d, inner, *self.locate(s.inputs[0]), self.locate(s.outputs[0])[1],
                int(bool(s.attrs.get("exclusive"))), int(bool(s.attrs.get("reverse")))]
        self.emit(wgsl.scan(self.types[s.inputs[0]].dtype), meta, n)

    def _argext(self, s: Step) -> None:
        outer, d, inner = self._axis_split(s)
        n = outer * inner
        meta = [n, d, inner, *self.locate(s.inputs[0]), self.locate(s.outputs[0])[1]]
        self.emit(wgsl.argext(s.op, self.types[s.inputs[0]].dtype), meta, n)

    _k_argmax = _k_argmin = _argext

    def _k_conv2d(self, s: Step) -> None:
        nb, c, h, w = self.shape(s.inputs[0])
        o, cg, kh, kw = self.shape(s.inputs[1])
        out = self.shape(s.outputs[0])
        st, pads, dil = _ints(s, "strides", (1, 1)), _ints(s, "pads", (0, 0, 0, 0)), \
            _ints(s, "dilations", (1, 1))
        groups = _int(s, "groups", 1)
        n = math.prod(out)
        meta = [n, c, h, w, o, cg, kh, kw, out[2], out[3], st[0], st[1], pads[0], pads[1], dil[0], dil[1],
                o // groups, *self.locate(s.inputs[0]), *self.locate(s.inputs[1]),
                self.locate(s.outputs[0])[1]]
        self.emit(wgsl.conv2d(self.types[s.inputs[0]].dtype), meta, n)

    def _k_iota(self, s: Step) -> None:
        out = self.shape(s.outputs[0]) or (1,)
        ax = normalize_axis(_int(s, "axis"), len(out))
        n = math.prod(out)
        self.emit(wgsl.iota(self.types[s.outputs[0]].dtype),
                  [n, math.prod(out[ax + 1:]), out[ax], self.locate(s.outputs[0])[1]], n)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_k_"):  # single elementwise ops
            def k(s: Step) -> None:
                self._elementwise(s, single_op_program(s.op, len(s.inputs), dict(s.attrs)))
            return k
        raise AttributeError(name)
