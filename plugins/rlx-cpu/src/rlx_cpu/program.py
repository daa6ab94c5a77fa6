"""The CPU executable: one 64-byte-aligned arena, a view per planned value, a bound kernel per step."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx_core.lir import Program, Step


def _aligned_arena(nbytes: int, align: int = 64) -> np.ndarray:
    raw = np.empty(nbytes + align, np.uint8)
    shift = (-raw.ctypes.data) % align
    return raw[shift:shift + nbytes]


class CpuProgram:
    def __init__(self, program: Program, factories: Mapping[str, Any]) -> None:
        self.program = program
        g = program.graph
        plan = program.plan
        self.arena = _aligned_arena(max(plan.arena_bytes, 1))
        views: dict[str, np.ndarray] = {}
        for name, off in plan.offsets.items():
            t = g.types[name]
            n = t.nbytes()
            views[name] = self.arena[off:off + n].view(t.dtype.np).reshape(t.shape)
        for p in g.params:
            views[p.name] = np.asarray(g.weights[p.name])
        self.views = views
        self.inputs = [(v.name, views[v.name]) for v in program.inputs]
        self.outputs = list(dict.fromkeys(v for _, v in program.outputs))
        runs = []
        for s in program.kernels:
            runs.append(self._bind(s, factories))
        self.runs = tuple(runs)
        self.kernel_names = tuple(s.kernel for s in program.kernels)

    def _bind(self, s: Step, factories: Mapping[str, Any]) -> Any:
        ins = [self.views[i] for i in s.inputs]
        outs = [self.views[o] for o in s.outputs]
        with np.errstate(all="ignore"):
            return factories[s.kernel](ins, outs, s.attrs)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name, view in self.inputs:
            np.copyto(view, inputs[name])
        with np.errstate(all="ignore"):
            for r in self.runs:
                r()
        # Outputs are copied out: the arena is reused by the next run.
        return {o: self.views[o].copy() for o in self.outputs}

    def profile(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Counter[str]]:
        """Like ``run``, counting kernel calls by claim name (a separate loop keeps ``run`` lean)."""
        counts: Counter[str] = Counter()
        for name, view in self.inputs:
            np.copyto(view, inputs[name])
        with np.errstate(all="ignore"):
            for kname, r in zip(self.kernel_names, self.runs):
                r()
                counts[kname] += 1
        return {o: self.views[o].copy() for o in self.outputs}, counts
