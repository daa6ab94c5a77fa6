"""rlx-webgpu's ``RLX_*`` settings, declared once (``rlx doctor --settings`` lists them; the plugin's
``rlx_settings`` hook returns :data:`SETTINGS`). Imports nothing heavy."""

from __future__ import annotations

from rlx_core.plugin import Setting, declare_setting

OWNER = "rlx-webgpu"

TILED = declare_setting(
    "RLX_WEBGPU_TILED", "bool", False,
    "Use the tiled (workgroup-memory) matmul on a CPU WebGPU adapter too, e.g. to test it on lavapipe.",
    owner=OWNER)

SETTINGS: list[Setting] = [TILED]
