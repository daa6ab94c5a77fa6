"""rlx-directx hook implementations: identity, device probing, kernel claims and compilation.

The kernels are HLSL (the device kit's HLSL library). No Direct3D 12 runtime exists here, so the
HLSL is compiled to SPIR-V by glslang's HLSL front end and run on the kit's Vulkan runtime: the
device's ``details`` say so. Nothing Vulkan-related is imported at module import: probing creates
the context inside ``rlx_probe_devices`` (``available=False`` with the reason when there is no
loader, ICD, compute device or glslangValidator), compilation inside ``rlx_compile``.
"""

from __future__ import annotations

import os
from typing import Any

from rlx_core import API_VERSION
from rlx_core.plugin import (
    FUSED,  # noqa: F401  (importing it registers the fused_elementwise op)
    BackendInfo,
    DeviceCaps,
    DeviceInfo,
    KernelClaim,
    hookimpl,
)

from . import __version__

_CAPS = DeviceCaps(peak_flops={"f32": 5e10, "default": 5e10}, mem_bandwidth=1e10, launch_overhead=2e-5,
                   host_link_bandwidth=1e10, source="plugin estimate (software Vulkan class)")
#: what runs, in the device's details (rlx doctor) and the README
RUNS = "HLSL compiled to SPIR-V by glslang's HLSL front end, executed on Vulkan; no D3D12 runtime, no DXIL"


def _cpu_caps(device_name: str) -> DeviceCaps:
    """Figures for a software Vulkan device (lavapipe): the same kernels as rlx-vulkan's there, so
    the same rough figures (see rlx-vulkan's plugin), flagged unreliable until calibrated."""
    cores = os.cpu_count() or 1
    return DeviceCaps(peak_flops={"f32": 3e9 * cores, "default": 3e9 * cores},
                      mem_bandwidth=5e8 * cores, launch_overhead=3e-5, host_link_bandwidth=2e9,
                      source=f"plugin estimate (software Vulkan device {device_name}, shaders on the CPU)",
                      unreliable=f"{device_name} is a software Vulkan device (type CPU): shaders run on "
                                 "the host CPU and the figures are rough guesses; run "
                                 "`rlx calibrate directx` to measure them")


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="directx", version=__version__, api_version=API_VERSION,
                       description="HLSL compute shaders (shared renderer + kit templates) -> SPIR-V "
                                   "(glslang) on Vulkan", vendor="RLX")


def _unavailable(reason: str) -> list[DeviceInfo]:
    return [DeviceInfo(backend="directx", name="directx:0", available=False, caps=_CAPS, host_memory=False,
                       reason=reason)]


def _probe() -> list[DeviceInfo]:
    from rlx_core.plugin import vulkan as kit

    from . import program

    try:
        import vulkan  # noqa: F401
    except Exception as e:  # the bindings raise OSError when libvulkan.so.1 is missing
        return _unavailable(f"no Vulkan loader ({type(e).__name__}: {e}); rlx-directx runs HLSL on Vulkan: "
                            "install libvulkan1 and an ICD (mesa-vulkan-drivers for the lavapipe device)")
    try:
        ctx = program.context()
    except Exception as e:
        return _unavailable(f"no Vulkan device: {e} (rlx-directx runs HLSL on Vulkan; mesa-vulkan-drivers "
                            "provides the lavapipe software device; vulkaninfo --summary lists devices)")
    if kit.glslang() is None:
        return _unavailable("glslangValidator not found: it compiles the HLSL to SPIR-V (apt-get install "
                            "glslang-tools, or pip install rlx-directx[glslang])")
    caps = _cpu_caps(ctx.device_name) if ctx.is_cpu else _CAPS
    return [DeviceInfo(backend="directx", name="directx:0", available=True, caps=caps, host_memory=False,
                       details={"device": ctx.device_name, "api": f"Vulkan {ctx.api}",
                                "glslang": kit.glslang() or "", "runs": RUNS})]


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    return _probe()


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    """The device kit's HLSL library claims: f32/i32/bool elementwise ops and fused programs the
    HLSL renderer emits (i64 values as word pairs; sin/cos/pow where the device has doubles in
    shaders), and the template ops."""
    from rlx_core.plugin import hlsl

    return list(hlsl.claims("directx.", _doubles))


def _doubles() -> bool:
    from .program import context

    return bool(context().wide)


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    from .program import DirectxProgram

    return DirectxProgram(program)
