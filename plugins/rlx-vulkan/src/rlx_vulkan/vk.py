"""rlx-vulkan's use of the device kit's Vulkan runtime (:mod:`rlx_core.plugin.vulkan`: context,
buffers, pipelines, command-buffer record + replay): its GLSL -> SPIR-V compiler (glslangValidator,
cached on disk and authenticated by the kit) and the one setting the kit does not decide,
``RLX_VULKAN_TILED``."""

from __future__ import annotations

from typing import Any

from rlx_core.plugin import vulkan as kit

glslang = kit.glslang

SPIRV = kit.SpirvCompiler(
    "glsl", "vulkan-spirv", "rlx-vulkan SPIR-V shaders", ("-V", "--target-env", "vulkan1.1", "-S", "comp"),
    src_suffix=".comp", where="rlx-vulkan shader compilation",
    fix="apt-get install glslang-tools, or pip install rlx-vulkan[glslang]")


def compile_glsl(src: str) -> bytes:
    """The SPIR-V of a GLSL compute shader (memoised, then the authenticated disk cache, then built)."""
    return SPIRV.compile(src)


def context() -> Any:
    """The kit's process-wide Vulkan context; raises RuntimeError (with the cause) without a device."""
    return kit.context()


def cpu_device(ctx: Any) -> bool:
    """Whether to run the untiled kernels: a software (CPU) device, unless RLX_VULKAN_TILED asks for the
    tiled ones there too."""
    from .settings import TILED

    return bool(ctx.is_cpu) and not bool(TILED.get())
