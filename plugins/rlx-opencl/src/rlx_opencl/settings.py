"""rlx-opencl's ``RLX_*`` settings, declared once (``rlx doctor --settings`` lists them; the plugin's
``rlx_settings`` hook returns :data:`SETTINGS`). Imports nothing heavy."""

from __future__ import annotations

from rlx_core.plugin import Setting, declare_setting

OWNER = "rlx-opencl"

DEVICE = declare_setting(
    "RLX_OPENCL_DEVICE", "str", "",
    "Which OpenCL device is opencl:0: a substring of 'platform / device' (case-insensitive), e.g. "
    "'nvidia' or 'pocl'. Unset: the first GPU, else the first device.", owner=OWNER)

SETTINGS: list[Setting] = [DEVICE]
