"""rlx-xla hook implementations: identity, the JAX devices, claims, compile.

Every RLX program compiled for this backend becomes ONE jitted JAX function, i.e. one StableHLO
module that PJRT compiles for the chosen device (:mod:`rlx_xla.lower`). The devices are JAX's:
each device of each PJRT platform JAX has here is one ``xla:N`` (accelerators first, so ``xla``
alone means the GPU or TPU where there is one); a platform JAX does not have is listed as
unavailable with the reason JAX gave and how to install it, so ``rlx doctor`` says why.

JAX is imported when the devices are probed or a program is compiled, never at discovery.
"""

from __future__ import annotations

import os
from typing import Any

from rlx_core import API_VERSION
from rlx_core.plugin import (
    REGISTRY,
    BackendInfo,
    BackendNotFoundError,
    DeviceCaps,
    DeviceInfo,
    DType,
    KernelClaim,
    hookimpl,
)

from . import __version__

#: Accelerator platforms probed, in device-numbering order, with the install hint for each.
PLATFORMS: tuple[tuple[str, str], ...] = (
    ("cuda", "pip install \"jax[cuda12]\" (or jax[cuda13]) with an NVIDIA driver"),
    ("rocm", "install JAX's ROCm plugin (jax-rocm*-plugin) with an AMD ROCm driver"),
    ("tpu", "pip install \"jax[tpu]\" on a Cloud TPU VM (it brings libtpu)"),
)

#: dtypes per PJRT platform: TPUs have no f64 (JAX would silently compute it in f32, which is
#: exactly the fallback the dispatch contract forbids), so f64 is not claimed there.
#: float8/float4/int4/int2 (DType.is_lowp) are not lowered (no ml_dtypes round trip through JAX yet).
ALL = frozenset(d for d in DType if not d.is_lowp)


def _dtypes_for(platform: str) -> frozenset[DType]:
    return ALL - {DType.F64} if platform == "tpu" else ALL


def _caps(platform: str, kind: str) -> DeviceCaps:
    if platform == "cpu":
        cores = os.cpu_count() or 1
        # XLA's CPU backend (Eigen GEMMs, fused loops): about rlx-cpu's class. Rough, so flagged.
        return DeviceCaps(peak_flops={"f32": 2.5e10 * cores, "f64": 1.2e10 * cores, "default": 2e9 * cores},
                          mem_bandwidth=1.0e10, launch_overhead=2e-6, host_link_bandwidth=None,
                          source="plugin estimate (XLA CPU)",
                          unreliable="XLA CPU figures are rough guesses; run `rlx calibrate xla`")
    if platform == "tpu":
        return DeviceCaps(peak_flops={"bf16": 2e14, "f16": 2e14, "f32": 3e13, "default": 3e13},
                          mem_bandwidth=1e12, launch_overhead=1e-5, host_link_bandwidth=1e10,
                          source=f"plugin estimate (TPU {kind})",
                          unreliable=f"TPU {kind}: generation-dependent guesses; run `rlx calibrate xla`")
    # A datacenter GPU class (f32 at HIGHEST precision: no TF32), with one program launch per run.
    return DeviceCaps(peak_flops={"f16": 3e14, "bf16": 3e14, "f32": 3e13, "f64": 1.5e13, "default": 1e13},
                      mem_bandwidth=2e12, launch_overhead=1e-5, host_link_bandwidth=2e10,
                      source=f"plugin estimate (GPU {kind})",
                      unreliable=f"{kind}: GPU figures vary by model; run `rlx calibrate xla`")


_ROUGH = DeviceCaps(peak_flops={"default": 1e9}, mem_bandwidth=1e9, launch_overhead=1e-4, source="no device")


def _probe() -> list[DeviceInfo]:
    # JAX's GPU client grabs 75% of GPU memory at start by default; RLX shares the GPU with other
    # backends (rlx-cuda) and with the user's own code, so allocate on demand unless told otherwise.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax
        import jaxlib
    except ImportError as e:
        return [DeviceInfo("xla", "xla:0", False, _ROUGH,
                           reason=f"jax is not importable ({e}); pip install jax jaxlib")]
    versions = {"jax": jax.__version__, "jaxlib": getattr(jaxlib, "__version__", "?")}
    found: list[tuple[str, Any]] = []
    missing: list[tuple[str, str]] = []
    for platform, hint in (*PLATFORMS, ("cpu", "pip install jaxlib")):
        try:
            found += [(platform, d) for d in jax.devices(platform)]
        except Exception as e:  # JAX says which platforms it has and why one failed to start
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            missing.append((platform, f"JAX has no {platform} platform here ({first}); {hint}"))
    out: list[DeviceInfo] = []
    for platform, d in found:
        kind = str(getattr(d, "device_kind", platform))
        out.append(DeviceInfo("xla", f"xla:{len(out)}", True, _caps(platform, kind),
                              host_memory=platform == "cpu",
                              details={"platform": platform, "jax_device": str(d), "kind": kind,
                                       **versions,
                                       "f64": "no (TPU)" if platform == "tpu" else
                                              "yes (jax.enable_x64 per program)"}))
    for platform, why in missing:
        out.append(DeviceInfo("xla", f"xla:{len(out)}", False, _ROUGH, reason=why,
                              details={"platform": platform, **versions}))
    return out


_DEVICES: list[DeviceInfo] | None = None


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="xla", version=__version__, api_version=API_VERSION, vendor="RLX",
                       description="whole program -> one StableHLO module via JAX, compiled and run by "
                                   "PJRT (XLA CPU / CUDA / TPU)",
                       whole_program=True)


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    global _DEVICES
    if _DEVICES is None:
        _DEVICES = _probe()
    return _DEVICES


#: The ops :mod:`rlx_xla.ops` lowers (kept here, free of JAX, so claims never import it).
OPS: tuple[str, ...] = (
    "neg", "abs", "sign", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid",
    "erf", "floor", "ceil", "round", "logical_not", "add", "sub", "mul", "div", "pow", "maximum",
    "minimum", "logical_and", "logical_or", "logical_xor", "equal", "not_equal", "less", "less_equal",
    "greater", "greater_equal", "where", "cast", "reduce_sum", "reduce_prod", "reduce_mean",
    "reduce_max", "reduce_min", "argmax", "argmin", "matmul", "reshape", "transpose", "expand", "slice",
    "concat", "pad", "gather", "scatter_add", "iota", "conv2d", "cumsum", "scatter_reduce",
)

#: Index operands (gather / scatter_add indices) and where conditions: their own dtype sets.
INDEX = frozenset({DType.I32, DType.I64})


#: Measured on an H200 (XLA's CUDA backend, 2026-12-01/02 certifications): integer convolutions do not
#: compile (i16/i32/i64) or saturate instead of wrapping (i8/u8), and complex matmul and convolution
#: run at reduced precision (relative error 6e-4 and 7e-3). Not claimed on GPUs: the contract
#: decomposes or refuses them.
_GPU_REFUSED: dict[str, frozenset[DType]] = {
    "conv2d": frozenset({DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.C64}),
    "matmul": frozenset({DType.C64}),
}


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    """Every MIR op, for every dtype its schema allows and the platform computes (f16/bf16 math in
    f32 with one rounding; see :mod:`rlx_xla.ops`), and ``scatter_reduce`` (one XLA scatter; the
    core's decomposition is dense). Other HIR ops are left to the core's decompositions: XLA fuses
    the resulting MIR itself, so claiming them would add code and no speed."""
    platform = device.details.get("platform", "cpu")
    allowed = _dtypes_for(platform)
    claims = []
    for op in OPS:
        dts = frozenset(REGISTRY.get(op).dtypes) & allowed
        if platform in ("cuda", "rocm", "gpu"):
            dts -= _GPU_REFUSED.get(op, frozenset())
        if op in ("gather", "scatter_add", "scatter_reduce"):
            claims.append(KernelClaim(op, f"xla.{op}", dtypes=dts | INDEX, out_dtypes=dts))
        elif op == "where":
            claims.append(KernelClaim(op, "xla.where", dtypes=dts | {DType.BOOL}, out_dtypes=dts))
        elif op == "cast":
            claims.append(KernelClaim(op, "xla.cast", dtypes=allowed, out_dtypes=allowed))
        elif op == "iota":
            claims.append(KernelClaim(op, "xla.iota", dtypes=dts, out_dtypes=dts))
        else:
            claims.append(KernelClaim(op, f"xla.{op}", dtypes=dts))
    return claims


def _jax_device(device: DeviceInfo) -> Any:
    import jax

    platform = device.details.get("platform", "")
    for d in jax.devices(platform) if platform else []:
        if str(d) == device.details.get("jax_device"):
            return d
    raise BackendNotFoundError(f"the JAX device behind {device.name} ({device.details}) went away",
                               fix="run `rlx doctor`")


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    from .lower import XlaProgram

    return XlaProgram(program, _jax_device(device))


#: The conformance suite may compile up to this many op checks of one variant as ONE program
#: (disjoint subgraphs; rlx_conformance.batch): XLA's cost is per compiled program and per
#: distinct kernel, so one program per check spent most of the suite's time in compiler set-up.
CONFORMANCE_BATCH = 64
