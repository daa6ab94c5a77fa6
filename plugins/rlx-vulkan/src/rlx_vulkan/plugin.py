"""rlx-vulkan hook implementations: identity, device probing, kernel claims and compilation.

Nothing Vulkan-related is imported at module import: probing creates the Vulkan context inside
``rlx_probe_devices`` (and reports ``available=False`` with the loader's/driver's error when there
is no loader, no ICD or no compute-capable device), compilation inside ``rlx_compile``. Claims are
honest: f32 (plus i32/bool where the GLSL types are natural); every other dtype goes through the
core's decompositions/rewrites or fails to compile.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import rlx_core.fusion  # noqa: F401  (registers fused_elementwise)
from rlx_core import API_VERSION
from rlx_core.dtypes import DType
from rlx_core.errors import RLXError
from rlx_core.fusion import FUSIBLE, encode
from rlx_core.hookspecs import hookimpl
from rlx_core.ir.schema import REGISTRY
from rlx_core.ir.types import normalize_axis
from rlx_core.records import BackendInfo, DeviceCaps, DeviceInfo, KernelClaim

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


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="vulkan", version=__version__, api_version=API_VERSION,
                       description="Vulkan compute: GLSL shaders (shared renderer + templates) -> SPIR-V",
                       vendor="RLX")


def single_op_program(op: str, n_inputs: int, attrs: dict) -> str:
    return encode([(op, [f"i{k}" for k in range(n_inputs)], dict(attrs))], "t0")


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
    return [DeviceInfo(backend="vulkan", name="vulkan:0", available=True, caps=_CAPS, host_memory=False,
                       details={"device": ctx.device_name, "api": ctx.api, "glslang": vk.glslang() or ""})]


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    return _probe()


# -- claims ---------------------------------------------------------------------------------------

@lru_cache(maxsize=8192)
def _renderable(program: str, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
    from . import glsl

    try:
        src = glsl.elementwise(program, in_dtypes, out_dtype)
        if "GL_ARB_gpu_shader_int64" in src:
            from .vk import context

            if not context().wide:
                return "sin/cos/pow need shaderFloat64 + shaderInt64, which this device lacks"
    except RLXError as e:
        return f"not renderable as GLSL: {e.what}"
    except Exception as e:
        return f"not renderable as GLSL: {type(e).__name__}: {e}"
    return None


def _rank_ok(v: Any) -> str | None:
    if any(t.rank > MAX_RANK for t in (*v.in_types, *v.out_types)):
        return f"rank > {MAX_RANK}"
    return None


def _wide() -> bool:
    from .vk import context

    return context().wide


def _ew_pred(v: Any) -> str | None:
    ins = GEN | ({DType.I64} if _wide() else set())
    bad = sorted({t.dtype.value for t in v.in_types if t.dtype not in ins})
    if v.out_types[0].dtype not in ins:
        bad.append(v.out_types[0].dtype.value)
    if bad:
        return f"no GLSL storage for {', '.join(sorted(set(bad)))}"
    prog = str(v.attrs["program"]) if v.op == "fused_elementwise" else \
        single_op_program(v.op, len(v.in_types), dict(v.attrs))
    return _rank_ok(v) or _renderable(prog, tuple(t.dtype for t in v.in_types), v.out_types[0].dtype)


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
    claims = []
    for op in sorted(FUSIBLE):
        dts = frozenset(REGISTRY.get(op).dtypes or GEN) & (GEN | {DType.I64})
        if op == "cast":
            claims.append(_claim(op, GEN | {DType.I64}, out_dtypes=GEN | {DType.I64}, predicate=_ew_pred,
                                 in_place=True, constraint="i64 results only from integers/bool"))
        elif op == "where":
            claims.append(_claim(op, dts | {DType.BOOL}, out_dtypes=dts, predicate=_ew_pred, in_place=True))
        else:
            claims.append(_claim(op, dts, predicate=_ew_pred, in_place=True))
    claims += [
        _claim("fused_elementwise", None, predicate=_ew_pred, in_place=True,
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
