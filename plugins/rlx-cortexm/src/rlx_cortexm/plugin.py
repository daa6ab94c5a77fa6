"""rlx-cortexm hook implementations: identity, the Cortex-M targets, the INT8 claims, compilation.

Claims are the quantized ops of :mod:`rlx_core.quant` plus the data movement and elementwise ops an
INT8 graph needs (int8 ReLU as ``maximum``, ``argmax``, ``reshape``, ``transpose``) and ``add[f32]``
(so ``rlx doctor``'s x + 1 check runs on the device). Float model ops are not claimed: such graphs do
not compile here (quantize them first with ``rlx quantize``).
"""

from __future__ import annotations

from typing import Any

from rlx_core import API_VERSION
from rlx_core.plugin import BackendInfo, DeviceCaps, DeviceInfo, KernelClaim, NodeVariant, hookimpl

from . import __version__

MAX_RANK = 8


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="cortexm", version=__version__, api_version=API_VERSION,
                       description="INT8 graphs as one C program for Arm Cortex-M (arm-none-eabi-gcc, QEMU)",
                       vendor="RLX", whole_program=True)


@hookimpl
def rlx_exporters() -> list[Any]:
    from rlx_core.plugin import ExporterInfo

    # Named, not imported: the exporter's own imports wait until `rlx export --target cortexm` runs.
    return [ExporterInfo(target="cortexm", command="rlx_cortexm.export:export_command",
                         help="one C program for Arm Cortex-M, with a Makefile (INT8 models)")]


def _caps(mhz: float, fpu: bool) -> DeviceCaps:
    hz = mhz * 1e6
    # SMLAD: 2 int8 MACs (4 ops) per cycle at best; ~1 op/cycle for int32 and (hardware) f32.
    return DeviceCaps(peak_flops={"i8": 4.0 * hz, "i32": hz, "f32": hz if fpu else hz / 30.0,
                                  "default": hz / 4.0},
                      mem_bandwidth=4.0 * hz, launch_overhead=50.0 / hz,
                      host_link_bandwidth=2.0e6, source="datasheet estimate")


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    from .targets import TARGETS, missing_reason, tool

    why = missing_reason()
    out = []
    for i, t in enumerate(TARGETS):
        details = {"core": t.cpu, "float_abi": t.float_abi, "fpu": t.fpu or "none", "qemu_machine": t.board,
                   "description": t.description, "compiler": tool("arm-none-eabi-gcc") or "missing",
                   "qemu": tool("qemu-system-arm") or "missing"}
        out.append(DeviceInfo(backend="cortexm", name=f"cortexm:{i}", available=why is None,
                              caps=_caps(t.mhz, t.fpu is not None), reason=why or "", host_memory=False,
                              details=details))
    return out


@hookimpl
def rlx_ops() -> list[Any]:
    """The quantized ops of rlx_core.quant: registered whenever this backend is loaded, so INT8 models
    load and the conformance suite covers them (they are core ops; registering them again is a no-op)."""
    from rlx_core.plugin import REGISTRY, register_quant_ops

    return [REGISTRY.get(name) for name in register_quant_ops()]


# -- claim predicates --------------------------------------------------------------------------

def _static(v: NodeVariant) -> str | None:
    for t in (*v.in_types, *v.out_types):
        if not t.is_static:
            return "shapes must be static"
        if t.rank > MAX_RANK:
            return f"rank {t.rank} > {MAX_RANK}"
    return None


def _suffix_broadcast(small: tuple[Any, ...], full: tuple[Any, ...]) -> bool:
    """``small`` broadcasts to ``full`` as a scalar, a trailing block (per channel) or the full shape."""
    s = (1,) * (len(full) - len(small)) + tuple(small)
    return any(all(d == 1 for d in s[:k]) and s[k:] == tuple(full[k:]) for k in range(len(full) + 1))


def _requantize_pred(v: NodeVariant) -> str | None:
    why = _static(v)
    if why:
        return why
    x = v.in_types[0].shape
    for t, name in ((v.in_types[1], "multiplier"), (v.in_types[2], "shift")):
        if not _suffix_broadcast(t.shape, x):
            return f"{name} {t.shape} must be a scalar, trailing (per-channel) or full block of {x}"
    return None


def _depthwise_pred(v: NodeVariant) -> str | None:
    why = _static(v)
    if why:
        return why
    c = v.in_types[0].shape[3]
    cg = v.in_types[1].shape[3]
    return None if cg == 1 and int(v.attrs["groups"]) == c else "not depthwise (groups != C)"  # type: ignore[arg-type]


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    from rlx_core.plugin import DType, register_quant_ops

    register_quant_ops()  # the quantized ops claimed below

    i8, i32, f32 = DType.I8, DType.I32, DType.F32
    q = frozenset({i8, i32})
    movable = frozenset({i8, i32, f32})
    s8, s32, fp32 = frozenset({i8}), frozenset({i32}), frozenset({f32})
    return [
        KernelClaim("quantize", "cortexm.quantize_f32_s8", dtypes=fp32, predicate=_static),
        KernelClaim("dequantize", "cortexm.dequantize_s8_f32", dtypes=s8, predicate=_static),
        KernelClaim("matmul_i8", "cortexm.fully_connected_s8", dtypes=q, predicate=_static),
        KernelClaim("conv2d_i8", "cortexm.depthwise_conv_s8", dtypes=q, predicate=_depthwise_pred,
                    constraint="groups == C (one input channel per group)"),
        KernelClaim("conv2d_i8", "cortexm.convolve_s8", dtypes=q, predicate=_static),
        KernelClaim("requantize", "cortexm.requantize_s32_s8", dtypes=s32, predicate=_requantize_pred,
                    constraint="multiplier/shift scalar, per trailing block, or full"),
        KernelClaim("max_pool2d_i8", "cortexm.max_pool_s8", dtypes=s8, predicate=_static),
        KernelClaim("avg_pool2d_i8", "cortexm.avg_pool_s8", dtypes=s8, predicate=_static),
        KernelClaim("softmax_i8", "cortexm.softmax_s8", dtypes=s8, predicate=_static),
        KernelClaim("argmax", "cortexm.argmax_s8", dtypes=s8, predicate=_static),
        KernelClaim("maximum", "cortexm.maximum_s8", dtypes=s8, predicate=_static, in_place=True),
        KernelClaim("add", "cortexm.add_f32", dtypes=fp32, predicate=_static, in_place=True),
        KernelClaim("reshape", "cortexm.reshape", dtypes=movable, predicate=_static, in_place=True),
        KernelClaim("transpose", "cortexm.transpose", dtypes=movable, predicate=_static),
    ]


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    from .program import CortexMProgram
    from .targets import target

    return CortexMProgram(program, target(int(device.name.split(":")[1])))


@hookimpl
def rlx_settings() -> list[Any]:
    from .settings import SETTINGS

    return list(SETTINGS)
