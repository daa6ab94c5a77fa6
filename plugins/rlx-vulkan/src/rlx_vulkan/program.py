"""The Vulkan executable, on the device kit: the GLSL kernel library's program
(:class:`rlx_core.plugin.glsl.GlslProgram`: each LIR step lowered to dispatches, in the core) with
one arena buffer laid out by ``program.plan``, one constants buffer, one launch-parameter ("meta")
buffer, and one command buffer recording every dispatch of the program (a compute->compute memory
barrier after each), replayed per run: the kit's Vulkan runtime (:mod:`rlx_core.plugin.vulkan`,
shared with rlx-directx). The kit copies inputs into the arena mapping, replays, copies outputs
out; this module only puts the pieces together."""

from __future__ import annotations

from rlx_core.plugin import Program, glsl
from rlx_core.plugin import vulkan as kit

from .vk import SPIRV, context, cpu_device


class VulkanProgram(glsl.GlslProgram):
    """The GLSL kernel library's program (lowering in the core) on this runtime."""

    def __init__(self, program: Program) -> None:
        self.ctx = ctx = context()
        super().__init__(program, kit.VkAllocator(ctx), kit.VkRuntime(ctx, SPIRV, glsl.meta_block),
                         glsl.VULKAN, prefix="vulkan.", cpu_device=cpu_device(ctx), max_groups=ctx.max_groups)
