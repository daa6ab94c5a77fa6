"""rlx-mlx's ``RLX_*`` settings, declared once (``rlx doctor --settings`` lists them; the plugin's
``rlx_settings`` hook returns :data:`SETTINGS`). Imports nothing heavy."""

from __future__ import annotations

from rlx_core.plugin import Setting, declare_setting

OWNER = "rlx-mlx"

DEVICE = declare_setting(
    "RLX_MLX_DEVICE", "choice", "auto",
    "Which MLX device is mlx:0. auto: the Metal GPU where MLX has one (Apple silicon), else the "
    "CPU; cpu / gpu force one.", owner=OWNER, choices=("auto", "cpu", "gpu"))
COMPILE = declare_setting(
    "RLX_MLX_COMPILE", "choice", "auto",
    "Trace each program once with mx.compile (MLX fuses elementwise chains). auto: on the GPU only; "
    "on MLX's CPU device fusion builds each fused kernel with the system C++ compiler into a shared "
    "temporary directory (<tmp>/mlx) and dlopens it, which is slow on first use and trusts that "
    "directory; on / off force it.", owner=OWNER, choices=("auto", "on", "off"))

SETTINGS: list[Setting] = [DEVICE, COMPILE]
