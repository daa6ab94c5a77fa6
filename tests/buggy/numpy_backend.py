"""A small, self-contained NumPy backend of reference quality: the template the bug tests plant into.

It is the *source* of a plugin: ``tests/buggy/bugs.py`` reads this file, renames the backend and
applies one planted bug (a one-line replacement), and the test installs the result as a real
distribution with ``make_plugin``. It must never import another plugin (no ``rlx_cpu``).

Design, like a device backend with host memory: every graph value lives in one arena at the offset
the core's memory planner chose (``program.plan.offsets``); graph inputs are copied in, weights are
uploaded once (copied), and each kernel computes a result that is stored *flat* into its output
buffer (raw memory, as a C kernel writes ``out[i]``). Elementwise claims allow in-place planning.
f16 ``reduce_sum`` and ``matmul`` run natively, accumulating in f32 as the RLX contract requires;
the other f16 variants reach the f32 kernels through the core's ``compute_f16_in_f32`` rewrite.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlx_core import API_VERSION
from rlx_core.hookspecs import hookimpl
from rlx_core.records import BackendInfo, DeviceCaps, DeviceInfo, KernelClaim

NAME = "refnp"

F = {"f32", "f64"}
FH = F | {"f16"}
FI = F | {"i32"}

#: Accumulator dtype per storage dtype: half precision sums in f32 (the RLX contract).
_ACC = {np.dtype(np.float16): np.dtype(np.float32)}


def _acc(dt: Any) -> np.dtype:
    return _ACC.get(np.dtype(dt), np.dtype(dt))


def _bcast(xs: Sequence[np.ndarray], shape: tuple[int, ...]) -> list[np.ndarray]:
    """Operands seen at the output shape (NumPy broadcasting rules)."""
    return [np.broadcast_to(x, shape) for x in xs]


def _axes(attrs: Mapping[str, Any], rank: int) -> tuple[int, ...]:
    axes = attrs["axes"]
    if axes is None:
        return tuple(range(rank))
    return tuple(sorted({int(a) % rank for a in axes})) if rank else ()


def _seqsum(x: np.ndarray, axes: tuple[int, ...], acc: np.dtype) -> np.ndarray:
    """Sum over ``axes`` one term after another in ``acc`` (a plain accumulator loop)."""
    keep = [i for i in range(x.ndim) if i not in axes]
    k = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    y = np.transpose(x, keep + list(axes)).reshape([x.shape[i] for i in keep] + [k])
    if k == 0:
        return np.zeros(y.shape[:-1], acc)
    return np.add.accumulate(y, axis=-1, dtype=acc)[..., -1]


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    acc = _acc(a.dtype)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    terms = a2.astype(acc)[..., :, :, None] * b2.astype(acc)[..., None, :, :]  # (..., M, K, N)
    return _seqsum(terms, (terms.ndim - 2,), acc)


#: Binary elementwise ops on operands already broadcast to the output shape.
BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": lambda a, b: np.add(a, b),
    "sub": lambda a, b: np.subtract(a, b),
    "mul": lambda a, b: np.multiply(a, b),
    "div": lambda a, b: np.divide(a, b),
    "maximum": lambda a, b: np.maximum(a, b),
}

Kernel = Callable[[list[np.ndarray], Mapping[str, Any], np.ndarray], np.ndarray]

#: op -> kernel(inputs, attrs, output buffer) -> result (stored flat into the output buffer).
KERNELS: dict[str, Kernel] = {
    **{op: (lambda f: lambda xs, a, o: f(*_bcast(xs, o.shape)))(f) for op, f in BINARY.items()},
    "exp": lambda xs, a, o: np.exp(xs[0]),
    "neg": lambda xs, a, o: np.negative(xs[0]),
    "matmul": lambda xs, a, o: _matmul(xs[0], xs[1]),
    "reduce_sum": lambda xs, a, o: _seqsum(xs[0], _axes(a, xs[0].ndim), _acc(xs[0].dtype)),
    "reduce_max": lambda xs, a, o: np.max(xs[0], axis=_axes(a, xs[0].ndim)),
    "reshape": lambda xs, a, o: xs[0].reshape(o.shape),
    "transpose": lambda xs, a, o: np.transpose(xs[0], a["perm"]),
    "expand": lambda xs, a, o: np.broadcast_to(xs[0], o.shape),
    "cast": lambda xs, a, o: xs[0].astype(o.dtype),
}

#: Claimed dtypes per op; elementwise ops may run in place (the planner decides when).
DTYPES = {"add": FI, "sub": FI, "mul": FI, "div": F, "maximum": F, "exp": F, "neg": F,
          "matmul": FH, "reduce_sum": FH, "reduce_max": F, "reshape": F, "transpose": F, "expand": F,
          "cast": FH}
IN_PLACE = frozenset({"add", "sub", "mul", "div", "maximum", "exp", "neg"})


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name=NAME, version="1.0", api_version=API_VERSION,
                       description="test-only NumPy reference backend (bug-planting template)")


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    # Slow numbers so the cost model never prefers this test backend over a real one.
    caps = DeviceCaps(peak_flops={"default": 1e8}, mem_bandwidth=1e8, launch_overhead=1e-5)
    return [DeviceInfo(backend=NAME, name=NAME + ":0", available=True, caps=caps)]


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    return [KernelClaim(op, f"{NAME}.{op}", impl=KERNELS[op], dtypes=dts,
                        out_dtypes=dts if op == "cast" else None, in_place=op in IN_PLACE)
            for op, dts in DTYPES.items()]


def _store(dst: np.ndarray, result: Any) -> None:
    """Write ``result`` into the output buffer element by element in row-major order."""
    dst.reshape(-1)[...] = np.asarray(result).reshape(-1)


class ArenaProgram:
    def __init__(self, program: Any) -> None:
        g = program.graph
        plan = program.plan
        self.arena = np.zeros(max(plan.arena_bytes, 1), np.uint8)
        views: dict[str, np.ndarray] = {}
        for name, off in plan.offsets.items():
            t = g.types[name]
            views[name] = self.arena[off:off + t.nbytes()].view(t.dtype.np).reshape(t.shape)
        for p in g.params:  # uploaded once
            views[p.name] = np.array(g.weights[p.name], dtype=g.types[p.name].dtype.np)
        self.inputs = [(v.name, views[v.name]) for v in program.inputs]
        self.steps = []
        for s in program.kernels:
            target = s.outputs[0]
            views[s.outputs[0]] = dst = views[target]
            calls = s.kernel
            self.steps.append((calls, KERNELS[s.op], [views[i] for i in s.inputs], s.attrs, dst))
        self.outputs = {v: views[v] for _, v in program.outputs}

    def _run(self, inputs: Mapping[str, np.ndarray], counts: Counter[str]) -> dict[str, np.ndarray]:
        for name, view in self.inputs:
            np.copyto(view, inputs[name])
        with np.errstate(all="ignore"):
            for calls, kernel, ins, attrs, dst in self.steps:
                counts[calls] += 1
                _store(dst, kernel(ins, attrs, dst))
        return {v: view.copy() for v, view in self.outputs.items()}

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._run(inputs, Counter())

    def profile(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Counter[str]]:
        counts: Counter[str] = Counter()
        return self._run(inputs, counts), counts


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> ArenaProgram:
    return ArenaProgram(program)
