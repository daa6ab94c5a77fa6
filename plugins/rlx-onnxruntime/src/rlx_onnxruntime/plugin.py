"""rlx-onnxruntime hook implementations: identity, the device, claims, compile.

One device, ``onnxruntime:0``, runs the configured provider list (``RLX_ONNXRUNTIME_PROVIDERS``,
like ``InferenceSession(providers=[...])``). Claims are per provider and per node variant: for each
listed provider, in order, a claim ``onnxruntime.<provider>.<op>`` accepts a variant only when the
translation honours it exactly and that provider alone (no CPU fallback) builds and runs its ONNX
node(s), which is checked by doing it once (:func:`rlx_onnxruntime.session.probe`). The dispatch
report therefore names the provider of every node; what no provider claims goes to the dispatch
contract (decomposition, rewrite, or a DispatchError), never silently elsewhere.

Nothing heavy is imported here: onnxruntime and onnx load when a device is probed or a program
compiled.
"""

from __future__ import annotations

import os
from typing import Any

from rlx_core import API_VERSION
from rlx_core.plugin import (
    BackendInfo,
    DeviceCaps,
    DeviceInfo,
    KernelClaim,
    NodeVariant,
    Setting,
    hookimpl,
)

from . import __version__

NAME = "onnxruntime"
DEVICE = f"{NAME}:0"

#: RLX ops with an ONNX translation (kept in step with translate.TRANSLATORS; a test checks it).
OPS = ("neg", "abs", "sign", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh",
       "sigmoid", "erf", "floor", "ceil", "round", "logical_not", "add", "sub", "mul", "div", "pow",
       "maximum", "minimum", "logical_and", "logical_or", "logical_xor", "equal", "not_equal",
       "less", "less_equal", "greater", "greater_equal", "where", "cast", "reduce_sum",
       "reduce_prod", "reduce_mean", "reduce_max", "reduce_min", "argmax", "argmin", "matmul",
       "reshape", "transpose", "expand", "slice", "concat", "pad", "gather", "scatter_add", "iota",
       "conv2d", "cumsum",
       # HIR ops ONNX has as one node (or a fixed short pattern ORT fuses): fewer, faster kernels
       "linear", "softmax", "log_softmax", "layer_norm", "gelu", "relu", "silu", "embedding")


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name=NAME, version=__version__, api_version=API_VERSION, vendor="RLX",
                       description="ONNX Runtime execution providers: each compiled program is one "
                                   "ONNX model in one InferenceSession", whole_program=True)


def _caps(provider_list: list[str]) -> DeviceCaps:
    cores = os.cpu_count() or 1
    if provider_list[0] == "CPUExecutionProvider":
        # MLAS GEMMs reach BLAS speed (~100 GFLOP/s a core with AVX-512: an MLP at batch 512 ran
        # 0.2x an estimate made with 30); per-node overhead is a few microseconds.
        return DeviceCaps(peak_flops={"f32": 1.0e11 * cores, "f64": 5.0e10 * cores,
                                      "default": 2e9 * cores},
                          mem_bandwidth=1.0e10, launch_overhead=5e-6, host_link_bandwidth=None,
                          source="plugin estimate (ONNX Runtime CPU provider)")
    return DeviceCaps(peak_flops={"f32": 2e13, "f16": 1e14, "default": 1e13}, mem_bandwidth=1e12,
                      launch_overhead=2e-5, host_link_bandwidth=2e10,
                      source=f"plugin estimate (ONNX Runtime {provider_list[0]})",
                      unreliable=f"{provider_list[0]}'s speed depends on the device behind it; run "
                                 "`rlx calibrate onnxruntime` to measure it")


def _unavailable(reason: str) -> DeviceInfo:
    rough = DeviceCaps(peak_flops={"default": 1e9}, mem_bandwidth=1e9, launch_overhead=1e-5,
                       source="no device")
    return DeviceInfo(NAME, DEVICE, False, rough, reason=reason)


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    try:
        from . import session
    except ImportError as e:
        return [_unavailable(f"onnxruntime is not importable ({e}); pip install onnxruntime onnx")]
    try:
        plist = session.providers()
    except Exception as e:  # a bad RLX_ONNXRUNTIME_PROVIDERS: reported, never raised here
        return [_unavailable(str(e))]
    import onnxruntime as ort

    return [DeviceInfo(NAME, DEVICE, True, _caps(plist), host_memory=True,
                       details={"providers": ", ".join(plist), "onnxruntime": ort.__version__,
                                "device": ort.get_device(),
                                "available": ", ".join(session.available())})]


def _providers_of(device: DeviceInfo) -> list[str]:
    text = device.details.get("providers", "") if device.details else ""
    return [p.strip() for p in text.split(",") if p.strip()]


def _probe_for(op: str, provider: str) -> Any:
    def pred(v: NodeVariant) -> str | None:
        from .session import probe

        return probe(op, v.in_types, v.out_types, v.attrs, provider)
    return pred


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    """One claim per (listed provider, op), providers in priority order."""
    from .session import short

    claims = []
    for provider in _providers_of(device):
        tag = short(provider)
        for op in OPS:
            claims.append(KernelClaim(op, f"{NAME}.{tag}.{op}", predicate=_probe_for(op, provider),
                                      constraint=f"translated to ONNX and run by {provider} "
                                                 "(checked once per dtype signature)"))
    return claims


@hookimpl
def rlx_compile(program: Any, device: DeviceInfo) -> Any:
    from . import session
    from .program import OrtProgram

    return OrtProgram(program, session.providers())


@hookimpl
def rlx_settings() -> list[Setting]:
    from .settings import SETTINGS

    return list(SETTINGS)
