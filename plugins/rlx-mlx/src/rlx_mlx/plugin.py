"""rlx-mlx hook implementations: identity, the MLX device, claims, compile.

Every compiled RLX program becomes one function of ``mlx.core`` ops (:mod:`rlx_mlx.lowering`),
traced by ``mx.compile`` and evaluated once per run. On Linux MLX runs on its CPU device (the
``mlx[cpu]`` build, certified by the conformance suite); on Apple silicon the same code targets
the Metal GPU (``mx.gpu``), which has not been run by this project yet.

MLX is imported only when a device is probed or a program compiled, never at plugin import.
"""

from __future__ import annotations

import os
from typing import Any

from rlx_core import API_VERSION
from rlx_core.plugin import (
    REGISTRY,
    BackendInfo,
    DeviceCaps,
    DeviceInfo,
    DType,
    KernelClaim,
    hookimpl,
)

from . import __version__

F64_UNSUPPORTED_GPU = "MLX's Metal backend has no float64"

_ROUGH = DeviceCaps(peak_flops={"default": 1e9}, mem_bandwidth=1e9, launch_overhead=1e-5,
                    source="no device")

#: The RLX ops this backend lowers (MIR); kept in sync with ``lowering.BUILDERS`` (a test checks).
OPS = ("neg", "abs", "sign", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh",
       "sigmoid", "erf", "floor", "ceil", "round", "logical_not", "add", "sub", "mul", "div", "pow",
       "maximum", "minimum", "logical_and", "logical_or", "logical_xor", "equal", "not_equal",
       "less", "less_equal", "greater", "greater_equal", "where", "cast", "reduce_sum",
       "reduce_prod", "reduce_mean", "reduce_max", "reduce_min", "argmax", "argmin", "matmul",
       "reshape", "transpose", "expand", "slice", "concat", "pad", "gather", "scatter_add", "iota",
       "conv2d", "cumsum")

_HALF = (DType.F16, DType.BF16)
#: (op, dtype) pairs not claimed, with the measured reason (`rlx conformance mlx` against the
#: float64 reference, MLX 0.32 on the CPU). What is left out decomposes, takes a core rewrite
#: (half precision computes in f32 between casts) or fails compilation naming this backend.
NOT_CLAIMED: dict[tuple[str, DType], str] = {
    **{(op, DType.F64): "MLX's CPU evaluates this float64 function in float32 precision"
       for op in ("exp", "sin", "cos", "erf", "sigmoid")},
    **{(op, d): "MLX accumulates it in storage precision (the core computes it in f32)"
       for op in ("cumsum", "scatter_add") for d in _HALF},
    **{("conv2d", d): "MLX convolves floating point only (f32, f16, bf16)"
       for d in (DType.F64, DType.C64, DType.I8, DType.I16, DType.I32, DType.I64, DType.U8)},
}


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="mlx", version=__version__, api_version=API_VERSION, vendor="RLX",
                       description="one mlx.core function per program (mx.compile): MLX's CPU device, "
                                   "or the Metal GPU on Apple silicon", whole_program=True)


def _caps(kind: str) -> DeviceCaps:
    if kind == "gpu":
        # An M-series GPU, roughly (M1 ~2.6 TFLOP/s f32, 68 GB/s; larger parts more).
        return DeviceCaps(peak_flops={"f32": 2.5e12, "f16": 2.5e12, "bf16": 2.5e12, "default": 1e12},
                          mem_bandwidth=6.0e10, launch_overhead=2e-5, host_link_bandwidth=None,
                          source="plugin estimate (Apple GPU through MLX)",
                          unreliable="MLX GPU figures are guesses for the smallest M-series part; "
                                     "run `rlx calibrate mlx`")
    # Measured on the Linux mlx-cpu 0.32 wheel: its GEMM ran ~2-3 GFLOP/s on a 2-core x86 host
    # (about 15x below NumPy's OpenBLAS there), so placement should prefer rlx-cpu on Linux.
    cores = os.cpu_count() or 1
    return DeviceCaps(peak_flops={"f32": 1.5e9 * cores, "f64": 7.5e8 * cores, "default": 5e8 * cores},
                      mem_bandwidth=5.0e9, launch_overhead=1e-5, host_link_bandwidth=None,
                      source="plugin estimate (MLX CPU device)",
                      unreliable="MLX CPU figures are rough guesses; run `rlx calibrate mlx`")


def _probe() -> list[DeviceInfo]:
    from .settings import DEVICE

    try:
        import mlx.core as mx
    except Exception as e:  # ImportError, or a wheel built for another CPU / glibc
        return [DeviceInfo("mlx", "mlx:0", False, _ROUGH,
                           reason=f"mlx is not importable ({type(e).__name__}: {e}); install it: "
                                  "pip install 'mlx[cpu]' on Linux, pip install mlx on macOS")]
    try:
        gpu = bool(mx.metal.is_available())
    except Exception:
        gpu = False
    want = DEVICE.get()
    if want == "gpu" and not gpu:
        return [DeviceInfo("mlx", "mlx:0", False, _ROUGH,
                           reason="RLX_MLX_DEVICE=gpu, but this MLX has no Metal GPU (Apple silicon "
                                  "and macOS only); unset RLX_MLX_DEVICE to use MLX's CPU device")]
    kind = "gpu" if want == "gpu" or (want == "auto" and gpu) else "cpu"
    dev = mx.gpu if kind == "gpu" else mx.cpu
    try:
        with mx.stream(dev):
            probe = mx.add(mx.array([1.0, 2.0]), 1.0)
            mx.eval(probe)
    except Exception as e:
        return [DeviceInfo("mlx", "mlx:0", False, _ROUGH,
                           reason=f"MLX failed a first evaluation on {kind} ({type(e).__name__}: {e}); "
                                  "reinstall mlx or set RLX_MLX_DEVICE=cpu")]
    tested = ("certified by this project's conformance suite (Linux CPU build)" if kind == "cpu" else
              "same code as the certified CPU path; not yet run by this project: run "
              "`rlx conformance mlx` here")
    return [DeviceInfo("mlx", "mlx:0", True, _caps(kind), host_memory=True,
                       details={"mlx": str(getattr(mx, "__version__", "unknown")), "device": kind,
                                "metal": "yes" if gpu else "no", "status": tested})]


_DEVICES: list[DeviceInfo] | None = None


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    global _DEVICES
    if _DEVICES is None:
        _DEVICES = _probe()
    return _DEVICES


def _kind(device: DeviceInfo) -> str:
    return device.details.get("device", "cpu") if device.details else "cpu"


def _refusal(op: str, kind: str) -> Any:
    """The claim's predicate: a dtype MLX stores but this op cannot honour is rejected with the
    measured reason, which the dispatch report (and a DispatchError) shows verbatim."""
    def pred(v: Any) -> str | None:
        # Data dtypes only: gather/scatter indices are integers, which every op handles.
        types = [v.in_types[0]] if op in ("gather", "scatter_add") else [*v.in_types, *v.out_types]
        for t in types:
            if kind == "gpu" and t.dtype == DType.F64:
                return f"{op}[f64]: {F64_UNSUPPORTED_GPU}; cast to f32 or set RLX_MLX_DEVICE=cpu"
            why = NOT_CLAIMED.get((op, t.dtype))
            if why:
                return f"{op}[{t.dtype}]: {why}; cast to another dtype or use the cpu backend"
        return None
    return pred


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    kind = _kind(device)
    claims = []
    for op in OPS:
        # float8/float4/int4/int2 (DType.is_lowp) have no MLX dtype: not claimed.
        dts = frozenset(d for d in REGISTRY.get(op).dtypes if not d.is_lowp)
        pred = _refusal(op, kind)
        if op == "cast":
            claims.append(KernelClaim(op, "mlx.cast", dtypes=dts, out_dtypes=dts, predicate=pred))
        elif op in ("gather", "scatter_add"):
            claims.append(KernelClaim(op, f"mlx.{op}", dtypes=dts | {DType.I32, DType.I64},
                                      out_dtypes=dts, predicate=pred, constraint="i32/i64 indices"))
        elif op == "where":
            claims.append(KernelClaim(op, "mlx.where", dtypes=dts | {DType.BOOL}, out_dtypes=dts,
                                      predicate=pred))
        else:
            claims.append(KernelClaim(op, f"mlx.{op}", dtypes=dts, predicate=pred))
    return claims


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    import mlx.core as mx

    from .lowering import MlxProgram
    from .settings import COMPILE

    gpu = _kind(device) == "gpu"
    mode = COMPILE.get()
    return MlxProgram(program, mx.gpu if gpu else mx.cpu, mode == "on" or (mode == "auto" and gpu))


@hookimpl
def rlx_settings() -> list[Any]:
    from .settings import SETTINGS

    return list(SETTINGS)
