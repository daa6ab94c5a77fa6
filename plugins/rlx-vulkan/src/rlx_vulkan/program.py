"""The Vulkan executable, on the device kit: the GLSL kernel library's program
(:class:`rlx_core.plugin.glsl.GlslProgram`: each LIR step lowered to dispatches, in the core) whose
arena, constants and launch parameters live in device-local memory, with each run's inputs and
outputs copied through a host staging buffer by the program's one command buffer
(:mod:`rlx_vulkan.device`). ``RLX_VULKAN_MEMORY=host`` runs the kit's host-visible runtime instead
(:mod:`rlx_core.plugin.vulkan`, shared with rlx-directx). On a GPU, matmul/linear run the
register-blocked tiled GEMM and softmax/layer_norm one workgroup per row (``RLX_VULKAN_GEMM``)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rlx_core.plugin import Allocator, Program, Runtime, glsl
from rlx_core.plugin import vulkan as kit

from .device import Bound, DeviceAllocator, DeviceRuntime
from .vk import SPIRV, context, cpu_device


class VulkanProgram(glsl.GlslProgram):
    """The GLSL kernel library's program (lowering in the core) on this runtime."""

    def __init__(self, program: Program) -> None:
        from .settings import EPILOGUES, GEMM, MEMORY, PROFILE

        self.ctx = ctx = context()
        gemm = str(GEMM.get())
        #: "device" (device-local memory + staged I/O) or "host" (the kit's mapped buffers)
        self.memory = str(MEMORY.get())
        alloc: Allocator
        runtime: Runtime
        if self.memory == "device":
            dev = DeviceAllocator(ctx)
            alloc = dev
            runtime = DeviceRuntime(ctx, SPIRV, dev, glsl.meta_block, per_dispatch=bool(PROFILE.get()))
        else:
            alloc, runtime = kit.VkAllocator(ctx), kit.VkRuntime(ctx, SPIRV, glsl.meta_block)
        super().__init__(program, alloc, runtime, glsl.VULKAN, prefix="vulkan.",
                         cpu_device=cpu_device(ctx), max_groups=ctx.max_groups, gpu_kernels=gemm != "basic",
                         gemm_tile="auto" if gemm == "basic" else gemm, epilogues=bool(EPILOGUES.get()))

    # -- staged I/O (device memory): the command buffer copies between the staging buffer and arena
    def _bound(self) -> Bound | None:
        st = getattr(self, "vk_bound", None)
        return st if isinstance(st, Bound) else None

    def copy_in(self, inputs: Mapping[str, np.ndarray]) -> None:
        st = self._bound()
        if st is None:
            super().copy_in(inputs)
            return
        assert st.io is not None
        for name in self.uploads:
            pos = st.slots.get("in:" + name)
            if pos is not None:
                b = glsl_bytes(inputs[name], self.types[name].dtype.np)
                st.io.host[pos:pos + b.size] = b

    def copy_out(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        st = self._bound()
        if st is None:
            return super().copy_out(inputs)
        assert st.io is not None
        out = {}
        g = self.program.graph
        for value in self.downloads:
            t = self.types[value]
            shape = self.shape(value)
            pos = st.slots.get("out:" + value)
            if value in g.weights:
                out[value] = np.asarray(g.weights[value], t.dtype.np).reshape(shape).copy()
            elif pos is not None:
                raw = st.io.host[pos:pos + t.nbytes()].copy()
                out[value] = raw.view(t.dtype.np).reshape(shape)
            elif value in self.program.plan.offsets:  # an empty tensor
                out[value] = np.zeros(shape, t.dtype.np)
            else:
                out[value] = np.array(inputs[value], copy=True)
        return out

    def gpu_seconds(self) -> float | None:
        """The last run's time on the device between the first and the last dispatch (copies
        excluded), from timestamp queries; None where the queue has no timestamps or memory is host."""
        st = self._bound()
        return None if st is None else st.gpu_seconds()

    def dispatch_times(self) -> list[tuple[str, str, float]] | None:
        """The last run's device time of each dispatch as (graph node, claim name, seconds), in
        order; None unless compiled with ``RLX_VULKAN_PROFILE=1`` (device memory) on a queue with
        timestamps."""
        st = self._bound()
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


def glsl_bytes(a: object, dt: np.dtype) -> np.ndarray:
    """A host array as the contiguous bytes the device holds for dtype ``dt``."""
    return np.ascontiguousarray(np.asarray(a, dtype=dt)).reshape(-1).view(np.uint8)
