"""rlx-metal's ``RLX_*`` settings, declared once (``rlx doctor --settings`` lists them; the plugin's
``rlx_settings`` hook returns :data:`SETTINGS`). Imports nothing heavy."""

from __future__ import annotations

from rlx_core.plugin import Setting, declare_setting

OWNER = "rlx-metal"

MODE = declare_setting(
    "RLX_METAL_MODE", "choice", "auto",
    "auto: the Apple GPU where metalcompute runs on macOS, else MSL compiled as C++ on the host; "
    "host: always the host.", owner=OWNER, choices=("auto", "host"))
CXX = declare_setting("RLX_METAL_CXX", "str", None, "The C++ compiler for the MSL-on-host mode.", owner=OWNER,
                      default_text="clang++, else g++")

SETTINGS: list[Setting] = [MODE, CXX]
