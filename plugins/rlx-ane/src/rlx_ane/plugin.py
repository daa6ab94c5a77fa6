"""rlx-ane hook implementations: identity, the (unavailable) device, claims, the exporter.

The Neural Engine is reached only through Core ML, and Core ML predicts only on macOS (coremltools
ships its prediction library, ``libcoremlpython``, for macOS alone). So this backend lowers and
exports: ``rlx export MODEL --target ane`` writes an ML Program (.mlpackage) that coremltools
builds and validates on any OS. ``ane:0`` is never available for running, here or on a Mac, until a
prediction path exists and is certified there. The claims are the ops :mod:`rlx_ane.mil_worker`
translates into MIL; everything else decomposes (the core's decompositions) or fails to lower.
"""

from __future__ import annotations

import platform
from typing import Any

from rlx_core import API_VERSION
from rlx_core.plugin import (
    BackendInfo,
    CapabilityError,
    DeviceCaps,
    DeviceInfo,
    DType,
    KernelClaim,
    NodeVariant,
    hookimpl,
)

from . import __version__

FLOAT = frozenset({DType.F32, DType.F16})
NUM = FLOAT | {DType.I32, DType.I64}
DATA = NUM | {DType.BOOL}
BOOL = frozenset({DType.BOOL})
INDEX = frozenset({DType.I32, DType.I64})

FLOAT_OPS = ("div", "pow", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sigmoid", "tanh", "erf", "sin",
             "cos", "floor", "ceil", "reduce_mean", "softmax", "layer_norm", "gelu", "relu", "silu", "linear",
             "conv2d", "matmul")
NUM_OPS = ("add", "sub", "mul", "maximum", "minimum", "abs", "neg", "sign", "greater", "greater_equal",
           "less", "less_equal", "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "cumsum")
DATA_OPS = ("equal", "not_equal", "reshape", "expand", "transpose", "slice", "concat", "cast")
BOOL_OPS = ("logical_and", "logical_or", "logical_xor", "logical_not")

#: The reason ``ane:0`` is unavailable (shown by ``rlx doctor``).
NO_PREDICTION = ("Core ML prediction needs macOS" + (f" (this is {platform.system()})"
                                                     if platform.system() != "Darwin" else "")
                 + "; rlx-ane exports and validates ML Programs only: rlx export MODEL --target ane "
                   "-o MODEL.mlpackage")


def _static_nonempty(v: NodeVariant) -> str | None:
    # Core ML tensors have at least one element per dim and at most rank 5.
    for t in (*v.in_types, *v.out_types):
        if any(d == 0 for d in t.shape):
            return "Core ML has no zero-size tensors"
        if len(t.shape) > 5:
            return "Core ML tensors have rank <= 5"
    return None


def _and(*preds: Any) -> Any:
    def pred(v: NodeVariant) -> str | None:
        for p in preds:
            r = p(v)
            if r is not None:
                return r
        return None
    return pred


def _first_in(allowed: frozenset[DType], what: str) -> Any:
    def pred(v: NodeVariant) -> str | None:
        d = v.in_types[0].dtype
        return None if d in allowed else f"{what} must be one of {sorted(str(a) for a in allowed)}, got {d}"
    return pred


def _where(v: NodeVariant) -> str | None:
    c, a, b = (t.dtype for t in v.in_types)
    ok = c == DType.BOOL and a in DATA and b in DATA
    return None if ok else "needs a bool condition and MIL-typed branches"


def claims() -> list[KernelClaim]:
    ok = _static_nonempty
    why = "no zero-size dims, rank <= 5"
    out = [KernelClaim(op, f"ane.{op}", dtypes=FLOAT, predicate=ok, constraint=why) for op in FLOAT_OPS]
    out += [KernelClaim(op, f"ane.{op}", dtypes=NUM, predicate=ok, constraint=why) for op in NUM_OPS]
    out += [KernelClaim(op, f"ane.{op}", dtypes=DATA, out_dtypes=DATA, predicate=ok, constraint=why)
            for op in DATA_OPS]
    out += [KernelClaim(op, f"ane.{op}", dtypes=BOOL, predicate=ok, constraint=why) for op in BOOL_OPS]
    out += [
        KernelClaim("where", "ane.where", predicate=_and(_where, ok), constraint="bool condition; " + why),
        KernelClaim("gather", "ane.gather", dtypes=DATA, predicate=_and(_first_in(NUM, "gathered data"), ok),
                    constraint="float/int data, i32/i64 indices; " + why),
        KernelClaim("pad", "ane.pad", dtypes=FLOAT, predicate=ok, constraint=why),
        KernelClaim("iota", "ane.iota", dtypes=NUM, predicate=ok, constraint=why),
    ]
    return out


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="ane", version=__version__, api_version=API_VERSION, vendor="RLX",
                       description="Apple Neural Engine through Core ML: ML Programs (MIL) built with "
                                   "coremltools; export only (prediction needs macOS)", whole_program=True)


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    # Apple's published figure for the M-series Neural Engine is ~16-38 TOPS (fp16); unmeasured here.
    caps = DeviceCaps(peak_flops={"f16": 1.5e13, "default": 1.5e13}, mem_bandwidth=1e11, launch_overhead=1e-4,
                      source="plugin estimate (Apple Neural Engine datasheet class; never measured)",
                      unreliable="never measured: rlx-ane cannot run models yet")
    return [DeviceInfo("ane", "ane:0", False, caps, reason=NO_PREDICTION,
                       details={"exporter": "rlx export --target ane (ML Program, .mlpackage)"})]


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    return claims()


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    raise CapabilityError("rlx-ane cannot run programs: " + NO_PREDICTION, where=device.name,
                          fix="export it: rlx export MODEL --target ane -o MODEL.mlpackage")


@hookimpl
def rlx_exporters() -> list[Any]:
    from rlx_core.plugin import ExporterInfo

    # Named, not imported: the exporter's imports wait until `rlx export --target ane` runs.
    return [ExporterInfo(target="ane", command="rlx_ane.export:export_command",
                         help="a Core ML ML Program (.mlpackage) for the Apple Neural Engine")]
