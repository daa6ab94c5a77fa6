"""rlx-onnxruntime's ``RLX_*`` settings, declared once (``rlx doctor --settings`` lists them; the
plugin's ``rlx_settings`` hook returns :data:`SETTINGS`). Imports nothing heavy: checking a provider
name against the installed ONNX Runtime happens in :mod:`rlx_onnxruntime.session`."""

from __future__ import annotations

from rlx_core.plugin import Setting, declare_setting

OWNER = "rlx-onnxruntime"

PROVIDERS = declare_setting(
    "RLX_ONNXRUNTIME_PROVIDERS", "list", ["CPUExecutionProvider"],
    "ONNX Runtime execution providers, in priority order, as InferenceSession(providers=[...]), "
    "e.g. 'CUDAExecutionProvider,CPUExecutionProvider'. A node is claimed for the first provider "
    "that has a kernel for it; CPU is used only when listed.", owner=OWNER,
    default_text="CPUExecutionProvider")

THREADS = declare_setting(
    "RLX_ONNXRUNTIME_THREADS", "int", 0,
    "Intra-op threads of each ONNX Runtime session (SessionOptions.intra_op_num_threads); "
    "0 lets ONNX Runtime pick (one per physical core).", owner=OWNER, min=0)

OPT_LEVEL = declare_setting(
    "RLX_ONNXRUNTIME_OPT_LEVEL", "choice", "extended",
    "ONNX Runtime graph optimization level of compiled programs: disable, basic (constant "
    "folding, redundant nodes), extended (plus fusions such as LayerNorm, GELU, MatMul+Add) or "
    "all (plus layout changes).", owner=OWNER, choices=("disable", "basic", "extended", "all"))

SPIN = declare_setting(
    "RLX_ONNXRUNTIME_SPIN", "bool", False,
    "Let ONNX Runtime's idle intra-op threads spin (session.intra_op.allow_spinning): lower latency "
    "on a dedicated machine, but on a shared or busy one spinning threads steal the cores the work "
    "needs.", owner=OWNER)

SESSION_CACHE = declare_setting(
    "RLX_ONNXRUNTIME_SESSION_CACHE", "int", 64,
    "How many InferenceSessions this process keeps, keyed by the exact ONNX model and options, so "
    "recompiling a program (or one shape specialisation) reuses its session; 0 keeps none.",
    owner=OWNER, min=0)

SETTINGS: list[Setting] = [PROVIDERS, THREADS, OPT_LEVEL, SPIN, SESSION_CACHE]
