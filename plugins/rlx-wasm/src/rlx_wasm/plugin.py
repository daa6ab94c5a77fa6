"""rlx-wasm hook implementations: identity, the wasmtime device, kernel claims, compilation.

A whole-program backend: ``rlx_compile`` turns the LIR program into ONE WebAssembly module (see
:mod:`rlx_wasm.codegen`) and instantiates it in wasmtime. Claims are per variant and only what the
generated code implements: f32 everywhere (SIMD128 when enabled), f64/i32/i64/bool (and narrow
integers for elementwise ops) where wasm has the operation, any dtype for pure data movement.
Everything else goes through the core's decompositions and rewrites (f16/bf16 computed in f32
between casts, narrow integers widened) or fails compilation.
"""

from __future__ import annotations

from typing import Any

from rlx_core import API_VERSION
from rlx_core.plugin import (
    FUSED,  # noqa: F401  (importing it registers the fused_elementwise op)
    BackendInfo,
    DeviceCaps,
    DeviceInfo,
    DType,
    KernelClaim,
    NodeVariant,
    hookimpl,
)

from . import __version__
from . import elementwise as ew

D = DType
F32 = frozenset({D.F32})
F = frozenset({D.F32, D.F64})
FI = frozenset({D.F32, D.F64, D.I32, D.I64})
ANY = frozenset(ew.REPR)
#: Elementwise kernels that are correct when the output overwrites a same-shape input.
IN_PLACE = frozenset({"add", "sub", "mul", "div", "maximum", "minimum", "neg", "abs", "exp", "log", "sqrt",
                      "rsqrt", "reciprocal", "tanh", "sigmoid", "erf", "floor", "ceil", "round", "sign",
                      "logical_not", "logical_and", "logical_or", "logical_xor", "reshape"})


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="wasm", version=__version__, api_version=API_VERSION,
                       description="one WebAssembly module per program (SIMD128), run in wasmtime",
                       vendor="RLX", whole_program=True)


@hookimpl
def rlx_exporters() -> list[Any]:
    from rlx_core.plugin import ExporterInfo

    # Named, not imported: the exporter's own imports wait until `rlx export --target wasm` runs.
    return [ExporterInfo(target="wasm", command="rlx_wasm.export:export_command",
                         help="one .wasm module, its weights and JavaScript loaders (Node.js, browsers)")]


def _caps() -> DeviceCaps:
    # One thread of SIMD128 code: single-core numbers (`rlx calibrate wasm` measures them). f32:
    # 4-wide multiply-adds at ~3 GHz; wasmtime's matmul measured 31 GFLOP/s on a 2-core x86 host,
    # where 8e9 put the demo MLP's estimate 4x above its run time.
    return DeviceCaps(peak_flops={"f32": 2.4e10, "f64": 2e9, "default": 1e9}, mem_bandwidth=6e9,
                      launch_overhead=2e-7, host_link_bandwidth=None)


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    try:
        import wasmtime
    except Exception as e:  # the device exists only with its runtime
        return [DeviceInfo(backend="wasm", name="wasm:0", available=False, caps=_caps(),
                           reason=f"the wasmtime package is not importable ({type(e).__name__}: {e}); "
                                  "pip install wasmtime")]
    from .options import simd_enabled

    ver = getattr(wasmtime, "__version__", "")
    if not ver:
        try:
            from importlib.metadata import version

            ver = version("wasmtime")
        except Exception:
            ver = "?"
    return [DeviceInfo(backend="wasm", name="wasm:0", available=True, caps=_caps(), host_memory=True,
                       details={"runtime": f"wasmtime {ver}",
                                "simd128": "on" if simd_enabled() else "off (RLX_WASM_SIMD=0)"})]


def _ew_pred(v: NodeVariant) -> str | None:
    return ew.supported(v.op, v.in_dtypes, v.out_types[0].dtype)


def _fused_pred(v: NodeVariant) -> str | None:
    return ew.fused_supported(str(v.attrs["program"]), v.in_dtypes)


def _gather_pred(v: NodeVariant) -> str | None:
    if v.in_types[0].dtype not in ANY:
        return f"gather of {v.in_types[0].dtype} is not supported"
    if v.in_types[1].dtype not in (D.I32, D.I64):
        return "indices must be i32 or i64"
    return None


def _iota_pred(v: NodeVariant) -> str | None:
    d = v.out_types[0].dtype
    return None if d in ew.CASTABLE and d is not D.BOOL else f"iota of {d} is not supported"


def _scatter_pred(v: NodeVariant) -> str | None:
    x, idx, upd = v.in_dtypes
    if idx not in (D.I32, D.I64):
        return "indices must be i32 or i64"
    return None if x in (FI | {D.I8, D.I16, D.U8}) and upd == x else f"scatter_add of {x} is not supported"


def _linear_pred(v: NodeVariant) -> str | None:
    return None if v.in_types[1].rank == 2 else "w must be 2-D"


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    claims = []
    for op in ew.SUPPORTED:
        claims.append(KernelClaim(op, f"wasm.{op}", predicate=_ew_pred, in_place=op in IN_PLACE,
                                  constraint="see rlx_wasm.elementwise.SUPPORTED"))
    claims.append(KernelClaim("fused_elementwise", "wasm.fused_elementwise", predicate=_fused_pred,
                              constraint="every op of the chain runs natively on its dtypes"))
    for op in ("reshape", "transpose", "expand", "slice", "concat", "pad"):
        claims.append(KernelClaim(op, f"wasm.{op}", dtypes=ANY, in_place=op in IN_PLACE))
    claims.append(KernelClaim("gather", "wasm.gather", predicate=_gather_pred, out_dtypes=ANY))
    claims.append(KernelClaim("iota", "wasm.iota", predicate=_iota_pred))
    narrow = FI | {D.I8, D.I16, D.U8}
    for op in ("reduce_sum", "reduce_prod"):
        claims.append(KernelClaim(op, f"wasm.{op}", dtypes=FI))
    for op in ("reduce_max", "reduce_min"):  # exact in any integer width
        claims.append(KernelClaim(op, f"wasm.{op}", dtypes=narrow))
    claims.append(KernelClaim("reduce_mean", "wasm.reduce_mean", dtypes=F))
    claims.append(KernelClaim("argmax", "wasm.argmax", dtypes=narrow))
    claims.append(KernelClaim("argmin", "wasm.argmin", dtypes=narrow))
    claims.append(KernelClaim("cumsum", "wasm.cumsum", dtypes=FI))
    claims.append(KernelClaim("conv2d", "wasm.conv2d", dtypes=FI,
                              constraint="im2col in scratch memory + the blocked GEMM"))
    claims.append(KernelClaim("scatter_add", "wasm.scatter_add", predicate=_scatter_pred, out_dtypes=narrow))
    claims.append(KernelClaim("matmul", "wasm.matmul", dtypes=FI,
                              constraint="blocked f32x4 GEMM for f32, scalar otherwise"))
    claims += [KernelClaim("linear", "wasm.linear", dtypes=F32, predicate=_linear_pred,
                           constraint="W^T prepared at compile time when W is a constant"),
               KernelClaim("softmax", "wasm.softmax", dtypes=F32),
               KernelClaim("log_softmax", "wasm.log_softmax", dtypes=F32),
               KernelClaim("layer_norm", "wasm.layer_norm", dtypes=F32)]
    return claims


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    from .codegen import generate
    from .options import simd_enabled
    from .runtime import WasmProgram
    from .settings import TUNE

    return WasmProgram(generate(program, simd_enabled(), str(TUNE.get())))


@hookimpl
def rlx_settings() -> list[Any]:
    from .settings import SETTINGS

    return list(SETTINGS)
