"""The rlx-metal executable: the LIR lowered to MSL launches (:func:`launches`), run by the device
kit. A launch is ``(kernel source, buffer values, int params P)``; ``P[0]`` is the grid.

Two runners share the launches: :class:`HostRunner` ("MSL on host", any machine with a C++
compiler: a :class:`~rlx_core.devicekit.KitProgram` over host memory, each kernel a ctypes call of
its shared library) and :class:`AppleRunner` ("Apple GPU", through ``metalcompute`` on macOS;
written for that platform, not exercised on Linux).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import (
    CtypesRuntime,
    KitProgram,
    Launch,
    Program,
    Step,
    TensorType,
    cstyle,
    single_op_program,
)

from . import msl


def launches(step: Step, types: Mapping[str, TensorType]) -> list[Launch]:
    """One LIR step as MSL launches: the device kit's C-style kernel library, Metal dialect."""
    return cstyle.launches(msl.MSL, step, types, "metal.ew.")


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
            fname = cstyle.kernel_name(ln.source)
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
                raw = self.arena[off:off + t.nbytes()].view(t.dtype.np)
                out[value] = raw.reshape(tuple(int(d) for d in t.shape)).copy()
        return out

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._run(inputs, None)

    def profile(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Counter[str]]:
        counts: Counter[str] = Counter()
        return self._run(inputs, counts), counts
