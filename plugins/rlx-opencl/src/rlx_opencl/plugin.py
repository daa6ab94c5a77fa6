"""rlx-opencl hook implementations: identity, the device, claims, compile.

The kernels are the device kit's C-style kernel library in its OpenCL dialect (the same templates
and lowering rlx-metal runs as MSL); this plugin is the device choice and the pyopencl runtime shim
(:mod:`rlx_opencl.runtime`). In CI it runs on PoCL's CPU device; on a machine whose driver exposes
OpenCL (NVIDIA, AMD, Intel) the same code runs on that GPU.
"""

from __future__ import annotations

from typing import Any

from rlx_core import API_VERSION
from rlx_core.plugin import (
    FUSED,  # noqa: F401  (importing it registers the fused_elementwise op)
    BackendInfo,
    DeviceCaps,
    DeviceInfo,
    KernelClaim,
    cstyle,
    hookimpl,
)

from . import __version__


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="opencl", version=__version__, api_version=API_VERSION, vendor="RLX",
                       description="OpenCL C kernels (the device kit's C-style library) through pyopencl")


def _caps(label: str, device: Any) -> DeviceCaps:
    import pyopencl as cl

    units = int(device.max_compute_units)
    if device.type & cl.device_type.CPU:
        # One work-item per output element, no tiling: a CPU device runs these near a scalar loop
        # per core. Rough, so flagged: placement keeps a first run off it until calibrated.
        return DeviceCaps(peak_flops={"f32": 1.5e9 * units, "default": 1.5e9 * units},
                          mem_bandwidth=1e9 * units, launch_overhead=2e-5, host_link_bandwidth=5e9,
                          source=f"plugin estimate (OpenCL CPU device {label})",
                          unreliable=f"{label} is an OpenCL CPU device: the figures are rough guesses; "
                                     "run `rlx calibrate opencl` to measure them")
    return DeviceCaps(peak_flops={"f32": 5e10 * max(units, 1) / 16, "default": 5e10},
                      mem_bandwidth=2e11, launch_overhead=1e-5, host_link_bandwidth=1e10,
                      source=f"plugin estimate (OpenCL GPU {label}; naive kernels, no tiling)")


def _probe() -> list[DeviceInfo]:
    from .settings import DEVICE

    rough = DeviceCaps(peak_flops={"default": 1e9}, mem_bandwidth=1e9, launch_overhead=2e-5,
                       source="no device")
    try:
        from . import runtime
    except ImportError as e:  # pragma: no cover - pyopencl is a dependency
        return [DeviceInfo("opencl", "opencl:0", False, rough, reason=f"pyopencl is not importable ({e})")]
    try:
        choice = runtime.pick(DEVICE.get())
    except Exception as e:
        return [DeviceInfo("opencl", "opencl:0", False, rough, reason=f"OpenCL failed: {e}")]
    if choice is None:
        why = (f"no OpenCL device matches RLX_OPENCL_DEVICE={DEVICE.get()!r}" if DEVICE.get() else
               "no OpenCL platform (install an ICD: apt-get install pocl-opencl-icd for the CPU, or a "
               "GPU driver)")
        return [DeviceInfo("opencl", "opencl:0", False, rough, reason=why)]
    label, dev = choice
    fp16 = "yes (cl_khr_fp16; not claimed yet)" if "cl_khr_fp16" in dev.extensions else "no"
    return [DeviceInfo("opencl", "opencl:0", True, _caps(label, dev), host_memory=False,
                       details={"device": label, "version": dev.version.strip(),
                                "driver": dev.driver_version.strip(),
                                "fp16": fp16})]


_DEVICES: list[DeviceInfo] | None = None


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    global _DEVICES
    if _DEVICES is None:
        _DEVICES = _probe()
    return _DEVICES


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    """The C-style kernel library's claims (f32, plus exact i32/i64/bool ops); f16 is not claimed:
    the library has no half kernels yet (cl_khr_fp16 is reported by ``rlx doctor`` when present)."""
    return list(cstyle.claims(cstyle.OPENCL, "opencl."))


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    from . import runtime
    from .settings import DEVICE

    choice = runtime.pick(DEVICE.get())
    if choice is None:
        from rlx_core.plugin import BackendNotFoundError

        raise BackendNotFoundError("the OpenCL device went away", fix="run `rlx doctor`")
    return runtime.compile_program(program, runtime.context(*choice))


@hookimpl
def rlx_settings() -> list[Any]:
    from .settings import SETTINGS

    return list(SETTINGS)
