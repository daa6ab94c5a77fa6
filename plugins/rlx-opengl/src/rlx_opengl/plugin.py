"""rlx-opengl hook implementations: identity, the device, claims, compile.

The kernels are the device kit's GLSL kernel library in its OpenGL flavour (the same templates,
lowering and claims rlx-vulkan runs, written for ``#version 430`` with plain storage-buffer
bindings); this plugin is the EGL context and the moderngl runtime shim (:mod:`rlx_opengl.runtime`).
In CI it runs on Mesa's llvmpipe (software OpenGL 4.5 through EGL); on a machine whose driver
exposes EGL (NVIDIA's libEGL_nvidia) the same code runs on that GPU. Nothing GL-related is loaded
until a device is probed.
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

APT = ("apt-get install libegl1 libgl1 libegl-mesa0 libgl1-mesa-dri (Mesa's llvmpipe), or a GPU driver "
       "with EGL")

_GPU = DeviceCaps(peak_flops={"f32": 5e12, "default": 5e12}, mem_bandwidth=2e11, launch_overhead=1e-5,
                  host_link_bandwidth=1e10, source="plugin estimate (OpenGL GPU; straightforward kernels)")


def _software_caps(renderer: str) -> DeviceCaps:
    """A software renderer (llvmpipe): shaders run on the host's cores through LLVM, like lavapipe
    under rlx-vulkan, so the same rough per-core figures, flagged unreliable."""
    cores = os.cpu_count() or 1
    return DeviceCaps(peak_flops={"f32": 3e9 * cores, "default": 3e9 * cores},
                      mem_bandwidth=5e8 * cores, launch_overhead=3e-5, host_link_bandwidth=2e9,
                      source=f"plugin estimate (software OpenGL {renderer}, shaders on the CPU)",
                      unreliable=f"{renderer} is a software OpenGL renderer: shaders run on the host "
                                 "CPU and the figures are rough guesses; run `rlx calibrate opengl` to "
                                 "measure them")


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="opengl", version=__version__, api_version=API_VERSION, vendor="RLX",
                       description="OpenGL 4.3 compute shaders (the device kit's GLSL library) through "
                                   "moderngl on headless EGL")


def _probe() -> list[DeviceInfo]:
    from .settings import EGL_DEVICE

    rough = DeviceCaps(peak_flops={"default": 1e9}, mem_bandwidth=1e9, launch_overhead=3e-5,
                       source="no device")
    try:
        import moderngl  # noqa: F401
    except ImportError as e:  # pragma: no cover - moderngl is a dependency
        return [DeviceInfo("opengl", "opengl:0", False, rough, reason=f"moderngl is not importable ({e})")]
    from . import runtime

    try:
        gl = runtime.context(EGL_DEVICE.get())
    except Exception as e:
        return [DeviceInfo("opengl", "opengl:0", False, rough,
                           reason=f"no OpenGL 4.3 context through EGL device {EGL_DEVICE.get()} "
                                  f"(RLX_OPENGL_EGL_DEVICE): {e}; install EGL and a driver: {APT}")]
    caps = _software_caps(gl.renderer) if gl.software else _GPU
    return [DeviceInfo("opengl", "opengl:0", True, caps, host_memory=False,
                       details={"renderer": gl.renderer, "version": gl.version, "vendor": gl.vendor,
                                "egl_device": str(gl.device_index),
                                "int64_fp64": "yes" if gl.wide else "no (i64, sin/cos, pow not claimed)",
                                "max_storage_buffer": str(gl.max_ssbo)})]


_DEVICES: list[DeviceInfo] | None = None


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    global _DEVICES
    if _DEVICES is None:
        _DEVICES = _probe()
    return _DEVICES


def _wide() -> bool:
    from . import runtime
    from .settings import EGL_DEVICE

    return runtime.context(EGL_DEVICE.get()).wide


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    """The device kit's GLSL library claims: f32, plus i32/bool/i64 where natural; i64 values and
    the f64-based sin/cos/pow only where the driver has GL_ARB_gpu_shader_int64 and doubles."""
    from rlx_core.plugin import glsl

    return list(glsl.claims(glsl.OPENGL, "opengl.", _wide))


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    from . import runtime
    from .settings import EGL_DEVICE, TILED

    return runtime.compile_program(program, runtime.context(EGL_DEVICE.get()), bool(TILED.get()))


@hookimpl
def rlx_settings() -> list[Any]:
    from .settings import SETTINGS

    return list(SETTINGS)
