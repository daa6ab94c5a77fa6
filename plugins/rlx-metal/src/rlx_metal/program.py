"""The rlx-metal executable: the LIR lowered to MSL launches (:func:`launches`), run by the device
kit. A launch is ``(kernel source, buffer values, int params P)``; ``P[0]`` is the grid.

Two runners share the launches: :class:`HostRunner` ("MSL on host", any machine with a C++
compiler: a :class:`~rlx_core.devicekit.KitProgram` over host memory, each kernel a ctypes call of
its shared library) and :class:`AppleRunner` ("Apple GPU", through ``metalcompute`` on macOS;
written for that platform, not exercised on Linux).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import (
    CtypesRuntime,
    DType,
    IRError,
    KitProgram,
    Launch,
    Program,
    Step,
    TensorType,
    normalize_axis,
    single_op_program,
)

from . import msl


def _launch(kernel: str, source: str, bufs: Sequence[str], params: np.ndarray) -> Launch:
    return Launch(kernel, source, tuple(bufs), params, (int(params[0]), 1, 1))


def _contig(shape: tuple[int, ...]) -> list[int]:
    st, acc = [0] * len(shape), 1
    for j in range(len(shape) - 1, -1, -1):
        st[j] = acc
        acc *= shape[j]
    return st


def _bcast_strides(shape: tuple[int, ...], out: tuple[int, ...]) -> list[int]:
    full = (1,) * (len(out) - len(shape)) + tuple(shape)
    st = _contig(full)
    return [0 if full[j] == 1 else st[j] for j in range(len(out))]


def _p(*xs: Any) -> np.ndarray:
    flat: list[int] = []
    for x in xs:
        if isinstance(x, (list, tuple)):
            flat += [int(v) for v in x]
        else:
            flat.append(int(x))
    return np.asarray(flat or [0], np.int32)


def _shape(t: TensorType) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def _ints(attrs: Mapping[str, object], name: str) -> tuple[int, ...]:
    """An ``ints`` attribute (the op's schema has checked its elements)."""
    v = attrs[name]
    if not isinstance(v, tuple):
        raise IRError(f"attribute {name!r} = {v!r} is not a tuple of ints", fix=f"pass {name}=(...)")
    return v


def _copy(kernel: str, x: str, y: str, dt: DType, dims: list[int], ys: list[int], xs: list[int],
          yo: int = 0, xo: int = 0) -> Launch:
    return _launch(kernel, msl.copy_source(dt)[1], [x, y],
                  _p(math.prod(dims), len(dims), yo, xo, dims, ys, xs))


def launches(step: Step, types: Mapping[str, TensorType]) -> list[Launch]:
    op = step.op
    ins, out = list(step.inputs), step.outputs[0]
    its = [types[i] for i in ins]
    ot = types[out]
    oshape = _shape(ot)
    n = math.prod(oshape)
    a = step.attrs
    k = step.kernel
    if op == "fused_elementwise" or k.startswith("metal.ew."):
        prog = str(a["program"]) if op == "fused_elementwise" else _single(op, len(ins), dict(a))
        src = msl.elementwise_source(prog, tuple(t.dtype for t in its), ot.dtype)[1]
        strides = [s for t in its for s in _bcast_strides(_shape(t), oshape)]
        return [_launch(k, src, [*ins, out], _p(n, len(oshape), oshape, strides))]
    if op == "matmul":
        ta, tb = its
        ash = _shape(ta) if ta.rank > 1 else (1, *_shape(ta))
        bsh = _shape(tb) if tb.rank > 1 else (*_shape(tb), 1)
        m, kk = ash[-2:]
        nn = bsh[-1]
        batch = tuple(np.broadcast_shapes(ash[:-2], bsh[:-2]))
        sa = [s * m * kk for s in _bcast_strides(ash[:-2], batch)]
        sb = [s * kk * nn for s in _bcast_strides(bsh[:-2], batch)]
        src = msl.matmul_source(ot.dtype)[1]
        return [_launch(k, src, [*ins, out], _p(n, m, nn, kk, len(batch), batch, sa, sb))]
    if op in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min"):
        xshape = _shape(its[0])
        r = len(xshape)
        red = set(range(r)) if a["axes"] is None else {normalize_axis(x, r) for x in _ints(a, "axes")}
        st = _contig(xshape)
        kept = [d for d in range(r) if d not in red]
        rd = sorted(red)
        src = msl.reduce_source(op.split("_", 1)[1], ot.dtype)[1]
        cnt = math.prod(xshape[d] for d in rd)
        return [_launch(k, src, [ins[0], out],
                       _p(n, len(kept), [xshape[d] for d in kept], [st[d] for d in kept], len(rd),
                          [xshape[d] for d in rd], [st[d] for d in rd], cnt))]
    if op in ("softmax", "log_softmax", "layer_norm"):
        xshape = _shape(its[0])
        ax = normalize_axis(int(a["axis"]), len(xshape)) if xshape else 0  # type: ignore[arg-type]
        inner = math.prod(xshape[ax:])
        rows = math.prod(xshape) // inner if inner else 0
        if op == "layer_norm":
            src = msl.layer_norm_source(float(a["eps"]))[1]  # type: ignore[arg-type]
        else:
            src = msl.softmax_source(op == "log_softmax")[1]
        return [_launch(k, src, [*ins, out], _p(rows, inner))]
    dt = ot.dtype
    if op == "reshape":
        return [_copy(k, ins[0], out, dt, [n], [1], [1])]
    if op in ("transpose", "expand", "slice"):
        xshape = _shape(its[0])
        base = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), xshape, _contig(xshape)) \
            if xshape else np.zeros((), np.int8)
        if op == "transpose":
            v = base.transpose(_ints(a, "perm")) if a["perm"] is not None else base.transpose()
        elif op == "expand":
            v = np.broadcast_to(base, oshape)
        else:
            from rlx_core.plugin import slice_params

            idx: list[Any] = [slice(None)] * len(xshape)
            for axx, sl in slice_params(a, xshape):
                idx[axx] = sl
            v = base[tuple(idx)]
        off = (v.__array_interface__["data"][0] - base.__array_interface__["data"][0]) if v.size else 0
        return [_copy(k, ins[0], out, dt, list(oshape), _contig(oshape), [s for s in v.strides], 0, off)]
    if op == "concat":
        ax = normalize_axis(int(a["axis"]), len(oshape))  # type: ignore[arg-type]
        ost = _contig(oshape)
        res, start = [], 0
        for x, t in zip(ins, its):
            xs = _shape(t)
            if math.prod(xs):
                res.append(_copy(k, x, out, dt, list(xs), ost, _contig(xs), start * ost[ax], 0))
            start += xs[ax]
        return res
    if op == "pad":
        pads = _ints(a, "pads")
        xs = _shape(its[0])
        ost = _contig(oshape)
        fill = _launch(k, msl.fill_source(dt, msl.literal(a["value"], dt))[1], [out], _p(n))  # type: ignore[arg-type]
        yo = sum(int(pads[d]) * ost[d] for d in range(len(xs)))
        res = [fill]
        if math.prod(xs):
            res.append(_copy(k, ins[0], out, dt, list(xs), ost, _contig(xs), yo, 0))
        return res
    if op == "gather":
        xs = _shape(its[0])
        ax = normalize_axis(int(a["axis"]), len(xs))  # type: ignore[arg-type]
        src = msl.gather_source(dt, its[1].dtype)[1]
        return [_launch(k, src, [*ins, out],
                       _p(n, math.prod(_shape(its[1])), math.prod(xs[ax + 1:]), xs[ax]))]
    if op == "iota":
        if not oshape:
            return [_launch(k, msl.iota_source(dt)[1], [out], _p(1, 1, 1))]
        ax = normalize_axis(int(a["axis"]), len(oshape))  # type: ignore[arg-type]
        return [_launch(k, msl.iota_source(dt)[1], [out], _p(n, oshape[ax], math.prod(oshape[ax + 1:])))]
    raise IRError(f"rlx-metal has no MSL for {op}", fix="report this bug (the claim and codegen disagree)")


_single = single_op_program  # (kept: tests render single ops through it)


def all_sources(program: Program) -> list[str]:
    g = program.graph
    return [ln.source for s in program.kernels for ln in launches(s, g.types)]


def _build_all(sources: Sequence[str]) -> Mapping[str, Any]:
    from . import host

    return host.build_all(list(sources))


class HostRunner(KitProgram):
    """MSL on host: each kernel a shared library (:func:`rlx_metal.host.build_all`) whose
    ``rlx_launch(void** buffers, const int* P)`` runs its grid, called through ctypes."""

    mode = "MSL on host"

    def __init__(self, program: Program) -> None:
        rt = CtypesRuntime(_build_all, "rlx_launch")
        super().__init__(program, rt.allocator, rt, lambda s, p: launches(s, p.types))


class AppleRunner:
    """Apple GPU through ``metalcompute`` (macOS only; not tested in this repository's CI).

    The whole program's MSL is one Metal library; the arena, weights and each launch's ``P`` are
    Metal buffers; each launch dispatches ``P[0]`` threads. Values are copied through the arena
    bytes (the planned offsets), so Metal sees the same layout as the host runner.
    """

    mode = "Apple GPU"

    def __init__(self, program: Program) -> None:
        import metalcompute as mc

        self.program = program
        g = program.graph
        plan = program.plan
        self.dev = mc.Device()
        self.launches = [(s.kernel, ln) for s in program.kernels for ln in launches(s, g.types)]
        lib = self.dev.kernel(msl.module([ln.source for _, ln in self.launches]))
        self.arena = np.zeros(max(plan.arena_bytes, 1), np.uint8)
        self.offsets = dict(plan.offsets)
        self.params = {p.name: np.ascontiguousarray(np.asarray(g.weights[p.name]).astype(p.type.dtype.np))
                       for p in g.params}
        self.calls = []
        for kname, ln in self.launches:
            fname = ln.source.split("kernel void ", 1)[1].split("(", 1)[0]
            self.calls.append((kname, lib.function(fname), ln))

    def _run(self, inputs: Mapping[str, np.ndarray], counts: Counter[str] | None) -> dict[str, np.ndarray]:
        g = self.program.graph
        for v in self.program.inputs:
            if v.name in self.offsets:
                a = np.ascontiguousarray(inputs[v.name], v.type.dtype.np)
                off = self.offsets[v.name]
                self.arena[off:off + a.nbytes] = a.view(np.uint8).reshape(-1)
        for _, fn, ln in self.calls:
            n = int(ln.params[0])
            if n == 0:
                continue
            bufs = []
            for b in ln.bufs:  # each value as its own buffer view of the arena (copied back below)
                if b in self.params:
                    bufs.append(self.params[b])
                else:
                    t = g.types[b]
                    off = self.offsets[b]
                    bufs.append(self.arena[off:off + max(t.nbytes(), 1)].view(t.dtype.np))
            out_buf = self.dev.buffer(bufs[-1].copy())  # pad/concat write parts of their output
            fn(n, *bufs[:-1], out_buf, ln.params)
            t = g.types[ln.bufs[-1]]
            off = self.offsets[ln.bufs[-1]]
            self.arena[off:off + t.nbytes()] = np.frombuffer(out_buf, np.uint8)[: t.nbytes()]
        if counts is not None:
            for s in self.program.kernels:
                counts[s.kernel] += 1
        out = {}
        for _, value in self.program.outputs:
            t = g.types[value]
            if value in self.params:
                out[value] = self.params[value].copy()
            else:
                off = self.offsets[value]
                out[value] = self.arena[off:off + t.nbytes()].view(t.dtype.np).reshape(_shape(t)).copy()
        return out

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._run(inputs, None)

    def profile(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Counter[str]]:
        counts: Counter[str] = Counter()
        return self._run(inputs, counts), counts
