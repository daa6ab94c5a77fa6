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
    BackendInfo,
    DeviceCaps,
    DeviceInfo,
    DType,
    KernelClaim,
    cstyle,
    hookimpl,
)

from . import __version__, msl


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

def _host_abs(op: str, ins: tuple[DType, ...], out: DType) -> str | None:
    if op == "abs" and DType.I64 in ins:
        return "abs is not claimed for i64 (the shared renderer's abs() is the int overload on host)"
    return None


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    """The device kit's C-style kernel library in its Metal dialect claims (f32, and exact integer
    and bool ops)."""
    return list(cstyle.claims(msl.MSL, "metal.", extra_op_ok=_host_abs))


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
