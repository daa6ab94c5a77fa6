"""rlx-hexagon's ``RLX_*`` settings, declared once (``rlx doctor --settings`` lists them)."""

from __future__ import annotations

from rlx_core.plugin import Setting, declare_setting

OWNER = "rlx-hexagon"

CLANG = declare_setting(
    "RLX_HEXAGON_CLANG", "str", "",
    "The clang that compiles the generated C for Hexagon (rlx export --target hexagon, rlx "
    "hexagon-compile-check). Unset: clang-19, else clang, on PATH.", owner=OWNER)

CPU = declare_setting(
    "RLX_HEXAGON_CPU", "str", "hexagonv73",
    "The Hexagon core the C is compiled for (-mcpu), with 128-byte HVX.", owner=OWNER)

SETTINGS: list[Setting] = [CLANG, CPU]
