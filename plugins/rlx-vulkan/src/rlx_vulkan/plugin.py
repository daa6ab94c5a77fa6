"""rlx-vulkan hook implementations: identity, device probing, kernel claims and compilation.

Nothing Vulkan-related is imported at module import: probing creates the Vulkan context inside
``rlx_probe_devices`` (and reports ``available=False`` with the loader's/driver's error when there
is no loader, no ICD or no compute-capable device), compilation inside ``rlx_compile``. Claims are
honest: f32 (plus i32/bool where the GLSL types are natural); every other dtype goes through the
core's decompositions/rewrites or fails to compile.
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
    DType,
    KernelClaim,
    hookimpl,
)

from . import __version__

_CAPS = DeviceCaps(peak_flops={"f32": 5e10, "default": 5e10}, mem_bandwidth=1e10, launch_overhead=2e-5,
                   host_link_bandwidth=1e10, source="plugin estimate (software Vulkan class)")


def _cpu_caps(device_name: str) -> DeviceCaps:
    """Figures for a Vulkan device of type CPU (Mesa lavapipe/llvmpipe, SwiftShader).

    Its shaders run on the host's cores through LLVM, far below any GPU: measured on lavapipe (2
    cores, untiled matmul) about 1.6 GFLOP/s per core for matmul (~3 on the AVX-512 CI machine, 2026-12-02:
    the demo MLP at batch 512 ran 0.32x an estimate made with 1.5) and 0.15-0.2 GB/s per core through
    the generic elementwise kernels, ~30 us per dispatch. Rough, so flagged unreliable: auto-placement
    keeps a first run off it until `rlx calibrate vulkan` has measured this machine.
    """
    cores = os.cpu_count() or 1
    return DeviceCaps(peak_flops={"f32": 3e9 * cores, "default": 3e9 * cores},
                      mem_bandwidth=5e8 * cores, launch_overhead=3e-5, host_link_bandwidth=2e9,
                      source=f"plugin estimate (software Vulkan device {device_name}, shaders on the CPU)",
                      unreliable=f"{device_name} is a software Vulkan device (type CPU): shaders run on "
                                 "the host CPU and the figures are rough guesses; run `rlx calibrate vulkan` "
                                 "to measure them")


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="vulkan", version=__version__, api_version=API_VERSION,
                       description="Vulkan compute: GLSL shaders (shared renderer + templates) -> SPIR-V",
                       vendor="RLX")


def _probe() -> list[DeviceInfo]:
    from . import vk

    try:
        import vulkan  # noqa: F401
    except Exception as e:  # the bindings raise OSError when libvulkan.so.1 is missing
        return [DeviceInfo(backend="vulkan", name="vulkan:0", available=False, caps=_CAPS, host_memory=False,
                           reason=f"no Vulkan loader ({type(e).__name__}: {e}); install libvulkan1 and an "
                                  "ICD (mesa-vulkan-drivers for the lavapipe software device)")]
    try:
        ctx = vk.context()
    except Exception as e:
        return [DeviceInfo(backend="vulkan", name="vulkan:0", available=False, caps=_CAPS, host_memory=False,
                           reason=f"no Vulkan device: {e} (is an ICD installed? mesa-vulkan-drivers provides "
                                  "the lavapipe software device; vulkaninfo --summary lists devices)")]
    if vk.glslang() is None:
        return [DeviceInfo(backend="vulkan", name="vulkan:0", available=False, caps=_CAPS, host_memory=False,
                           reason="glslangValidator not found (apt-get install glslang-tools, or "
                                  "pip install rlx-vulkan[glslang])")]
    caps = _cpu_caps(ctx.device_name) if ctx.device_type == ctx.vk.VK_PHYSICAL_DEVICE_TYPE_CPU else _CAPS
    return [DeviceInfo(backend="vulkan", name="vulkan:0", available=True, caps=caps, host_memory=False,
                       details={"device": ctx.device_name, "api": ctx.api, "glslang": vk.glslang() or ""})]


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    return _probe()


# -- claims ---------------------------------------------------------------------------------------

def _wide() -> bool:
    from .vk import context

    return context().wide


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    """The device kit's GLSL library claims (f32, plus i32/bool/i64 where natural; i64 values and
    the f64-based sin/cos/pow only where the device has shaderFloat64 + shaderInt64)."""
    from rlx_core.plugin import glsl

    return [*glsl.claims(glsl.VULKAN, "vulkan.", _wide),
            KernelClaim("attention", "vulkan.attention", dtypes=_ATT_MASKS, out_dtypes=frozenset({DType.F32}),
                        predicate=_attention_pred,
                        constraint="GPU devices: one fused kernel (scores stay on chip, online softmax); "
                                   f"f32, static head dims <= {_ATT_MAX_D}, padding masks f32/i32/i64/bool")]


#: glsl.ATT_MAX_D, repeated so that claiming imports nothing more than the plugin API
_ATT_MAX_D = 128
_ATT_MASKS = frozenset({DType.F32, DType.I32, DType.I64, DType.BOOL})


def _attention_pred(v: Any) -> str | None:
    """Claims attention only where :func:`glsl.attention_wg` runs: the GPU kernels are on (a GPU
    device, or RLX_VULKAN_TILED on a CPU one; not RLX_VULKAN_GEMM=basic) and it is not switched off."""
    from .settings import ATTENTION, GEMM
    from .vk import context, cpu_device

    if str(ATTENTION.get()) == "off":
        return "RLX_VULKAN_ATTENTION=off (decomposed)"
    if str(GEMM.get()) == "basic" or cpu_device(context()):
        return "the fused kernel runs on the GPU path only (CPU device or RLX_VULKAN_GEMM=basic: decomposed)"
    q, k, vv = v.in_types[:3]
    if any(t.dtype is not DType.F32 for t in (q, k, vv)):
        return "fused attention is f32 only"
    d, dv = q.shape[-1], vv.shape[-1]
    if not (isinstance(d, int) and isinstance(dv, int) and 0 < d <= _ATT_MAX_D and 0 < dv <= _ATT_MAX_D):
        return f"head dims {d}, {dv} must be static and at most {_ATT_MAX_D}"
    mask = str(v.attrs["mask"])
    if mask == "bias" and v.in_types[3].dtype is not DType.F32:
        return "bias mask must be f32"
    if mask == "padding" and v.in_types[3].dtype not in _ATT_MASKS:
        return f"padding mask dtype {v.in_types[3].dtype} is not supported (f32/i32/i64/bool)"
    return None


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    from .program import VulkanProgram

    return VulkanProgram(program)


@hookimpl
def rlx_settings() -> list[Any]:
    from .settings import SETTINGS

    return list(SETTINGS)
