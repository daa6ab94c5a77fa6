"""rlx-vulkan's ``RLX_*`` settings, declared once (``rlx doctor --settings`` lists them; the plugin's
``rlx_settings`` hook returns :data:`SETTINGS`). Imports nothing heavy."""

from __future__ import annotations

from rlx_core.plugin import Setting, declare_setting

OWNER = "rlx-vulkan"

TILED = declare_setting(
    "RLX_VULKAN_TILED", "bool", False,
    "Use the tiled (GPU) kernels on a CPU Vulkan device too, e.g. to test them on lavapipe.", owner=OWNER)

SETTINGS: list[Setting] = [TILED]
