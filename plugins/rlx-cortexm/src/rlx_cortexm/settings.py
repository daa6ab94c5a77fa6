"""rlx-cortexm's ``RLX_*`` settings, declared once (``rlx doctor --settings`` lists them; the plugin's
``rlx_settings`` hook returns :data:`SETTINGS`). Imports nothing heavy."""

from __future__ import annotations

from rlx_core.plugin import Setting, declare_setting

OWNER = "rlx-cortexm"

GCC = declare_setting("RLX_CORTEXM_GCC", "path", None, "The arm-none-eabi-gcc executable to build firmware.",
                      owner=OWNER, default_text="arm-none-eabi-gcc on PATH")
SIZE = declare_setting("RLX_CORTEXM_SIZE", "path", None, "The arm-none-eabi-size executable.", owner=OWNER,
                       default_text="arm-none-eabi-size on PATH")
QEMU = declare_setting("RLX_CORTEXM_QEMU", "path", None,
                       "The qemu-system-arm executable that runs the firmware.", owner=OWNER,
                       default_text="qemu-system-arm on PATH")
TIMEOUT = declare_setting("RLX_CORTEXM_TIMEOUT", "float", 300.0,
                          "Seconds one firmware run under QEMU may take.", owner=OWNER, min=1)

SETTINGS: list[Setting] = [GCC, SIZE, QEMU, TIMEOUT]
