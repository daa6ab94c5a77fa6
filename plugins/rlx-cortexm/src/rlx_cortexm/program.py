"""The compiled program ``rlx_compile`` returns: C sources now, firmware on first run."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx_core.plugin import Program

from . import codegen, firmware
from .targets import Target


class CortexMProgram:
    """One LIR program as firmware. ``run`` builds the ELF (cached by source hash) and runs it on QEMU.

    ``sources`` are the model-specific files, ``files()`` every file of the firmware; ``build()``
    returns the :class:`~rlx_cortexm.firmware.Firmware` with its flash and RAM sizes.
    """

    def __init__(self, program: Program, target: Target) -> None:
        self.program = program
        self.target = target
        self.generated = codegen.generate(program)
        self.sources = self.generated.files
        self.kernels = list(self.generated.kernels)
        self._fw: firmware.Firmware | None = None
        #: statistics of the latest run (stack high-water mark, seconds), None before the first run
        self.last_run: firmware.RunResult | None = None
        self._lock = threading.Lock()

    def files(self) -> dict[str, str]:
        return {**firmware.static_sources(), **self.sources}

    def build(self) -> firmware.Firmware:
        with self._lock:
            if self._fw is None:
                self._fw = firmware.build(self.sources, self.target, self.generated.arena_bytes)
            return self._fw

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        fw = self.build()
        parts = []
        for v in self.program.inputs:
            a = np.ascontiguousarray(np.asarray(inputs[v.name]), dtype=v.type.dtype.np)
            parts.append(a.tobytes())
        res = firmware.run(fw, self.target, b"".join(parts))
        self.last_run = res
        raw = res.output
        want = sum(n for *_, n in self.generated.outputs)
        if len(raw) != want:
            raise firmware.FirmwareError(f"rlx_out.bin has {len(raw)} bytes, expected {want}")
        out: dict[str, np.ndarray] = {}
        pos = 0
        g = self.program.graph
        for value, _, shape, nbytes in self.generated.outputs:
            dt = g.types[value].dtype.np
            out[value] = np.frombuffer(raw[pos:pos + nbytes], dtype=dt).reshape(shape).copy()
            pos += nbytes
        return out

    def profile(self, inputs: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], Counter[str]]:
        # The generated function calls every step's kernel exactly once per run.
        return self.run(inputs), Counter(self.kernels)
