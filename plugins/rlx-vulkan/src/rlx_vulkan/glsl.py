"""The device kit's GLSL kernel library (:mod:`rlx_core.plugin.glsl`) in its Vulkan flavour
(``#version 450``, descriptor set 0, the dispatch's parameter base as a push constant).

The templates, the lowering and the claims live in the core, shared with rlx-opengl; this module
keeps the names rlx-vulkan's callers use.
"""

from __future__ import annotations

from rlx_core.plugin import DType, glsl

FLAVOUR = glsl.VULKAN
WG = glsl.WG
#: the shared GLSL dialect with the library's helpers, and its i64 variant
GLSL = glsl.GLSL
GLSL64 = glsl.GLSL64


def header(wx: int = WG, wy: int = 1, extra: str = "") -> str:
    return glsl.header(FLAVOUR, wx, wy, extra)


def elementwise(program: str, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str:
    return glsl.elementwise(FLAVOUR, program, in_dtypes, out_dtype)
