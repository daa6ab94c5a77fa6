"""rlx-oneapi's ``RLX_*`` settings, declared once (``rlx doctor --settings`` lists them). Imports
nothing heavy."""

from __future__ import annotations

from rlx_core.plugin import Setting, declare_setting

OWNER = "rlx-oneapi"

THREADS = declare_setting(
    "RLX_ONEAPI_THREADS", "int", 0,
    "Threads OpenVINO's CPU plugin may use per compiled program (0: OpenVINO's choice).",
    owner=OWNER, min=0)

SETTINGS: list[Setting] = [THREADS]
