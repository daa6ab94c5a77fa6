"""LIR program -> one JAX function -> one StableHLO module, compiled by PJRT.

The whole program is one Python function (:func:`_program_fn`) that walks the kernel steps at
trace time and emits ``jax.numpy``/``lax`` ops (:mod:`rlx_xla.ops`); ``jax.jit`` traces it once,
so XLA sees the entire graph and fuses across what were separate RLX kernels. Transfers and the
buffer plan are not used: PJRT owns device memory and moves inputs and outputs itself.

Compiled executables are cached per *structure*: the steps with values renamed by first use, the
input and weight types, the outputs and the target device. Weights are arguments of the compiled
function, not constants folded into it, so two graphs that differ only in names or weight values
(the conformance suite's cases, a model re-specialised to a shape it had before) share one
executable, and a large model does not embed its weights in the HLO.

64-bit types: JAX canonicalises i64/f64 to 32 bits unless ``jax_enable_x64`` is on. Turning the
flag on globally (``jax.config.update``) would change every other JAX user in the process, so the
trace, the compile and every call run inside ``jax.enable_x64(True)``, a thread-local context that
is restored on exit; programs of this backend are typed explicitly, so nothing they compute
depends on JAX's default dtypes.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding

from rlx_core.plugin import InputError, IRError, Program

from .ops import emit

#: Compiled executables kept per process (least recently used dropped first).
CACHE_SIZE = 256
#: Programs whose every value has at most this many elements are compiled with LLVM at -O0: for
#: them compilation (tens of ms) dwarfs the run (microseconds), and O0 cuts XLA CPU's compile time
#: by about a third. It changes code quality only (no fast-math either way), never results.
SMALL_ELEMENTS = 1 << 16

_LOCK = threading.Lock()
_COMPILED: OrderedDict[tuple[str, str], Any] = OrderedDict()
#: Counters for tests and the conformance timing note: executables built and reused.
STATS: Counter[str] = Counter()


#: (op, input ids, output ids, attrs, input types, output types)
_Step = tuple[str, tuple[int, ...], tuple[int, ...], Any, tuple[Any, ...], tuple[Any, ...]]


class _Plan:
    """The program's structure with value names replaced by positions (first use order)."""

    def __init__(self, program: Program) -> None:
        g = program.graph
        self.input_names = [v.name for v in program.inputs]
        self.param_names = [p.name for p in g.params]
        ids: dict[str, int] = {}

        def vid(name: str) -> int:
            if name not in ids:
                ids[name] = len(ids)
            return ids[name]

        self.inputs = [vid(n) for n in self.input_names]
        self.params = [vid(n) for n in self.param_names]
        self.steps: list[_Step] = []
        self.kernels: list[str] = []
        for s in program.kernels:
            ins = tuple(vid(i) for i in s.inputs)
            outs = tuple(vid(o) for o in s.outputs)
            self.steps.append((s.op, ins, outs, s.attrs, tuple(g.types[i] for i in s.inputs),
                               tuple(g.types[o] for o in s.outputs)))
            self.kernels.append(s.kernel)
        self.outputs = [vid(v) for _, v in program.outputs]
        self.output_names = [v for _, v in program.outputs]
        made = {o for s in self.steps for o in s[2]} | set(self.inputs) | set(self.params)
        missing = [v for v, i in zip(self.output_names, self.outputs) if i not in made]
        if missing:
            raise IRError(f"xla: program outputs {missing} are produced by no step, input or weight",
                          fix="this is a bug in the lowering; report it with the model")
        # The key: everything that shapes the HLO, and nothing else (no names, no weight values).
        parts = [repr([(op, ins, outs, sorted((k, repr(v)) for k, v in dict(attrs).items()),
                        [repr(t) for t in its], [repr(t) for t in ots])
                       for op, ins, outs, attrs, its, ots in self.steps]),
                 repr([(i, repr(g.types[n])) for i, n in zip(self.inputs, self.input_names)]),
                 repr([(i, repr(g.types[n])) for i, n in zip(self.params, self.param_names)]),
                 repr(self.outputs)]
        self.small = all(t.numel() <= SMALL_ELEMENTS for t in g.types.values())
        self.key = hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def function(self) -> Any:
        """The program as one function ``(inputs tuple, weights tuple) -> outputs tuple``."""
        steps, inputs, params, outputs = self.steps, self.inputs, self.params, self.outputs

        def program(xs: tuple[Any, ...], ws: tuple[Any, ...]) -> tuple[Any, ...]:
            env: dict[int, Any] = dict(zip(inputs, xs))
            env.update(zip(params, ws))
            for op, ins, outs, attrs, its, ots in steps:
                for o, val in zip(outs, emit(op, [env[i] for i in ins], attrs, its, ots)):
                    env[o] = val
            return tuple(env[o] for o in outputs)
        return program


def _compile(plan: _Plan, device: Any, in_avals: list[Any], weights: tuple[Any, ...]) -> Any:
    key = (plan.key, f"{device.platform}:{device.id}")
    with _LOCK:
        hit = _COMPILED.get(key)
        if hit is not None:
            _COMPILED.move_to_end(key)
            STATS["reused"] += 1
            return hit
    with jax.enable_x64(True):
        try:
            lowered = jax.jit(plan.function()).lower(tuple(in_avals), weights)
            small = plan.small and device.platform == "cpu"
            # XLA takes option values as strings (or bools); "0" is an int option's text form.
            exe = lowered.compile({"xla_backend_optimization_level": "0"} if small else None)
        except Exception as e:  # an XLA or tracing failure names the stage and the device
            raise IRError(f"xla: lowering/compiling the program for {device} failed: "
                          f"{type(e).__name__}: {e}",
                          fix="run `rlx explain` on the model and report the failing op") from e
    with _LOCK:
        _COMPILED[key] = exe
        STATS["compiled"] += 1
        while len(_COMPILED) > CACHE_SIZE:
            _COMPILED.popitem(last=False)
    return exe


class XlaProgram:
    """A compiled program: one PJRT executable for the whole graph on one JAX device."""

    def __init__(self, program: Program, device: Any) -> None:
        self.program = program
        self.device = device
        self.plan = _Plan(program)
        g = program.graph
        sharding = SingleDeviceSharding(device)
        with jax.enable_x64(True):
            # Weights go to the device once, here; each run passes the same device buffers.
            self.weights = tuple(jax.device_put(np.asarray(g.weights[n]), device)
                                 for n in self.plan.param_names)
            avals = [jax.ShapeDtypeStruct(tuple(g.types[n].shape), g.types[n].dtype.np, sharding=sharding)
                     for n in self.plan.input_names]
        self.executable = _compile(self.plan, device, avals, self.weights)
        self.kernels = list(self.plan.kernels)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            xs = tuple(inputs[n] for n in self.plan.input_names)
        except KeyError as e:
            raise InputError(f"xla: input {e.args[0]!r} is missing", fix="feed every graph input") from None
        with jax.enable_x64(True):
            outs = self.executable(xs, self.weights)
            # np.array copies: the caller owns its outputs (a device buffer may be reused or freed).
            return {name: np.array(o) for name, o in zip(self.plan.output_names, outs)}

    def profile(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Counter[str]]:
        # One executable runs every step of the program once per call (XLA fuses them, so per-step
        # counts are by construction, not measured).
        return self.run(inputs), Counter(self.kernels)

    def hlo_text(self) -> str:
        """The optimised HLO of this program (for inspection and tests)."""
        return str(self.executable.as_text())
