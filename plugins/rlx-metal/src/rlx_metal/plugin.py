"""rlx-metal hook implementations: identity, the device (Apple GPU or MSL on host), claims, compile.

Every kernel is Metal Shading Language (:mod:`rlx_metal.msl`). On macOS with ``metalcompute``
importable the device runs it on the Apple GPU (mode "Apple GPU"); elsewhere the same MSL is
compiled as C++ with a ``metal_stdlib`` compatibility header and run on the host CPU, one loop trip
per GPU thread (mode "MSL on host", :mod:`rlx_metal.host`). ``DeviceInfo.details["mode"]`` says
which, and so does every certificate produced on it.

Claims are f32 (plus i32/i64/bool where the operation is natural and C/MSL integer semantics match
the reference); everything else goes through the core's decompositions and rewrites or fails.
"""

from __future__ import annotations

import os
import platform
from typing import Any

from rlx_core import API_VERSION
from rlx_core.plugin import (
    FUSED,  # noqa: F401  (importing it registers the fused_elementwise op)
    FUSIBLE,
    BackendInfo,
    DeviceCaps,
    DeviceInfo,
    DType,
    KernelClaim,
    TensorType,
    all_of,
    elementwise_claims,
    fused_claim,
    hookimpl,
    normalize_axis,
    render_check,
    renders,
)

from . import __version__, msl

D = DType
F32 = frozenset({D.F32})
FI = frozenset({D.F32, D.I32, D.I64})
FIB = frozenset({D.F32, D.I32, D.I64, D.BOOL})
B = frozenset({D.BOOL})
INDEX = frozenset({D.I32, D.I64})
FLOAT_ONLY = frozenset({"exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid", "erf",
                        "floor", "ceil", "round", "div", "pow"})
INT_OK = frozenset({"neg", "abs", "sign", "add", "sub", "mul", "maximum", "minimum"})
COMPARE = frozenset({"equal", "not_equal", "less", "less_equal", "greater", "greater_equal"})
LOGICAL = frozenset({"logical_and", "logical_or", "logical_xor", "logical_not"})
ELEMENTWISE = tuple(sorted(FUSIBLE))


def mode() -> str:
    """"Apple GPU" when metalcompute runs on macOS (and RLX_METAL_MODE is not "host"), else
    "MSL on host"."""
    from .settings import MODE

    if MODE.get() == "host" or platform.system() != "Darwin":
        return "MSL on host"
    try:
        import metalcompute  # noqa: F401
    except Exception:
        return "MSL on host"
    return "Apple GPU"


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="metal", version=__version__, api_version=API_VERSION,
                       description="Metal Shading Language kernels "
                                   "(Apple GPU via metalcompute, else MSL on host)",
                       vendor="RLX")


def _caps(m: str) -> DeviceCaps:
    if m == "Apple GPU":
        return DeviceCaps(peak_flops={"f32": 2.6e12, "default": 2.6e12}, mem_bandwidth=1e11,
                          launch_overhead=2e-5, host_link_bandwidth=None,
                          source="plugin estimates (M1 class)")
    # One host thread runs every "GPU thread" in turn: honest single-core numbers.
    return DeviceCaps(peak_flops={"f32": 2e9, "default": 1e9}, mem_bandwidth=5e9, launch_overhead=2e-6,
                      host_link_bandwidth=None, source="plugin estimates (MSL on host, one core)")


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    m = mode()
    if m == "Apple GPU":
        return [DeviceInfo(backend="metal", name="metal:0", available=True, caps=_caps(m), host_memory=True,
                           details={"mode": m, "runtime": "metalcompute"})]
    from . import host

    cxx = host.compiler()
    if cxx is None:
        return [DeviceInfo(backend="metal", name="metal:0", available=False, caps=_caps(m),
                           reason="MSL on host needs a C++ compiler (clang++ or g++); none found "
                                  "(and no Apple GPU: metalcompute on macOS)",
                           details={"mode": m})]
    return [DeviceInfo(backend="metal", name="metal:0", available=True, caps=_caps(m), host_memory=True,
                       details={"mode": m, "compiler": os.path.basename(cxx),
                                "note": "generated MSL compiled as C++17 and run on the host CPU; "
                                        "not an Apple GPU"})]


# -- claims ---------------------------------------------------------------------------------------

def op_ok(op: str, ins: tuple[DType, ...], out: DType) -> str | None:
    """None when rlx-metal's MSL computes ``op`` on these dtypes exactly as the reference does."""
    if any(d not in FIB for d in (*ins, out)):
        return f"rlx-metal elementwise kernels handle f32/i32/i64/bool only (got {[d.value for d in ins]})"
    if op in FLOAT_ONLY and any(d is not D.F32 for d in ins):
        return f"{op} is claimed for f32 only"
    if op in INT_OK and any(d not in FI for d in ins):
        return f"{op} is claimed for f32/i32/i64 only"
    if op == "abs" and D.I64 in ins:
        return "abs is not claimed for i64 (the shared renderer's abs() is the int overload on host)"
    if op in LOGICAL and any(d is not D.BOOL for d in ins):
        return f"{op} is claimed for bool only"
    if op == "where" and (ins[0] is not D.BOOL or ins[1] != ins[2]):
        return "where needs a bool condition and equal branch dtypes"
    if op == "cast" and ins[0] is D.F32 and out in (D.I32, D.I64):
        return "float -> int cast of NaN/Inf/out-of-range values is undefined in MSL/C++"
    return None


#: the render check (device kit): every op passes ``op_ok``, then the program renders as MSL
_program_ok = render_check(lambda p, i, o: msl.elementwise_source(p, i, o), "as MSL", op_ok=op_ok)


def _numel(t: TensorType) -> int:
    n = 1
    for d in t.shape:
        n *= int(d)
    return n


def _fits(v: Any) -> str | None:
    if any(_numel(t) >= 2**31 - 1 for t in (*v.in_types, *v.out_types)):
        return "tensors of 2**31 elements or more (32-bit indices)"
    return None


def _last_axis(v: Any) -> str | None:
    t = v.in_types[0]
    if t.rank and normalize_axis(int(v.attrs["axis"]), t.rank) != t.rank - 1:
        return "only the last axis (other axes run through the decomposition)"
    return _fits(v)


def _claim(op: str, dtypes: frozenset[DType] | None, kind: str = "", **kw: Any) -> KernelClaim:
    kw.setdefault("predicate", _fits)
    return KernelClaim(op, f"metal.{kind}{op}", dtypes=dtypes, **kw)


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    renderable = all_of(_fits, renders(_program_ok))
    claims = elementwise_claims("metal.ew.", FIB, renderable, ops=ELEMENTWISE, out_dtypes=FIB)
    claims += [
        fused_claim("metal.fused_elementwise", renderable,
                    constraint="f32/i32/i64/bool programs of claimed elementwise ops (shared renderer, "
                               "metal dialect)"),
        _claim("matmul", F32, constraint="one thread per output element, f32 accumulation"),
        _claim("softmax", F32, predicate=_last_axis, constraint="last axis, one thread per row"),
        _claim("log_softmax", F32, predicate=_last_axis, constraint="last axis, one thread per row"),
        _claim("layer_norm", F32, constraint="one thread per row, two-pass statistics"),
        _claim("reduce_sum", F32), _claim("reduce_mean", F32), _claim("reduce_max", F32),
        _claim("reduce_min", F32),
        _claim("reshape", FIB, in_place=True), _claim("transpose", FIB), _claim("expand", FIB),
        _claim("slice", FIB), _claim("concat", FIB), _claim("pad", FIB),
        _claim("gather", FIB | INDEX, out_dtypes=FIB),
        _claim("iota", frozenset({D.F32, D.I32, D.I64})),
    ]
    return claims


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    from .program import AppleRunner, HostRunner

    if device.details.get("mode") == "Apple GPU":
        return AppleRunner(program)
    return HostRunner(program)


@hookimpl
def rlx_settings() -> list[Any]:
    from .settings import SETTINGS

    return list(SETTINGS)
