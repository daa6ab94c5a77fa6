"""The Vulkan executable, on the device kit: the GLSL kernel library's program
(:class:`rlx_core.plugin.glsl.GlslProgram`: each LIR step lowered to dispatches, in the core) on the
kit's Vulkan runtime (:mod:`rlx_core.plugin.vulkan`, shared with rlx-directx). ``RLX_VULKAN_MEMORY``
picks the kit's memory kind: ``device`` (the default: arena, constants and launch parameters in
device-local memory, each run's inputs and outputs copied through a host staging buffer by the
program's one command buffer, timestamps around the dispatches) or ``host`` (host-visible mapped
buffers, no timestamps). On a GPU, matmul/linear run the register-blocked tiled GEMM and
softmax/layer_norm one workgroup per row (``RLX_VULKAN_GEMM``)."""

from __future__ import annotations

from rlx_core.plugin import Program, glsl
from rlx_core.plugin import vulkan as kit

from .vk import SPIRV, context, cpu_device


class VulkanProgram(glsl.GlslProgram):
    """The GLSL kernel library's program (lowering in the core) on this runtime."""

    def __init__(self, program: Program) -> None:
        from .settings import EPILOGUES, GEMM, MEMORY, PROFILE

        self.ctx = ctx = context()
        gemm = str(GEMM.get())
        #: "device" (device-local memory + staged I/O) or "host" (the kit's mapped buffers)
        self.memory = str(MEMORY.get())
        # host memory keeps its plain command buffer (no timestamps), as before device memory existed
        stamps = "off" if self.memory == kit.HOST else "dispatch" if PROFILE.get() else "run"
        super().__init__(program, kit.VkAllocator(ctx, self.memory),
                         kit.VkRuntime(ctx, SPIRV, glsl.meta_block, memory=self.memory, timestamps=stamps),
                         glsl.VULKAN, prefix="vulkan.", cpu_device=cpu_device(ctx), max_groups=ctx.max_groups,
                         gpu_kernels=gemm != "basic", gemm_tile="auto" if gemm == "basic" else gemm,
                         epilogues=bool(EPILOGUES.get()))

    def gpu_seconds(self) -> float | None:
        """The last run's time on the device between the first and the last dispatch (copies
        excluded), from timestamp queries; None where the queue has no timestamps or memory is host."""
        st = kit.bound(self)
        return None if st is None else st.gpu_seconds()

    def dispatch_times(self) -> list[tuple[str, str, float]] | None:
        """The last run's device time of each dispatch as (graph node, claim name, seconds), in
        order; None unless compiled with ``RLX_VULKAN_PROFILE=1`` (device memory) on a queue with
        timestamps."""
        st = kit.bound(self)
        per = None if st is None else st.dispatch_seconds()
        if per is None:
            return None
        steps = [(s.node, ln.kernel) for s, lns in self.launches for ln in lns if not ln.empty]
        return [(node, kernel, t) for (node, kernel), t in zip(steps, per)]

    def kernel_seconds(self) -> dict[str, float] | None:
        """:meth:`dispatch_times` summed per claim name (``vulkan.linear``, ``vulkan.attention``, ...)."""
        times = self.dispatch_times()
        if times is None:
            return None
        out: dict[str, float] = {}
        for _, kernel, t in times:
            out[kernel] = out.get(kernel, 0.0) + t
        return out
