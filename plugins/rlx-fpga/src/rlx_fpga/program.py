"""The compiled program ``rlx_compile`` returns: Verilog now, simulation (Icarus Verilog) on run."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from . import rtl, sim


def _bits(a: np.ndarray) -> np.ndarray:
    """int64 stream words: integers as values, float32 as their bit patterns."""
    if a.dtype.kind == "f":
        return a.astype(np.float32).view(np.uint32).astype(np.int64)
    return a.astype(np.int64)


class FPGAProgram:
    """One LIR program as one Verilog module. ``run`` writes the RTL, testbench and input vectors
    (``.mem``), compiles with ``iverilog -g2012``, simulates with ``vvp`` and reads the output
    stream back; ``last_run`` holds the cycle counts of the latest run."""

    def __init__(self, program: Any, parallel: int = 4) -> None:
        self.program = program
        self.design = rtl.generate(program, parallel=parallel)
        self.kernels = list(self.design.kernels)
        self.last_run: sim.SimResult | None = None
        self._dir: Path | None = None
        self._lock = threading.Lock()

    def build(self) -> Path:
        with self._lock:
            if self._dir is None:
                self._dir = sim.build(self.design)
            return self._dir

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        g = self.program.graph
        parts = [_bits(np.ascontiguousarray(np.asarray(inputs[v.name]), dtype=v.type.dtype.np).reshape(-1))
                 for v in self.program.inputs]
        words = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        n_out = sum(int(np.prod(s, dtype=np.int64)) for _, _, s in self.design.outputs)
        if n_out == 0:
            flat = np.zeros(0, np.int64)
        else:
            res = sim.simulate(self.build(), words, n_out)
            self.last_run = res
            flat = res.words
        out: dict[str, np.ndarray] = {}
        pos = 0
        for value, _, shape in self.design.outputs:
            n = int(np.prod(shape, dtype=np.int64))
            dt = np.dtype(g.types[value].dtype.np)
            words = flat[pos:pos + n]
            if dt.kind == "f":
                out[value] = (words & 0xFFFFFFFF).astype(np.uint32).view(np.float32).reshape(shape)
            else:
                out[value] = words.astype(dt).reshape(shape)
            pos += n
        return out

    def profile(self, inputs: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], Counter[str]]:
        # The FSM runs every step exactly once per run.
        return self.run(inputs), Counter(self.kernels)
