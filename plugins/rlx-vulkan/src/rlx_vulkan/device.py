"""Device-local memory for rlx-vulkan: the arena, the constants and the launch parameters in
``DEVICE_LOCAL`` memory, and each run's inputs and outputs through one host staging buffer.

The kit's runtime (:mod:`rlx_core.plugin.vulkan`) maps everything host-visible, which on a discrete
GPU is system memory: every load of every shader then crosses PCIe (on the H200 a 4096^3 GEMM ran at
under 1 TFLOP/s that way). Here the program's command buffer is recorded once as

    copy staging -> arena (the inputs) | barrier | dispatches (a barrier between each) | barrier |
    copy arena -> staging (the outputs) | barrier to the host

so a run is: write the inputs into the staging mapping, one submit + fence wait, read the outputs
from it. The staging buffer is host-cached where the device offers it (reading write-combined memory
is slow on the host). Constants and launch parameters are uploaded once at bind time through a
temporary staging buffer. Software devices (lavapipe) run exactly the same path (their "device"
memory is host memory), so the CPU test suite covers it.

Two timestamps (written once everything before them has finished) bracket the dispatches when the
queue supports them: :meth:`Bound.gpu_seconds` is the last run's time on the device, copies excluded.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import KitProgram, Launch


def _mem_type(ctx: Any, bits: int, prefs: Sequence[tuple[int, int]]) -> int:
    """The first memory type allowed by ``bits`` matching a ``(required flags, forbidden flags)`` of
    ``prefs``, tried in order."""
    mp = ctx.mem_props
    for want, avoid in prefs:
        for i in range(mp.memoryTypeCount):
            flags = int(mp.memoryTypes[i].propertyFlags)
            if bits & (1 << i) and flags & want == want and not flags & avoid:
                return i
    raise RuntimeError(f"no Vulkan memory type fits (allowed types 0x{bits:x}, wanted {prefs})")


def _create(ctx: Any, nbytes: int, usage: int, prefs: Sequence[tuple[int, int]]) -> tuple[Any, Any]:
    """A buffer of ``usage`` bound to fresh memory of the first type of ``prefs`` (see :func:`_mem_type`)."""
    vk = ctx.vk
    buf = vk.vkCreateBuffer(ctx.device, vk.VkBufferCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, size=nbytes, usage=usage,
        sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
    req = vk.vkGetBufferMemoryRequirements(ctx.device, buf)
    mem = vk.vkAllocateMemory(ctx.device, vk.VkMemoryAllocateInfo(
        sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, allocationSize=req.size,
        memoryTypeIndex=_mem_type(ctx, req.memoryTypeBits, prefs)), None)
    vk.vkBindBufferMemory(ctx.device, buf, mem, 0)
    return buf, mem


class DeviceBuffer:
    """A storage buffer in device-local memory (not mapped: written by transfer commands)."""

    def __init__(self, ctx: Any, nbytes: int) -> None:
        vk = ctx.vk
        self.ctx, self.nbytes = ctx, max(int(nbytes), 16)
        #: (byte offset, bytes) written by :meth:`DeviceAllocator.copyin`, uploaded by the next flush
        self.pending: list[tuple[int, np.ndarray]] = []
        dl, hv = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
        # plain VRAM first: a device-local + host-visible type is the (often small) BAR window
        usage = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                 | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
        self.buf, self.mem = _create(ctx, self.nbytes, usage, [(dl, hv), (dl, 0), (0, 0)])

    def __del__(self) -> None:
        try:
            vk = self.ctx.vk
            vk.vkDestroyBuffer(self.ctx.device, self.buf, None)
            vk.vkFreeMemory(self.ctx.device, self.mem, None)
        except Exception:
            pass


class StagingBuffer:
    """A host-visible, coherent (host-cached where offered), persistently mapped transfer buffer."""

    def __init__(self, ctx: Any, nbytes: int) -> None:
        vk = ctx.vk
        self.ctx, self.nbytes = ctx, max(int(nbytes), 16)
        hv = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        self.buf, self.mem = _create(ctx, self.nbytes, vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                                     | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                                     [(hv | vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT, 0), (hv, 0)])
        ptr = vk.vkMapMemory(ctx.device, self.mem, 0, self.nbytes, 0)
        self.host = np.frombuffer(ptr, dtype=np.uint8, count=self.nbytes)

    def __del__(self) -> None:
        try:
            vk = self.ctx.vk
            vk.vkUnmapMemory(self.ctx.device, self.mem)
            vk.vkDestroyBuffer(self.ctx.device, self.buf, None)
            vk.vkFreeMemory(self.ctx.device, self.mem, None)
        except Exception:
            pass


def _one_shot(ctx: Any, record: Callable[[Any], None]) -> None:
    """Record ``record(cb)`` into a fresh command buffer, submit it, wait, free it."""
    vk = ctx.vk
    cb = vk.vkAllocateCommandBuffers(ctx.device, vk.VkCommandBufferAllocateInfo(
        sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=ctx.pool,
        level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
    try:
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
            flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        record(cb)
        vk.vkEndCommandBuffer(cb)
        ctx.submit(cb)
    finally:
        vk.vkFreeCommandBuffers(ctx.device, ctx.pool, 1, [cb])


def _regions(vk: Any, pairs: Sequence[tuple[int, int, int]]) -> list[Any]:
    return [vk.VkBufferCopy(srcOffset=s, dstOffset=d, size=n) for s, d, n in pairs]


def _bytes(data: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(data).reshape(-1).view(np.uint8)


class DeviceAllocator:
    """The kit :class:`~rlx_core.plugin.Allocator` over device-local buffers. ``copyin`` queues the
    bytes (the constants, at compile time) and :meth:`flush` uploads a buffer's queue in one transfer;
    ``copyout`` reads back through a temporary staging buffer. Per-run inputs and outputs do not come
    here: the program's command buffer copies them (see the module docstring)."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def alloc(self, nbytes: int) -> DeviceBuffer:
        return DeviceBuffer(self.ctx, nbytes)

    def copyin(self, buf: DeviceBuffer, offset: int, data: np.ndarray) -> None:
        b = _bytes(data)
        if b.size:
            buf.pending.append((int(offset), b.copy()))

    def flush(self, buf: DeviceBuffer) -> None:
        if not buf.pending:
            return
        total = sum(b.size for _, b in buf.pending)
        stage = StagingBuffer(self.ctx, total)
        pairs, pos = [], 0
        for off, b in buf.pending:
            stage.host[pos:pos + b.size] = b
            pairs.append((pos, off, b.size))
            pos += b.size
        vk = self.ctx.vk
        _one_shot(self.ctx, lambda cb: vk.vkCmdCopyBuffer(cb, stage.buf, buf.buf, len(pairs),
                                                          _regions(vk, pairs)))
        buf.pending.clear()

    def copyout(self, buf: DeviceBuffer, offset: int, nbytes: int) -> np.ndarray:
        self.flush(buf)
        if nbytes <= 0:
            return np.zeros(0, np.uint8)
        stage = StagingBuffer(self.ctx, nbytes)
        vk = self.ctx.vk
        _one_shot(self.ctx, lambda cb: vk.vkCmdCopyBuffer(cb, buf.buf, stage.buf, 1,
                                                          _regions(vk, [(int(offset), 0, int(nbytes))])))
        return stage.host[:nbytes].copy()


class Bound:
    """One program's Vulkan objects: descriptor pool/set, launch-parameter buffer, the I/O staging
    buffer and where each input/output sits in it, the timestamp pool and the command buffer."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.cb: Any = None
        self.dpool: Any = None
        self.qpool: Any = None
        self.metabuf: DeviceBuffer | None = None
        self.io: StagingBuffer | None = None
        #: value -> byte offset in ``io`` (inputs first, then outputs)
        self.slots: dict[str, int] = {}
        self.period_ns = 0.0
        #: completed runs (the timestamps hold a result only after one)
        self.runs = 0
        #: timestamps in the pool: 2, or one before the dispatches and one after each (profiling)
        self.queries = 2
        self.per_dispatch = False

    def _stamps(self) -> list[int] | None:
        if self.qpool is None or self.cb is None or not self.runs:
            return None  # never run: waiting for the queries' results would never return
        vk, n = self.ctx.vk, self.queries
        data = vk.ffi.new(f"uint64_t[{n}]")
        vk.vkGetQueryPoolResults(self.ctx.device, self.qpool, 0, n, 8 * n, data, 8,
                                 vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
        return [int(data[i]) for i in range(n)]

    def gpu_seconds(self) -> float | None:
        """The last run's time between the timestamps around the dispatches (None: not supported)."""
        t = self._stamps()
        return None if t is None else float(t[-1] - t[0]) * self.period_ns * 1e-9

    def dispatch_seconds(self) -> list[float] | None:
        """The last run's device time of each dispatch (the gap between the timestamps before and
        after it, the barrier included); None unless recorded with a timestamp per dispatch."""
        t = self._stamps()
        if t is None or not self.per_dispatch:
            return None
        return [float(b - a) * self.period_ns * 1e-9 for a, b in itertools.pairwise(t)]

    def __del__(self) -> None:
        try:
            vk, dev = self.ctx.vk, self.ctx.device
            if self.cb is not None:
                vk.vkFreeCommandBuffers(dev, self.ctx.pool, 1, [self.cb])
            if self.dpool is not None:
                vk.vkDestroyDescriptorPool(dev, self.dpool, None)
            if self.qpool is not None:
                vk.vkDestroyQueryPool(dev, self.qpool, None)
        except Exception:
            pass


class DeviceRuntime:
    """The kit :class:`~rlx_core.plugin.Runtime` for device-local programs: pipelines from the kit's
    context (SPIR-V from ``compiler``), one command buffer per program recorded at bind time (see
    the module docstring), replayed by one submit per run."""

    def __init__(self, ctx: Any, compiler: Any, allocator: DeviceAllocator,
                 meta_block: Callable[[Sequence[Launch]], tuple[np.ndarray, list[int]]],
                 per_dispatch: bool = False) -> None:
        self.ctx, self.compiler, self.allocator, self.meta_block = ctx, compiler, allocator, meta_block
        #: a timestamp after every dispatch (Bound.dispatch_seconds), not only around them all
        self.per_dispatch = per_dispatch

    def load(self, sources: Sequence[str]) -> Mapping[str, Any]:
        return {src: self.ctx.pipeline(src, self.compiler) for src in dict.fromkeys(sources)}

    def bind(self, prog: KitProgram) -> Callable[[], None]:
        ctx, vk = self.ctx, self.ctx.vk
        st = Bound(ctx)
        prog.vk_bound = st  # lives (and is freed) with the program
        self.allocator.flush(prog.constant_buf)
        self.allocator.flush(prog.arena)
        launches = prog.all_launches()
        meta, bases = self.meta_block(launches)
        st.metabuf = DeviceBuffer(ctx, meta.nbytes)
        self.allocator.copyin(st.metabuf, 0, meta)
        self.allocator.flush(st.metabuf)
        # the I/O staging layout: each uploaded input, then each downloaded output, 64-byte aligned
        plan = prog.program.plan
        ups = [(v, plan.offsets[v], prog.types[v].nbytes()) for v in prog.uploads]
        downs = [(v, plan.offsets[v], prog.types[v].nbytes()) for v in dict.fromkeys(prog.downloads)
                 if v in plan.offsets and v not in prog.program.graph.weights]
        pos = 0
        up_pairs: list[tuple[int, int, int]] = []
        down_pairs: list[tuple[int, int, int]] = []
        for kind, items in (("in", ups), ("out", downs)):
            for v, off, n in items:
                if n <= 0:
                    continue
                st.slots[f"{kind}:{v}"] = pos
                (up_pairs if kind == "in" else down_pairs).append(
                    (pos, int(off), int(n)) if kind == "in" else (int(off), pos, int(n)))
                pos += (n + 63) // 64 * 64
        st.io = StagingBuffer(ctx, pos)
        st.dpool = vk.vkCreateDescriptorPool(ctx.device, vk.VkDescriptorPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, maxSets=1, poolSizeCount=1,
            pPoolSizes=[vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                descriptorCount=3)]), None)
        dset = vk.vkAllocateDescriptorSets(ctx.device, vk.VkDescriptorSetAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, descriptorPool=st.dpool,
            descriptorSetCount=1, pSetLayouts=[ctx.set_layout]))[0]
        writes = [vk.VkWriteDescriptorSet(
            sType=vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, dstSet=dset, dstBinding=i, dstArrayElement=0,
            descriptorCount=1, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=b.buf, offset=0, range=b.nbytes)])
            for i, b in enumerate((prog.arena, prog.constant_buf, st.metabuf))]
        vk.vkUpdateDescriptorSets(ctx.device, len(writes), writes, 0, None)
        if not launches and not up_pairs and not down_pairs:
            return lambda: None
        q = vk.vkGetPhysicalDeviceQueueFamilyProperties(ctx.physical)[ctx.qfi]
        if launches and int(q.timestampValidBits) > 0:
            st.period_ns = float(vk.vkGetPhysicalDeviceProperties(ctx.physical).limits.timestampPeriod)
            st.queries = len(launches) + 1 if self.per_dispatch else 2
            st.per_dispatch = self.per_dispatch
            st.qpool = vk.vkCreateQueryPool(ctx.device, vk.VkQueryPoolCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, queryType=vk.VK_QUERY_TYPE_TIMESTAMP,
                queryCount=st.queries), None)
        st.cb = self._record(prog, st, dset, launches, bases, up_pairs, down_pairs)
        cb = st.cb

        def run() -> None:
            ctx.submit(cb)
            st.runs += 1
        return run

    def _record(self, prog: KitProgram, st: Bound, dset: Any, launches: list[Launch], bases: list[int],
                up_pairs: list[tuple[int, int, int]], down_pairs: list[tuple[int, int, int]]) -> Any:
        ctx, vk = self.ctx, self.ctx.vk
        assert st.io is not None
        cb = vk.vkAllocateCommandBuffers(ctx.device, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=ctx.pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))

        def barrier(src_stage: int, src: int, dst_stage: int, dst: int) -> None:
            mb = vk.VkMemoryBarrier(sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER, srcAccessMask=src,
                                    dstAccessMask=dst)
            vk.vkCmdPipelineBarrier(cb, src_stage, dst_stage, 0, 1, [mb], 0, None, 0, None)

        comp, xfer = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        sr, sw = vk.VK_ACCESS_SHADER_READ_BIT, vk.VK_ACCESS_SHADER_WRITE_BIT
        tr, tw = vk.VK_ACCESS_TRANSFER_READ_BIT, vk.VK_ACCESS_TRANSFER_WRITE_BIT
        if st.qpool is not None:
            vk.vkCmdResetQueryPool(cb, st.qpool, 0, st.queries)
        if up_pairs:
            vk.vkCmdCopyBuffer(cb, st.io.buf, prog.arena.buf, len(up_pairs), _regions(vk, up_pairs))
            barrier(xfer, tw, comp, sr | sw)
        if launches:
            vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, ctx.layout, 0, 1, [dset], 0,
                                       None)
            if st.qpool is not None:  # written once the uploads are done
                vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, st.qpool, 0)
        for i, (ln, base) in enumerate(zip(launches, bases)):
            vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, prog.functions[ln.source])
            vk.vkCmdPushConstants(cb, ctx.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, 8,
                                  vk.ffi.new("int32_t[2]", [base, ln.grid[0]]))
            vk.vkCmdDispatch(cb, *ln.grid)
            if i + 1 < len(launches):
                barrier(comp, sw, comp, sr | sw)
                if st.qpool is not None and st.per_dispatch:  # after the barrier: this dispatch is done
                    vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, st.qpool, i + 1)
        if launches and st.qpool is not None:
            vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, st.qpool, st.queries - 1)
        if down_pairs:
            # the kernels' writes (and the upload's, for an output that is an input) before the copy
            barrier(comp | xfer, sw | tw, xfer, tr)
            vk.vkCmdCopyBuffer(cb, prog.arena.buf, st.io.buf, len(down_pairs), _regions(vk, down_pairs))
            barrier(xfer, tw, vk.VK_PIPELINE_STAGE_HOST_BIT, vk.VK_ACCESS_HOST_READ_BIT)
        # the next run's uploads must not overwrite the arena before this run's kernels read it:
        # each submit waits on its fence, so runs never overlap
        vk.vkEndCommandBuffer(cb)
        return cb


__all__ = ["Bound", "DeviceAllocator", "DeviceBuffer", "DeviceRuntime", "StagingBuffer"]
