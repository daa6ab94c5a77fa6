"""rlx-opengl's ``RLX_*`` settings, declared once (``rlx doctor --settings`` lists them; the plugin's
``rlx_settings`` hook returns :data:`SETTINGS`). Imports nothing heavy."""

from __future__ import annotations

from rlx_core.plugin import Setting, declare_setting

OWNER = "rlx-opengl"

EGL_DEVICE = declare_setting(
    "RLX_OPENGL_EGL_DEVICE", "int", 0,
    "Which EGL device is opengl:0 (its index in eglQueryDevicesEXT's list; 0 is the first, e.g. the "
    "GPU when a driver such as NVIDIA's exposes one, else Mesa's llvmpipe).", owner=OWNER, min=0)

TILED = declare_setting(
    "RLX_OPENGL_TILED", "bool", False,
    "Use the tiled (GPU) kernels on a software OpenGL device (llvmpipe) too, e.g. to test them there.",
    owner=OWNER)

SETTINGS: list[Setting] = [EGL_DEVICE, TILED]
