"""The DirectX-dialect executable: the device kit's HLSL library (:class:`rlx_core.plugin.hlsl.HlslProgram`,
lowering in the core) on the kit's Vulkan runtime (:mod:`rlx_core.plugin.vulkan`: arena, constants
and launch-parameter buffers, one command buffer recorded once and replayed per run), with SPIR-V
from glslang's HLSL front end. There is no D3D12 runtime here; this module puts the pieces together."""

from __future__ import annotations

from typing import Any

from rlx_core.plugin import Program, glsl, hlsl
from rlx_core.plugin import vulkan as kit

#: HLSL -> SPIR-V: glslang's HLSL front end (-D), entry point main, Vulkan 1.1 environment
SPIRV = kit.SpirvCompiler(
    "hlsl", "directx-spirv", "rlx-directx SPIR-V shaders (compiled from HLSL)",
    ("-D", "-V", "--target-env", "vulkan1.1", "-e", "main", "-S", "comp"), src_suffix=".hlsl",
    where="rlx-directx shader compilation (HLSL -> SPIR-V)",
    fix="apt-get install glslang-tools, or pip install rlx-directx[glslang]")


def context() -> Any:
    """The kit's process-wide Vulkan context; raises RuntimeError (with the cause) without a device."""
    return kit.context()


class DirectxProgram(hlsl.HlslProgram):
    """The HLSL library's program on the kit's Vulkan runtime."""

    def __init__(self, program: Program) -> None:
        self.ctx = ctx = context()
        super().__init__(program, kit.VkAllocator(ctx), kit.VkRuntime(ctx, SPIRV, glsl.meta_block),
                         prefix="directx.", cpu_device=bool(ctx.is_cpu), max_groups=ctx.max_groups)
