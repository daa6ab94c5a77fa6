"""rlx-webgpu hook implementations: identity, device probing, kernel claims, compilation, export.

Nothing WebGPU-related is imported at module import: probing creates the wgpu context inside
``rlx_probe_devices`` (and reports ``available=False`` with wgpu-native's error when there is no
adapter), compilation inside ``rlx_compile``. Claims are honest: f32 (plus i32/bool where WGSL has
the types; i64 only where a kernel moves words); every other dtype goes through the core's
decompositions/rewrites or fails to compile.
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
    all_of,
    dtypes_in,
    elementwise_claims,
    fused_claim,
    glsl,
    hookimpl,
    render_check,
    renders,
)

from . import __version__

GEN = frozenset({DType.F32, DType.I32, DType.BOOL})
HALVES = frozenset({DType.F16, DType.BF16})
MAX_RANK = 8

_CAPS = DeviceCaps(peak_flops={"f32": 5e12, "default": 1e12}, mem_bandwidth=2e11, launch_overhead=2e-5,
                   host_link_bandwidth=1e10, source="plugin estimate (WebGPU on a GPU)")


def _cpu_caps(device_name: str) -> DeviceCaps:
    """Figures for a CPU adapter (Mesa lavapipe/llvmpipe under wgpu-native): shaders run on the host's
    cores through LLVM. Rough, so flagged unreliable: auto-placement keeps a first run off it until
    `rlx calibrate webgpu` has measured this machine."""
    cores = os.cpu_count() or 1
    return DeviceCaps(peak_flops={"f32": 3e9 * cores, "default": 3e9 * cores},
                      mem_bandwidth=5e8 * cores, launch_overhead=4e-5, host_link_bandwidth=1e9,
                      source=f"plugin estimate (CPU WebGPU adapter {device_name}, shaders on the CPU)",
                      unreliable=f"{device_name} is a CPU WebGPU adapter: shaders run on the host CPU and "
                                 "the figures are rough guesses; run `rlx calibrate webgpu` to measure them")


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="webgpu", version=__version__, api_version=API_VERSION,
                       description="WebGPU compute: WGSL shaders (shared renderer + templates), wgpu-native",
                       vendor="RLX")


def _unavailable(reason: str) -> list[DeviceInfo]:
    return [DeviceInfo(backend="webgpu", name="webgpu:0", available=False, caps=_CAPS, host_memory=False,
                       reason=reason)]


def _probe() -> list[DeviceInfo]:
    try:
        import wgpu  # noqa: F401
    except Exception as e:
        return _unavailable(f"wgpu-py is not importable ({type(e).__name__}: {e}); "
                            "pip install 'wgpu>=0.32,<0.33'")
    try:
        from .gpu import context

        ctx = context()
    except Exception as e:
        return _unavailable(f"no WebGPU adapter: {type(e).__name__}: {e} (wgpu-native needs a Vulkan, Metal "
                            "or DX12 driver; on Linux without a GPU install mesa-vulkan-drivers for the "
                            "lavapipe software device)")
    caps = _cpu_caps(ctx.device_name) if ctx.cpu_device else _CAPS
    return [DeviceInfo(backend="webgpu", name="webgpu:0", available=True, caps=caps, host_memory=False,
                       details={"device": ctx.device_name, "adapter_type": ctx.adapter_type,
                                "backend": ctx.backend_type, "shader-f16": str(ctx.f16).lower()})]


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    return _probe()


# -- claims ---------------------------------------------------------------------------------------

def _wgsl(program: str, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str:
    from . import wgsl

    return wgsl.elementwise(program, in_dtypes, out_dtype)


#: the render check (device kit): "can this variant be rendered as WGSL" = render it, memoised
_renderable = render_check(_wgsl, "as WGSL")


def _rank_ok(v: Any) -> str | None:
    if any(t.rank > MAX_RANK for t in (*v.in_types, *v.out_types)):
        return f"rank > {MAX_RANK}"
    return None


#: storage dtypes first, then rank, then the render check (the order the reasons are reported in)
_ew_pred = all_of(dtypes_in(GEN | {DType.I64} | HALVES, "no WGSL storage for"), _rank_ok,
                  renders(_renderable))


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    wide = GEN | {DType.I64}
    casts = wide | HALVES
    claims = elementwise_claims("webgpu.", wide, _ew_pred, overrides={
        "cast": {"dtypes": casts, "out_dtypes": casts,
                 "constraint": "i64 results only from integers/bool; f16/bf16 from/to f32/i32/bool, "
                               "rounded to nearest even (their other ops: compute_f16_in_f32)"}})
    claims.append(fused_claim("webgpu.fused_elementwise", _ew_pred,
                              constraint="f32/i32/bool programs the shared WGSL renderer can emit"))
    # The template ops: the same lowering as every kit shader language (rlx_core.plugin.glsl).
    claims += glsl.template_claims("webgpu.", "WGSL")
    return claims


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    from .gpu import context
    from .program import WebGPUProgram
    from .settings import TILED

    return WebGPUProgram(program, context(), tiled=True if TILED.get() else None)


@hookimpl
def rlx_exporters() -> list[Any]:
    from rlx_core.plugin import ExporterInfo

    # Named, not imported: the exporter's imports wait until `rlx export --target webgpu` runs.
    return [ExporterInfo(target="webgpu", command="rlx_webgpu.export:export_command",
                         help="WGSL shaders, weights, a manifest and an ES-module loader (browsers, "
                              "WebGPU JS runtimes)")]


@hookimpl
def rlx_settings() -> list[Any]:
    from .settings import SETTINGS

    return list(SETTINGS)
