"""A whole-program backend: the LIR program becomes the source of ONE Python function.

It claims a deliberately small op set (f32/f64 only, binary ops on equal shapes only), so graphs
compiled for it exercise all three dispatch paths: HIR ops decompose (common_ir), broadcasts are
materialised and f16 is computed in f32 (rewritten), and anything else fails compilation.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from rlx_core import API_VERSION
from rlx_core.plugin import (
    BackendInfo,
    DeviceCaps,
    DeviceInfo,
    DType,
    KernelClaim,
    NodeVariant,
    hookimpl,
    safe_comment,
)

from . import __version__

F = frozenset({DType.F32, DType.F64})

#: op -> expression template over the input names a, b (and attrs via {attr})
EXPR = {
    "add": "np.add({a}, {b})", "sub": "np.subtract({a}, {b})", "mul": "np.multiply({a}, {b})",
    "div": "np.divide({a}, {b})", "maximum": "np.maximum({a}, {b})", "neg": "np.negative({a})",
    "exp": "np.exp({a})", "matmul": "np.matmul({a}, {b})",
    "reduce_sum": "np.sum({a}, axis={axes}, keepdims={keepdims})",
    "reduce_max": "np.max({a}, axis={axes}, keepdims={keepdims})",
    "reshape": "np.reshape({a}, {oshape})", "transpose": "np.transpose({a}, {perm})",
    "expand": "np.broadcast_to({a}, {oshape}).copy()", "cast": "{a}.astype(np.{odtype})",
}

#: Calls per kernel name across all programs compiled in this process (the suite checks that a
#: `native` line in the report really ran this backend's code).
CALLS: Counter[str] = Counter()


def _same_shapes(v: NodeVariant) -> str | None:
    shapes = {t.shape for t in v.in_types}
    return None if len(shapes) == 1 else "operands must have equal shapes (no broadcasting)"


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="whole", version=__version__, api_version=API_VERSION,
                       description="test-only: whole-program Python code generator", whole_program=True)


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    # Deliberately slow numbers so the cost model never prefers this test backend over a real one.
    caps = DeviceCaps(peak_flops={"default": 1e8}, mem_bandwidth=1e8, launch_overhead=1e-4)
    return [DeviceInfo(backend="whole", name="whole:0", available=True, caps=caps)]


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    claims = []
    for op in EXPR:
        if op == "cast":
            claims.append(KernelClaim(op, "whole.cast", dtypes=F | {DType.F16}, out_dtypes=F | {DType.F16}))
        elif op in ("add", "sub", "mul", "div", "maximum"):
            claims.append(KernelClaim(op, f"whole.{op}", dtypes=F, predicate=_same_shapes,
                                      constraint="equal operand shapes"))
        else:
            claims.append(KernelClaim(op, f"whole.{op}", dtypes=F))
    return claims


class WholeProgram:
    def __init__(self, source: str, weights: dict[str, np.ndarray], kernels: list[str]) -> None:
        self.source = source
        self.kernels = kernels
        scope: dict[str, Any] = {"np": np}
        exec(compile(source, "<rlx-whole-program>", "exec"), scope)
        self._fn = scope["program"]
        self._weights = weights

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        CALLS.update(self.kernels)
        return self._fn(inputs, self._weights)

    def profile(self, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Counter[str]]:
        # One generated function runs every kernel line exactly once per call.
        return self.run(inputs), Counter(self.kernels)


def _ident(name: str, names: dict[str, str]) -> str:
    if name not in names:
        names[name] = f"v{len(names)}"
    return names[name]


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> WholeProgram:
    g = program.graph
    names: dict[str, str] = {}
    lines = ["def program(inputs, W):"]
    for v in program.inputs:
        lines.append(f"    {_ident(v.name, names)} = inputs[{v.name!r}]")
    for p in g.params:
        lines.append(f"    {_ident(p.name, names)} = W[{p.name!r}]")
    kernels = []
    for s in program.kernels:
        t = g.types[s.outputs[0]]
        args = [_ident(i, names) for i in s.inputs]
        fmt = {"a": args[0] if args else "", "b": args[1] if len(args) > 1 else "",
               "oshape": tuple(t.shape), "odtype": t.dtype.np.name,
               **{k: v for k, v in s.attrs.items()}}
        expr = EXPR[s.op].format(**fmt)
        lines.append(f"    {_ident(s.outputs[0], names)} = np.asarray({expr}, dtype=np.{t.dtype.np.name})"
                     f"  # {safe_comment(f'{s.kernel} <- {s.origin}', 'python')}")
        kernels.append(s.kernel)
    outs = ", ".join(f"{v!r}: {_ident(v, names)}" for _, v in program.outputs)
    lines.append(f"    return {{{outs}}}")
    weights = {p.name: np.asarray(g.weights[p.name]) for p in g.params}
    return WholeProgram("\n".join(lines) + "\n", weights, kernels)
