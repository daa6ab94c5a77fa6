"""rlx-cpu hook implementations: identity, the host device, kernel claims and compilation.

f16 and bf16 are claimed only for ops that are exact in storage precision (data movement, casts,
selection, comparisons, min/max, sign flips); arithmetic on them takes the core's
``compute_f16_in_f32`` rewrite, so nothing accumulates in half precision.
"""

from __future__ import annotations

import os
import platform
from typing import Any

from rlx_core import API_VERSION
from rlx_core.plugin import (
    FUSED,  # noqa: F401  (importing it registers the fused_elementwise op)
    REGISTRY,
    BackendInfo,
    DeviceCaps,
    DeviceInfo,
    DType,
    KernelClaim,
    hookimpl,
)

from . import __version__, settings
from .settings import Setting

HALF = frozenset({DType.F16, DType.BF16})
#: Ops computed exactly in storage precision, so half types may run natively.
EXACT = frozenset({"reshape", "transpose", "expand", "slice", "concat", "pad", "gather", "where",
                   "cast", "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
                   "neg", "abs", "maximum", "minimum", "iota", "argmax", "argmin", "sign",
                   "bitcast"})
IN_PLACE = frozenset({"add", "sub", "mul", "div", "pow", "maximum", "minimum", "neg", "abs", "exp", "log",
                      "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid", "erf", "floor",
                      "ceil", "round", "sign", "logical_not", "logical_and", "logical_or",
                      "logical_xor", "reshape"})


def _factories() -> dict[str, Any]:
    import numpy as np

    from . import kernels as k

    f: dict[str, Any] = {
        "neg": k.ufunc1(np.negative), "abs": k.k_abs, "sign": k.k_sign, "exp": k.ufunc1(np.exp),
        "log": k.ufunc1(np.log), "sqrt": k.ufunc1(np.sqrt), "rsqrt": k.k_rsqrt,
        "reciprocal": k.k_reciprocal, "sin": k.ufunc1(np.sin), "cos": k.ufunc1(np.cos),
        "tanh": k.ufunc1(np.tanh), "sigmoid": k.k_sigmoid, "erf": k.k_erf, "floor": k.ufunc1(np.floor),
        "ceil": k.ufunc1(np.ceil), "round": k.ufunc1(np.round), "logical_not": k.ufunc1(np.logical_not),
        "add": k.k_add, "sub": k.ufunc2(np.subtract), "mul": k.ufunc2(np.multiply),
        "div": k.ufunc2(np.true_divide), "pow": k.ufunc2(np.power), "maximum": k.ufunc2(np.maximum),
        "minimum": k.ufunc2(np.minimum), "logical_and": k.ufunc2(np.logical_and),
        "logical_or": k.ufunc2(np.logical_or), "logical_xor": k.ufunc2(np.logical_xor),
        "equal": k.ufunc2(np.equal), "not_equal": k.ufunc2(np.not_equal), "less": k.ufunc2(np.less),
        "less_equal": k.ufunc2(np.less_equal), "greater": k.ufunc2(np.greater),
        "greater_equal": k.ufunc2(np.greater_equal), "where": k.k_where, "cast": k.k_cast,
        "reduce_sum": k.reduction(np.sum), "reduce_prod": k.reduction(np.prod),
        "reduce_mean": k.reduction(np.mean), "reduce_max": k.reduction(np.max, False),
        "reduce_min": k.reduction(np.min, False), "argmax": k.k_arg(np.argmax),
        "argmin": k.k_arg(np.argmin), "matmul": k.k_matmul, "reshape": k.k_reshape,
        "transpose": k.k_transpose, "expand": k.k_expand, "slice": k.k_slice, "concat": k.k_concat,
        "pad": k.k_pad, "gather": k.k_gather, "scatter_add": k.k_scatter_add, "iota": k.k_iota,
        "conv2d": k.k_conv2d, "cumsum": k.k_cumsum,
    }
    return f


_FACTORIES: dict[str, Any] | None = None


def factories() -> dict[str, Any]:
    global _FACTORIES
    if _FACTORIES is None:
        from .kernels import k_int_div

        out = {f"cpu.{op}": fn for op, fn in _factories().items()}
        out["cpu.div_int"] = k_int_div
        out["cpu.fused_elementwise"] = _fused_factory
        from . import hir_kernels as hk
        from . import index_kernels as ik

        out.update({"cpu.scatter_reduce": ik.k_scatter_reduce, "cpu.topk_indices": ik.k_topk_indices})
        from . import bitwise  # bitwise_and/or/xor/not (claimed like the elementwise kernels)

        out.update(bitwise.FACTORIES)
        from . import ops2  # mod on floats, bitcast (rlx_core.ir.ops.exact)

        out.update(ops2.FACTORIES)
        from . import splat  # Gaussian splatting (Numba when bound)

        out.update(splat.FACTORIES)
        from .collectives import FACTORIES as COLLECTIVE_FACTORIES  # MPI only when a kernel binds

        out.update(COLLECTIVE_FACTORIES)
        from . import linalg  # CSR, solvers, LAPACK (claimed in linalg.claims)

        out.update(linalg.FACTORIES)
        from . import bounded  # nonzero, non_max_suppression: padded result + count (bounded.claims)

        out.update(bounded.FACTORIES)
        from . import recurrent  # lstm_scan, gru_scan: a layer's recurrence in one call (recurrent.claims)

        out.update(recurrent.FACTORIES)
        out.update({"cpu.linear": hk.k_linear, "cpu.softmax": hk.k_softmax,
                    "cpu.log_softmax": hk.k_log_softmax, "cpu.layer_norm": hk.k_layer_norm,
                    "cpu.rms_norm": hk.k_rms_norm,
                    "cpu.attention": hk.k_attention})
        from .conv import k_conv2d_bias  # oneDNN's primitive adds the bias (rlx_cpu.onednn_conv)

        out["cpu.conv2d_bias"] = k_conv2d_bias
        from .conv_fusion import k_conv2d_bias_relu

        out["cpu.rlx_cpu.conv2d_bias_relu"] = out["cpu.rlx_cpu.conv2d_bias_add_relu"] = k_conv2d_bias_relu
        from .conv_fusion import k_conv2d_bias_silu

        out["cpu.rlx_cpu.conv2d_bias_silu"] = k_conv2d_bias_silu
        from .conv_fusion import k_conv2d_bias_hardswish

        out["cpu.rlx_cpu.conv2d_bias_hardswish"] = k_conv2d_bias_hardswish
        from .conv_fusion import k_conv2d_bias_nhwc

        out["cpu.rlx_cpu.conv2d_bias_nhwc"] = k_conv2d_bias_nhwc
        from .pooling import k_max_pool2d  # one pass instead of pad + a slice and a max a tap

        out["cpu.max_pool2d"] = k_max_pool2d
        from .conv_chain import k_conv_chain  # convs with blocked activations between them

        out["cpu.rlx_cpu.conv_chain"] = k_conv_chain
        _FACTORIES = out
    return _FACTORIES


@hookimpl
def rlx_ops() -> list[Any]:
    from .conv_chain import ops as chain_ops  # conv chains in oneDNN's blocked layout
    from .conv_fusion import ops  # conv tails with oneDNN post-ops (rlx_cpu.conv_fusion)

    return ops() + chain_ops()


@hookimpl
def rlx_fusion_rules() -> list[Any]:
    from .conv_chain import RULE as CHAIN_RULE
    from .conv_chain import SQUEEZED_MEANS
    from .conv_fusion import NHWC_RULE, RULE

    return [RULE, NHWC_RULE, SQUEEZED_MEANS, CHAIN_RULE]


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="cpu", version=__version__, api_version=API_VERSION,
                       description="NumPy + BLAS kernels on the host CPU", vendor="RLX")


def _caps() -> DeviceCaps:
    # Defaults for a small x86/ARM host with AVX2/AVX-512 or NEON; `rlx calibrate cpu` replaces them.
    # Measured 2026-12-02 (2-core EPYC, `python -m rlx_core.costmodel_check cpu`): the demo MLP's f32
    # GEMMs reach ~80 GFLOP/s a core and its 400 KB of weights stream from cache at ~25 GB/s, so the
    # earlier 30 GFLOP/s and 10 GB/s over-estimated small batches by more than 3x.
    cores = os.cpu_count() or 1
    return DeviceCaps(peak_flops={"f32": 6.0e10 * cores, "f64": 3.0e10 * cores, "default": 2e9 * cores},
                      mem_bandwidth=2.5e10, launch_overhead=2e-6, host_link_bandwidth=None)


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    return [DeviceInfo(backend="cpu", name="cpu:0", available=True, caps=_caps(), host_memory=True,
                       reuse_distance=_reuse_distance(),
                       details={"machine": platform.machine(), "processor": platform.processor() or "?",
                                "cores": str(os.cpu_count()), "threads": str(_pool_threads()),
                                "threads_from": _threads_from(), "dispatch": _dispatch(),
                                "stem_conv": _stem_conv(), "winograd": _winograd()})]


def _dispatch() -> str:
    from .native import why_not

    why = why_not()
    return "compiled (rlx_cpu._dispatch)" if why is None else f"Python loop: {why}"


def _stem_conv() -> str:
    from .stem_conv import why_not

    why = why_not()
    return "rlx_cpu._stemconv (AVX-512)" if why is None else f"oneDNN: {why}"


def _winograd() -> str:
    from .winograd import why_not

    why = why_not()
    return "rlx_cpu._winograd (AVX-512)" if why is None else f"oneDNN: {why}"


def _threads_from() -> str:
    return settings.THREADS.name if settings.THREADS.source() == "env" else "cores available to this process"


@hookimpl
def rlx_settings() -> list[Setting]:
    return list(settings.SETTINGS)


def _reuse_distance() -> int:
    """Row chains (``rlx_cpu.parallel.chain``) run a thread's rows of kernel i+1 while another
    thread is still on kernel i; a buffer reused right after its last read forces a barrier there.
    ``python bench/profile_cpu.py minilm --batch 32 --chains``: 8 steps take MiniLM's one chain from
    60 to 22 barriers for 107 instead of 57 MB of arena.
    ``RLX_CPU_REUSE_DISTANCE=0`` plans memory as tightly as possible."""
    distance: int = settings.REUSE_DISTANCE.get()
    return distance


def _pool_threads() -> int | str:
    from .parallel import default_threads  # stdlib only: discovery stays fast

    try:
        return default_threads()
    except ValueError as e:  # a bad RLX_CPU_THREADS is reported here, and raised when compiling
        return f"invalid ({e})"


def _int_div_pred(v: Any) -> str | None:
    return None if v.in_types[0].dtype.is_int else "integer division only"


def _float_div_pred(v: Any) -> str | None:
    return "integer division uses cpu.div_int" if v.in_types[0].dtype.is_int else None


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    claims = []
    for op in sorted(factories_ops()):
        schema = REGISTRY.get(op)
        dts = frozenset(schema.dtypes)
        if op not in EXACT:
            dts = dts - HALF
        if op == "cast":
            claims.append(KernelClaim(op, "cpu.cast", dtypes=frozenset(DType), in_place=False))
            continue
        if op == "div":
            claims.append(KernelClaim(op, "cpu.div_int", dtypes=dts, predicate=_int_div_pred,
                                      constraint="integer operands (truncating division)"))
            claims.append(KernelClaim(op, "cpu.div", dtypes=dts, predicate=_float_div_pred,
                                      in_place=True))
            continue
        in_dts = dts
        if op in ("gather", "scatter_add"):
            in_dts = dts | {DType.I32, DType.I64}
        if op == "where":
            in_dts = dts | {DType.BOOL}
        claims.append(KernelClaim(op, f"cpu.{op}", dtypes=in_dts, in_place=op in IN_PLACE,
                                  out_dtypes=dts if op in ("gather", "scatter_add", "where") else None))
    claims.append(KernelClaim("fused_elementwise", "cpu.fused_elementwise", predicate=_fused_pred,
                              constraint="f32/f64/i32/i64/bool programs (Numba for large tensors)"))
    # Model-level ops run natively (fewer passes than their decompositions) for f32/f64.
    f = frozenset({DType.F32, DType.F64})
    claims += [KernelClaim("linear", "cpu.linear", dtypes=f),
               KernelClaim("softmax", "cpu.softmax", dtypes=f),
               KernelClaim("log_softmax", "cpu.log_softmax", dtypes=f),
               KernelClaim("layer_norm", "cpu.layer_norm", dtypes=f),
               KernelClaim("rms_norm", "cpu.rms_norm", dtypes=f),
               KernelClaim("conv2d_bias", "cpu.conv2d_bias", dtypes=f),
               KernelClaim("rlx_cpu.conv2d_bias_relu", "cpu.rlx_cpu.conv2d_bias_relu", dtypes=f),
               KernelClaim("rlx_cpu.conv2d_bias_add_relu", "cpu.rlx_cpu.conv2d_bias_add_relu", dtypes=f),
               KernelClaim("rlx_cpu.conv2d_bias_silu", "cpu.rlx_cpu.conv2d_bias_silu", dtypes=f),
               KernelClaim("rlx_cpu.conv2d_bias_hardswish", "cpu.rlx_cpu.conv2d_bias_hardswish", dtypes=f),
               KernelClaim("rlx_cpu.conv2d_bias_nhwc", "cpu.rlx_cpu.conv2d_bias_nhwc", dtypes=f),
               KernelClaim("max_pool2d", "cpu.max_pool2d", dtypes=f),
               KernelClaim("rlx_cpu.conv_chain", "cpu.rlx_cpu.conv_chain", dtypes=frozenset({DType.F32})),
               KernelClaim("attention", "cpu.attention", dtypes=f | {DType.BOOL, DType.I32, DType.I64},
                           out_dtypes=f, predicate=_attention_pred,
                           constraint="(B,H,S,D) with mask none/causal/padding/bias")]
    # The indexing HIR ops natively: their core decompositions are dense (O(n^2) for top-k).
    real = frozenset({DType.F32, DType.F64, DType.I8, DType.I16, DType.I32, DType.I64, DType.U8})
    uints = frozenset({DType.U16, DType.U32, DType.U64})
    claims += [KernelClaim("scatter_reduce", "cpu.scatter_reduce", dtypes=real, out_dtypes=real),
               KernelClaim("topk_indices", "cpu.topk_indices", dtypes=real | uints,
                           out_dtypes=frozenset({DType.I64}))]
    from .linalg import claims as linalg_claims

    claims += linalg_claims()
    from .bounded import claims as bounded_claims

    claims += bounded_claims()
    from .recurrent import claims as recurrent_claims

    claims += recurrent_claims()
    return claims


def _attention_pred(v: Any) -> str | None:
    from .hir_kernels import attention_supported

    if not v.in_types[0].dtype.is_float:
        return "queries must be f32/f64"
    return attention_supported(v)


def _fused_factory(ins: Any, outs: Any, attrs: Any) -> Any:
    from .fused import k_fused

    return k_fused(ins, outs, attrs)


def _fused_pred(v: Any) -> str | None:
    from .fused import supported

    return supported([t.dtype for t in v.in_types], v.out_types[0].dtype, v.attrs["program"])


def factories_ops() -> list[str]:
    from . import bounded, linalg  # claimed in their own claims() (index operands, i64 outputs)

    return [name[4:] for name in factories()
            if name not in ("cpu.div_int", "cpu.fused_elementwise") and name not in linalg.FACTORIES
            and name not in bounded.FACTORIES
            and REGISTRY.get(name[4:]).level == "mir"]


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    from .program import CpuProgram

    return CpuProgram(program, factories())
