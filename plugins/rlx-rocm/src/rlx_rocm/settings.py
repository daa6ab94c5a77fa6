"""rlx-rocm's ``RLX_*`` settings, declared once (``rlx doctor --settings`` lists them). Imports nothing
heavy."""

from __future__ import annotations

from rlx_core.plugin import Setting, declare_setting

OWNER = "rlx-rocm"

CLANG = declare_setting(
    "RLX_ROCM_CLANG", "str", "",
    "The clang that builds AMDGPU code objects offline (rlx export --target rocm, rlx rocm-compile-check). "
    "Unset: clang-19, else clang, on PATH.", owner=OWNER)

ARCH = declare_setting(
    "RLX_ROCM_ARCH", "str", "",
    "The offload arch hiprtc compiles for on a ROCm machine (e.g. gfx90a). Unset: the current device's.",
    owner=OWNER)

SETTINGS: list[Setting] = [CLANG, ARCH]
