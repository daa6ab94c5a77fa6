"""rlx-fpga hook implementations: identity, the FPGA "devices" (simulated), INT8 claims, cost, compile.

Claimed (and generated as RTL): ``matmul_i8`` (P-MAC array), ``conv2d_i8``, ``max_pool2d_i8`` and
``avg_pool2d_i8`` (window address generators, one tap per cycle), ``requantize`` (TFLite fixed point),
``maximum[i8]`` (int8 ReLU), ``reshape[i8|i32|f32]`` (no hardware) and ``add[f32]`` (an IEEE binary32
adder, round to nearest even, so ``rlx doctor``'s x + 1 runs on the device). Everything else is unclaimed and
does not compile here (the conformance suite reports it as skipped = not certified): quantize the
model, and run the float ends (``quantize``, ``softmax_i8``, ``dequantize``) on the host.
"""

from __future__ import annotations

from typing import Any

from rlx_core import API_VERSION
from rlx_core.plugin import BackendInfo, DeviceCaps, DeviceInfo, KernelClaim, NodeVariant, hookimpl

from . import __version__

#: (device index) -> (name, FPGA family for synthesis, parallel MACs, clock Hz)
DEVICES = (("ice40", "synth_ice40", 4, 24e6), ("xilinx", "synth_xilinx", 8, 150e6))


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="fpga", version=__version__, api_version=API_VERSION,
                       description="INT8 graphs as synthesizable Verilog (MAC array), simulated with "
                                   "Icarus Verilog", vendor="RLX", whole_program=True)


@hookimpl
def rlx_exporters() -> list[Any]:
    from rlx_core.plugin import ExporterInfo

    # Named, not imported: the exporter's own imports wait until `rlx export --target fpga` runs.
    return [ExporterInfo(target="fpga", command="rlx_fpga.export:export_command",
                         help="synthesizable Verilog with .mem weight files (INT8 models)")]


def _caps(macs: int, hz: float) -> DeviceCaps:
    return DeviceCaps(peak_flops={"i8": 2.0 * macs * hz, "i32": hz, "default": hz},
                      mem_bandwidth=4.0 * hz, launch_overhead=3.0 / hz, host_link_bandwidth=4.0 * hz,
                      source="cycle model of the generated RTL")


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    from .sim import missing_reason, tool

    why = missing_reason()
    return [DeviceInfo(backend="fpga", name=f"fpga:{i}", available=why is None, caps=_caps(p, hz),
                       reason=why or "", host_memory=False,
                       details={"family": fam, "synth": syn, "parallel_macs": str(p), "clock_hz": str(hz),
                                "simulator": tool("iverilog") or "missing",
                                "yosys": tool("yosys") or "missing"})
            for i, (fam, syn, p, hz) in enumerate(DEVICES)]


@hookimpl
def rlx_ops() -> list[Any]:
    from rlx_core.plugin import REGISTRY, register_quant_ops

    return [REGISTRY.get(name) for name in register_quant_ops()]


def _static(v: NodeVariant) -> str | None:
    for t in (*v.in_types, *v.out_types):
        if not t.is_static:
            return "shapes must be static"
    return None


def _elementwise_pred(v: NodeVariant) -> str | None:
    from .rtl import MAX_RANK

    why = _static(v)
    if why:
        return why
    if v.out_types[0].rank > MAX_RANK:
        return f"rank {v.out_types[0].rank} > {MAX_RANK}"
    return None


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    from rlx_core.plugin import DType, register_quant_ops

    register_quant_ops()  # the quantized ops claimed below

    i8, i32 = DType.I8, DType.I32
    return [
        KernelClaim("matmul_i8", "fpga.mac_array", dtypes=frozenset({i8, i32}), predicate=_static,
                    constraint="static shapes"),
        KernelClaim("requantize", "fpga.requantize", dtypes=frozenset({i32}), predicate=_elementwise_pred,
                    constraint="static, rank <= 8, NumPy broadcasting"),
        KernelClaim("maximum", "fpga.maximum_s8", dtypes=frozenset({i8}), predicate=_elementwise_pred,
                    constraint="static, rank <= 8, NumPy broadcasting"),
        KernelClaim("reshape", "fpga.reshape", dtypes=frozenset({i8, i32, DType.F32}), predicate=_static,
                    in_place=True),
        KernelClaim("conv2d_i8", "fpga.conv_taps", dtypes=frozenset({i8, i32}), predicate=_static,
                    constraint="static shapes (NHWC, any stride/padding/dilation/groups)"),
        KernelClaim("max_pool2d_i8", "fpga.max_pool", dtypes=frozenset({i8}), predicate=_static,
                    constraint="static shapes"),
        KernelClaim("avg_pool2d_i8", "fpga.avg_pool", dtypes=frozenset({i8}), predicate=_static,
                    constraint="static shapes"),
        KernelClaim("add", "fpga.add_f32", dtypes=frozenset({DType.F32}), predicate=_elementwise_pred,
                    constraint="static, rank <= 8, NumPy broadcasting (IEEE binary32 adder)"),
    ]


@hookimpl
def rlx_kernel_cost(claim: Any, variant: NodeVariant, caps: DeviceCaps) -> float | None:
    """Seconds from the generated RTL's cycle model at the device clock; the parallelism is the
    device's MAC count, capped by the DSP blocks the latest yosys report says the part has left."""
    if not str(getattr(claim, "name", "")).startswith("fpga."):
        return None
    from .rtl import step_cycles
    from .synth import effective_parallel

    hz = caps.peak_flops.get("i32", 24e6)
    macs = max(1, round(caps.peak_flops.get("i8", 2 * hz) / (2 * hz)))
    p = effective_parallel(macs)
    ins = [tuple(int(d) if isinstance(d, int) else 1 for d in t.shape) for t in variant.in_types]
    outs = [tuple(int(d) if isinstance(d, int) else 1 for d in t.shape) for t in variant.out_types]
    return max(1, step_cycles(variant.op, ins, outs, p)) / hz


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    from .program import FPGAProgram

    idx = int(device.name.split(":")[1])
    return FPGAProgram(program, parallel=DEVICES[idx][2])
