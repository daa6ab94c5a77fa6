"""rlx-oneapi hook implementations: identity, devices, claims, compile, the exporter.

A whole-program backend: ``rlx_compile`` turns the LIR program into ONE OpenVINO model
(:mod:`rlx_oneapi.translate`) and compiles it with the OpenVINO runtime for one of its devices
(oneDNN kernels on the CPU). Claims are made only for the ops and dtypes whose translation matches
the reference semantics and that the conformance suite certifies here; the rest decomposes or fails
compilation. OpenVINO is imported only when devices are probed, a program is compiled or exported
(``rlx export MODEL --target oneapi``: the same model as OpenVINO IR, :mod:`rlx_oneapi.export`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlx_core import API_VERSION
from rlx_core.plugin import (
    BackendInfo,
    BackendNotFoundError,
    DeviceCaps,
    DeviceInfo,
    DType,
    KernelClaim,
    NodeVariant,
    hookimpl,
)

from . import __version__

F32 = frozenset({DType.F32})
NUM = frozenset({DType.F32, DType.I32})
DATA = frozenset({DType.F32, DType.I32, DType.BOOL})
BOOL = frozenset({DType.BOOL})
INDEX = frozenset({DType.I32, DType.I64})
NARROW = frozenset({DType.I8, DType.U8, DType.I16})
CASTABLE = frozenset({DType.F16, DType.BF16, DType.F32, DType.I32, DType.BOOL}) | NARROW

#: Float-only ops (OpenVINO's integer division floors, the reference truncates: not claimed).
#: softmax/log_softmax are not claimed, so the core's decompositions run them on the claimed ops:
#: OpenVINO's give 0 / -inf on rows holding inf or NaN, the reference NaN.
FLOAT_OPS = ("div", "pow", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sigmoid", "tanh", "erf", "sin",
             "cos", "floor", "ceil", "round", "reduce_mean", "layer_norm", "gelu", "relu", "silu", "linear",
             "conv2d", "matmul", "greater", "greater_equal", "less", "less_equal", "reduce_sum", "reduce_max",
             "reduce_min", "reduce_prod")
#: f32 and i32: i32 arithmetic wraps in OpenVINO as in the reference. i32 comparisons, reductions
#: and matmul are not claimed: the CPU plugin runs them through f32 and loses the low bits of
#: values above 2**24 (the suite's overflow cases).
NUM_OPS = ("add", "sub", "mul", "maximum", "minimum", "abs", "neg", "sign", "cumsum")
#: f32 and bool (i32 equality goes through f32 too).
EQ_OPS = ("equal", "not_equal")
#: f32, i32, bool and the narrow integers (data movement is exact for every type).
DATA_OPS = ("reshape", "expand", "transpose", "slice", "concat", "pad")
BOOL_OPS = ("logical_and", "logical_or", "logical_xor", "logical_not")


def _first_in(allowed: frozenset[DType], what: str) -> Any:
    def pred(v: NodeVariant) -> str | None:
        d = v.in_types[0].dtype
        return None if d in allowed else f"{what} must be one of {sorted(str(a) for a in allowed)}, got {d}"
    return pred


def _where(v: NodeVariant) -> str | None:
    c, a, b = (t.dtype for t in v.in_types)
    if c != DType.BOOL:
        return "the condition must be bool"
    return None if a in DATA and b in DATA else "branches must be f32, i32 or bool"


def _nonempty_reduce(v: NodeVariant) -> str | None:
    # max/min over an empty axis has no identity: the reference raises, OpenVINO returns a value.
    shape = v.in_types[0].shape
    axes = v.attrs.get("axes")
    idx = range(len(shape)) if axes is None else [int(a) % max(len(shape), 1) for a in axes]  # type: ignore[union-attr]
    return "reduces an empty axis" if any(shape[i] == 0 for i in idx) else None


def _cast_ok(v: NodeVariant) -> str | None:
    # float -> narrow int is out of range more often than not (the reference wraps after
    # truncating; Convert saturates): computed as float -> i32 -> narrow, by the core, if at all.
    src = v.in_types[0].dtype
    if v.out_types[0].dtype in NARROW and not (src.is_int or src == DType.BOOL):
        return "casts into i8/u8/i16 only from integers or bool"
    return None


def _nonempty(v: NodeVariant) -> str | None:
    # OpenVINO's CPU plugin fails to compile a MatMul/Convolution with a zero-size operand.
    return "a zero-size operand" if any(0 in t.shape for t in (*v.in_types, *v.out_types)) else None


def _ranked(v: NodeVariant) -> str | None:
    t = v.out_types[0] if v.op == "iota" else v.in_types[0]
    return None if t.shape else "a rank-0 tensor (OpenVINO's Pad and the iota translation need an axis)"


PREDICATES: dict[str, tuple[Any, str]] = {
    "reduce_max": (_nonempty_reduce, "no empty reduced axis"),
    "reduce_min": (_nonempty_reduce, "no empty reduced axis"),
    "reduce_mean": (_nonempty_reduce, "no empty reduced axis"),
    "matmul": (_nonempty, "no zero-size operand"), "linear": (_nonempty, "no zero-size operand"),
    "conv2d": (_nonempty, "no zero-size operand"),
    "pad": (_ranked, "rank >= 1"), "iota": (_ranked, "rank >= 1"),
}


def _claim(op: str, dtypes: frozenset[DType], **kw: Any) -> KernelClaim:
    pred, why = PREDICATES.get(op, (None, ""))
    return KernelClaim(op, f"oneapi.{op}", dtypes=dtypes, predicate=pred, constraint=why, **kw)


def claims() -> list[KernelClaim]:
    out: list[KernelClaim] = []
    out += [_claim(op, F32) for op in FLOAT_OPS]
    out += [_claim(op, NUM) for op in NUM_OPS]
    out += [_claim(op, F32 | BOOL) for op in EQ_OPS]
    out += [_claim(op, DATA | NARROW) for op in DATA_OPS]
    for op in BOOL_OPS:
        out.append(KernelClaim(op, f"oneapi.{op}", dtypes=BOOL))
    out += [
        KernelClaim("where", "oneapi.where", predicate=_where,
                    constraint="bool condition; f32/i32/bool branches"),
        KernelClaim("cast", "oneapi.cast", dtypes=CASTABLE, out_dtypes=CASTABLE, predicate=_cast_ok,
                    constraint="into i8/u8/i16 from integers only"),
        KernelClaim("gather", "oneapi.gather", dtypes=DATA | INDEX,
                    predicate=_first_in(DATA, "gathered data"),
                    constraint="data f32/i32/bool, indices i32/i64"),
        KernelClaim("scatter_add", "oneapi.scatter_add", dtypes=NUM | INDEX,
                    predicate=_first_in(NUM, "scattered data"), constraint="data f32/i32, indices i32/i64"),
        _claim("iota", frozenset({DType.F32, DType.I32, DType.I64})),
    ]
    return out


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="oneapi", version=__version__, api_version=API_VERSION, vendor="RLX",
                       description="Intel oneAPI through the OpenVINO runtime (oneDNN on the CPU): "
                                   "one OpenVINO model per program", whole_program=True)


def _caps(ov_device: str, threads: int) -> DeviceCaps:
    if ov_device.startswith("CPU"):
        # oneDNN's f32 GEMM reaches tens of GFLOP/s per core with AVX2/AVX-512; one inference
        # request costs a few microseconds per node on top.
        return DeviceCaps(peak_flops={"f32": 3e10 * threads, "default": 3e10 * threads},
                          mem_bandwidth=1e10, launch_overhead=2e-6,
                          source=f"plugin estimate (OpenVINO {ov_device}, {threads} threads)")
    return DeviceCaps(peak_flops={"f32": 1e12, "default": 1e12}, mem_bandwidth=1e11, launch_overhead=1e-5,
                      source=f"plugin estimate (OpenVINO {ov_device})",
                      unreliable=f"OpenVINO {ov_device}: guessed figures; run `rlx calibrate oneapi`")


def _probe() -> list[DeviceInfo]:
    import os

    rough = DeviceCaps(peak_flops={"default": 1e9}, mem_bandwidth=1e9, launch_overhead=1e-5,
                       source="no device")
    try:
        import openvino as ov

        from .runtime import core

        names = list(core().available_devices)
    except Exception as e:  # a missing wheel or a broken runtime: say so, never raise
        return [DeviceInfo("oneapi", "oneapi:0", False, rough,
                           reason=f"the OpenVINO runtime is not usable ({type(e).__name__}: {e}); "
                                  "install it: pip install 'openvino>=2025'")]
    if not names:
        return [DeviceInfo("oneapi", "oneapi:0", False, rough, reason="OpenVINO sees no device")]
    # The CPU first, so oneapi:0 is the device every machine has; then GPU.N / NPU as OpenVINO lists them.
    names.sort(key=lambda n: (not n.startswith("CPU"), n))
    out = []
    for i, name in enumerate(names):
        try:
            full = str(core().get_property(name, "FULL_DEVICE_NAME"))
        except Exception:
            full = name
        out.append(DeviceInfo("oneapi", f"oneapi:{i}", True, _caps(name, os.cpu_count() or 1),
                              details={"openvino_device": name, "device": full, "openvino": ov.__version__,
                                       "precision": "f32 (INFERENCE_PRECISION_HINT=f32)"}))
    return out


_DEVICES: list[DeviceInfo] | None = None


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    global _DEVICES
    if _DEVICES is None:
        _DEVICES = _probe()
    return _DEVICES


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    """The same claims on every OpenVINO device: the translation is device independent, and only
    the CPU has been certified (``rlx conformance oneapi`` certifies the device it runs on)."""
    return claims()


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    ov_device = device.details.get("openvino_device")
    if not device.available or not ov_device:
        raise BackendNotFoundError(f"{device.name} is unavailable: {device.reason}", fix="run `rlx doctor`")
    from .program import compile_program

    return compile_program(program, ov_device)


def _export(graph: Any, out_dir: Path, bindings: dict[str, int]) -> dict[str, Any]:
    from .export import export_graph

    return export_graph(graph, out_dir, bindings=bindings)


@hookimpl
def rlx_exporters() -> list[Any]:
    from rlx_core.plugin import ExporterInfo

    return [ExporterInfo(target="oneapi", function=_export,
                         help="OpenVINO IR (model.xml, model.bin, f32) and manifest.json: the model "
                              "rlx-oneapi compiles")]


@hookimpl
def rlx_settings() -> list[Any]:
    from .settings import SETTINGS

    return list(SETTINGS)
