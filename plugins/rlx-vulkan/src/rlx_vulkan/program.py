"""The Vulkan executable, on the device kit: the GLSL kernel library's program
(:class:`rlx_core.plugin.glsl.GlslProgram`: each LIR step lowered to dispatches, in the core) with
one arena buffer laid out by ``program.plan``, one constants buffer, one launch-parameter ("meta")
buffer, and one command buffer recording every dispatch of the program (a compute->compute memory
barrier after each), replayed per run. The kit copies inputs into the arena mapping, replays, copies
outputs out; this module is the Vulkan runtime shim."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import KitProgram, Launch, Program, Replay, glsl

from .vk import context


class VkAllocator:
    """Host-visible, coherent, persistently mapped buffers (:class:`rlx_vulkan.vk.Buffer`)."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def alloc(self, nbytes: int) -> Any:
        return self.ctx.buffer(nbytes)

    def copyin(self, buf: Any, offset: int, data: np.ndarray) -> None:
        buf.write(offset, data)

    def copyout(self, buf: Any, offset: int, nbytes: int) -> np.ndarray:
        return buf.read(offset, nbytes)


class VkRuntime:
    """A pipeline per shader; every launch of a program recorded once into one command buffer
    (storage buffers 0/1/2: arena, constants, launch parameters; each dispatch's parameter base as
    a push constant) and replayed by one submit per run."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def load(self, sources: Sequence[str]) -> Mapping[str, Any]:
        return {src: self.ctx.pipeline(src) for src in dict.fromkeys(sources)}

    def bind(self, prog: KitProgram) -> Callable[[], None]:
        assert isinstance(prog, VulkanProgram)
        ctx = self.ctx
        vk = ctx.vk
        launches = prog.all_launches()
        meta, bases = glsl.meta_block(launches)
        prog.metabuf = ctx.buffer(meta.nbytes)
        prog.metabuf.write(0, meta)
        prog.dpool = vk.vkCreateDescriptorPool(ctx.device, vk.VkDescriptorPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, maxSets=1, poolSizeCount=1,
            pPoolSizes=[vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                descriptorCount=3)]),
            None)
        prog.dset = vk.vkAllocateDescriptorSets(ctx.device, vk.VkDescriptorSetAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, descriptorPool=prog.dpool,
            descriptorSetCount=1, pSetLayouts=[ctx.set_layout]))[0]
        writes = [vk.VkWriteDescriptorSet(
            sType=vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, dstSet=prog.dset, dstBinding=i,
            dstArrayElement=0,
            descriptorCount=1, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=b.buf, offset=0, range=b.nbytes)])
            for i, b in enumerate((prog.arena, prog.constant_buf, prog.metabuf))]
        vk.vkUpdateDescriptorSets(ctx.device, len(writes), writes, 0, None)
        if not launches:
            return lambda: None
        replay = Replay(None, lambda: self._record(prog, launches, bases), warmup=0)
        replay.capture_now()  # recorded at compile time: a run only submits
        return replay

    def _record(self, prog: VulkanProgram, launches: list[Launch], bases: list[int]) -> Callable[[], None]:
        ctx = self.ctx
        vk = ctx.vk
        cb = vk.vkAllocateCommandBuffers(ctx.device, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=ctx.pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
        barrier = vk.VkMemoryBarrier(sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                     srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
                                     dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT
                                     | vk.VK_ACCESS_SHADER_WRITE_BIT)
        vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, ctx.layout, 0, 1, [prog.dset], 0,
                                   None)
        for i, (ln, base) in enumerate(zip(launches, bases)):
            vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, prog.functions[ln.source])
            vk.vkCmdPushConstants(cb, ctx.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, 4,
                                  vk.ffi.new("int32_t[1]", [base]))
            vk.vkCmdDispatch(cb, *ln.grid)
            if i + 1 < len(launches):
                vk.vkCmdPipelineBarrier(cb, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                                        vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, [barrier], 0, None, 0,
                                        None)
        vk.vkEndCommandBuffer(cb)
        prog.cb = cb
        return lambda: ctx.submit(cb)


class VulkanProgram(glsl.GlslProgram):
    """The GLSL kernel library's program (lowering in the core) on this runtime."""

    def __init__(self, program: Program) -> None:
        self.ctx = ctx = context()
        self.cb: Any = None
        self.dpool: Any = None
        self.dset: Any = None
        self.metabuf: Any = None
        super().__init__(program, VkAllocator(ctx), VkRuntime(ctx), glsl.VULKAN, prefix="vulkan.",
                         cpu_device=ctx.cpu_device, max_groups=ctx.max_groups)

    def __del__(self) -> None:
        try:
            vk, dev = self.ctx.vk, self.ctx.device
            if self.cb is not None:
                vk.vkFreeCommandBuffers(dev, self.ctx.pool, 1, [self.cb])
            if self.dpool is not None:
                vk.vkDestroyDescriptorPool(dev, self.dpool, None)
        except Exception:
            pass
