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
    all_of,
    dtypes_in,
    elementwise_claims,
    fused_claim,
    hookimpl,
    normalize_axis,
    render_check,
    renders,
)

from . import __version__

F32 = frozenset({DType.F32})
I32 = frozenset({DType.I32})
GEN = frozenset({DType.F32, DType.I32, DType.BOOL})
W4 = frozenset({DType.F32, DType.I32})
INDEX = frozenset({DType.I32, DType.I64})
#: word-copied dtypes (8-byte ones as two words) and, for movement into contiguous outputs, bool
W8 = frozenset({DType.F32, DType.I32, DType.I64})
MOVE = W8 | {DType.BOOL}
MAX_RANK = 8

_CAPS = DeviceCaps(peak_flops={"f32": 5e10, "default": 5e10}, mem_bandwidth=1e10, launch_overhead=2e-5,
                   host_link_bandwidth=1e10, source="plugin estimate (software Vulkan class)")


def _cpu_caps(device_name: str) -> DeviceCaps:
    """Figures for a Vulkan device of type CPU (Mesa lavapipe/llvmpipe, SwiftShader).

    Its shaders run on the host's cores through LLVM, far below any GPU: measured on lavapipe (2
    cores, untiled matmul) about 1.6 GFLOP/s per core for matmul and 0.15-0.2 GB/s per core through
    the generic elementwise kernels, ~30 us per dispatch. Rough, so flagged unreliable: auto-placement
    keeps a first run off it until `rlx calibrate vulkan` has measured this machine.
    """
    cores = os.cpu_count() or 1
    return DeviceCaps(peak_flops={"f32": 1.5e9 * cores, "default": 1.5e9 * cores},
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

def _glsl(program: str, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str:
    from . import glsl

    return glsl.elementwise(program, in_dtypes, out_dtype)


def _wide_ok(src: str) -> str | None:
    if "GL_ARB_gpu_shader_int64" in src and not _wide():
        return "sin/cos/pow need shaderFloat64 + shaderInt64, which this device lacks"
    return None


#: the render check (device kit); the f64/i64 helpers also need the device's shader features
_renderable = render_check(_glsl, "as GLSL", source_ok=_wide_ok)


def _rank_ok(v: Any) -> str | None:
    if any(t.rank > MAX_RANK for t in (*v.in_types, *v.out_types)):
        return f"rank > {MAX_RANK}"
    return None


def _wide() -> bool:
    from .vk import context

    return context().wide


#: storage dtypes first, then rank, then the render check (the order the reasons are reported in)
_ew_pred = all_of(dtypes_in(lambda: GEN | ({DType.I64} if _wide() else set()), "no GLSL storage for"),
                  _rank_ok, renders(_renderable))


def _last_axis(v: Any) -> str | None:
    t = v.in_types[0]
    if t.rank == 0:
        return "rank 0"
    if normalize_axis(int(v.attrs["axis"]), t.rank) != t.rank - 1:
        return "only the last axis (other axes run through the decomposition)"
    return None


def _claim(op: str, dtypes: frozenset[DType] | None, **kw: Any) -> KernelClaim:
    kw.setdefault("predicate", _rank_ok)
    return KernelClaim(op, f"vulkan.{op}", dtypes=dtypes, **kw)


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    wide = GEN | {DType.I64}
    claims = elementwise_claims("vulkan.", wide, _ew_pred, overrides={
        "cast": {"dtypes": wide, "out_dtypes": wide, "constraint": "i64 results only from integers/bool"}})
    claims += [
        fused_claim("vulkan.fused_elementwise", _ew_pred,
                    constraint="f32/i32/bool programs the shared GLSL renderer can emit"),
        _claim("matmul", W4, constraint="tiled 16x16 shared-memory GLSL kernel (untiled on CPU devices)"),
        _claim("linear", F32, constraint="one kernel: GEMM with the (pre-transposed constant) weight + bias"),
        _claim("softmax", F32, predicate=_last_axis, constraint="last axis"),
        _claim("log_softmax", F32, predicate=_last_axis, constraint="last axis"),
        _claim("layer_norm", F32),
        _claim("reduce_sum", W4), _claim("reduce_prod", W4), _claim("reduce_mean", F32),
        _claim("reduce_max", W4), _claim("reduce_min", W4),
        _claim("argmax", W4, out_dtypes=frozenset({DType.I64}), constraint="first extreme; NaN wins"),
        _claim("argmin", W4, out_dtypes=frozenset({DType.I64}), constraint="first extreme; NaN wins"),
        _claim("conv2d", W4, constraint="direct NCHW x OIHW (strides, pads, dilations, groups)"),
        _claim("cumsum", W4, constraint="sequential per line, like the reference"),
        _claim("reshape", MOVE, in_place=True), _claim("transpose", MOVE), _claim("expand", MOVE),
        _claim("slice", MOVE), _claim("concat", W8), _claim("pad", W4),
        _claim("gather", W8 | INDEX, out_dtypes=W8),
        _claim("iota", frozenset({DType.F32, DType.I32, DType.I64}), out_dtypes=frozenset(
            {DType.F32, DType.I32, DType.I64}), constraint="f32/i32/i64"),
    ]
    return claims


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    from .program import VulkanProgram

    return VulkanProgram(program)


@hookimpl
def rlx_settings() -> list[Any]:
    from .settings import SETTINGS

    return list(SETTINGS)
