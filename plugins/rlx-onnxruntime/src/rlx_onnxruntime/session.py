"""ONNX Runtime itself: the provider list, session options, the session cache and claim probes.

Imported only when the backend is used (probing devices, claiming, compiling): it imports
onnxruntime and onnx.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from rlx_core.plugin import SettingError, TensorType

from . import settings
from .translate import OnnxGraph, Untranslatable, host_input, model, translate

#: The CPU fallback ONNX Runtime appends to every provider list; used only when the user lists it.
CPU = "CPUExecutionProvider"
_LEVELS = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
           "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
           "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
           "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


def available() -> list[str]:
    return list(ort.get_available_providers())


def providers() -> list[str]:
    """The configured providers, checked against this onnxruntime build (a SettingError naming the
    available ones otherwise)."""
    wanted: list[str] = settings.PROVIDERS.get()
    have = available()
    where = f"{settings.PROVIDERS.name} (onnxruntime {ort.__version__})"
    if not wanted:
        raise SettingError(f"{settings.PROVIDERS.name} lists no execution provider", where=where,
                           fix=f"list one or more of: {', '.join(have)}")
    bad = [p for p in wanted if p not in have]
    if bad:
        raise SettingError(
            f"execution provider(s) {', '.join(repr(p) for p in bad)} not available in this "
            f"onnxruntime build; available: {', '.join(have)}", where=where,
            fix=f"set {settings.PROVIDERS.name} to some of: {', '.join(have)} (a GPU provider needs "
                "its own wheel, e.g. pip install onnxruntime-gpu instead of onnxruntime)")
    if len(set(wanted)) != len(wanted):
        raise SettingError(f"{settings.PROVIDERS.name} lists a provider twice: {wanted}", where=where,
                           fix="list each provider once, in priority order")
    return wanted


def short(provider: str) -> str:
    """``CUDAExecutionProvider`` -> ``cuda``: the provider's part of kernel names."""
    base = provider[:-len("ExecutionProvider")] if provider.endswith("ExecutionProvider") else provider
    return "".join(c for c in base.lower() if c.isalnum()) or "ep"


def options(*, level: str | None = None, threads: int | None = None,
            only: str | None = None) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = _LEVELS[level or settings.OPT_LEVEL.get()]
    so.intra_op_num_threads = settings.THREADS.get() if threads is None else threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if settings.SPIN.get() else "0")
    so.log_severity_level = 4  # failures reach the caller as exceptions; ORT logging them too is noise
    if only is not None and only != CPU:
        # Nodes the provider cannot run would silently land on ONNX Runtime's implicit CPU
        # provider; this makes that an error instead.
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return so


# -- the session cache --------------------------------------------------------------------------

_SESSIONS: OrderedDict[str, ort.InferenceSession] = OrderedDict()
_LOCK = threading.Lock()


def session(model_bytes: bytes, provider_list: Sequence[str]) -> tuple[ort.InferenceSession, bool]:
    """An InferenceSession for the model on the providers, and whether it came from the cache.

    Keyed by the model bytes (weights included), providers and options, so a program compiled again
    (the same shape specialisation) reuses its session instead of re-optimising the graph."""
    level, threads = settings.OPT_LEVEL.get(), settings.THREADS.get()
    h = hashlib.sha256(model_bytes)
    h.update(repr((tuple(provider_list), level, threads)).encode())
    key = h.hexdigest()
    keep = settings.SESSION_CACHE.get()
    with _LOCK:
        hit = _SESSIONS.get(key) if keep else None  # 0: no cache, not even earlier entries
        if hit is not None:
            _SESSIONS.move_to_end(key)
            return hit, True
    sess = ort.InferenceSession(model_bytes, options(level=level, threads=threads),
                                providers=list(provider_list))
    if keep:
        with _LOCK:
            _SESSIONS[key] = sess
            while len(_SESSIONS) > keep:
                _SESSIONS.popitem(last=False)
    return sess, False


def clear_sessions() -> None:
    with _LOCK:
        _SESSIONS.clear()


# -- claim probes -------------------------------------------------------------------------------

_PROBES: dict[tuple[Any, ...], str | None] = {}


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


def probe(op: str, in_types: Sequence[TensorType], out_types: Sequence[TensorType],
          attrs: Mapping[str, Any], provider: str) -> str | None:
    """None when ``provider`` runs this variant's translation, else why not.

    Verified, not assumed: the one-node ONNX model is built, a session is created on that provider
    alone (CPU fallback disabled) and run once on zeros. Memoised per provider, ONNX node types and
    dtypes (what ONNX Runtime's kernel choice depends on)."""
    g = OnnxGraph()
    ins = [f"x{i}" for i in range(len(in_types))]
    outs = [f"y{i}" for i in range(len(out_types))]
    try:
        translate(g, op, ins, outs, in_types, out_types, attrs)
    except Untranslatable as e:
        return str(e)
    key = (provider, op, tuple(t.dtype for t in in_types), tuple(t.dtype for t in out_types),
           tuple((n.op_type, tuple(a.i for a in n.attribute if a.name == "to")) for n in g.nodes))
    if key in _PROBES:
        return _PROBES[key]
    try:
        m = model(g, list(zip(ins, in_types)), list(zip(outs, out_types)))
        sess = ort.InferenceSession(m.SerializeToString(), options(level="disable", threads=1,
                                                                   only=provider),
                                    providers=[provider])
    except Exception as e:
        why: str | None = f"{provider} has no kernel for it ({_first_line(e)})"
    else:
        why = None
        # Run it once (some kernels check their type only when run), on zeros; an empty input
        # would run nothing, and a large one would cost more than the check is worth.
        sizes = [int(np.prod([int(d) for d in t.shape])) for t in in_types]
        if 0 < min(sizes, default=1) and sum(sizes) <= 1 << 16:
            feeds = {n: host_input(np.zeros(tuple(int(d) for d in t.shape), t.dtype.np), t)
                     for n, t in zip(ins, in_types)}
            try:
                sess.run_with_ort_values([o.name for o in sess.get_outputs()], feeds)
            except Exception as e:
                why = f"{provider} failed running it ({_first_line(e)})"
    _PROBES[key] = why
    return why
