"""The process-wide WebGPU context (wgpu-py over wgpu-native): one adapter, one device, the bind-group
and pipeline layouts every RLX shader shares, and a pipeline per distinct WGSL source.

Imported only when a device is probed or a program compiled (``wgpu`` loads wgpu-native)."""

from __future__ import annotations

import threading
from functools import cache
from typing import Any

import numpy as np

#: Adapter types in the order a device is preferred (a real GPU first; a CPU adapter such as Mesa
#: lavapipe is what CI has).
_TYPE_ORDER = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3, "Unknown": 4}
#: wgpu-native's OpenGL backend only when nothing else exists: its compute support is partial, and
#: probing it prints EGL/Wayland warnings on headless machines.
_BACKENDS = ("Vulkan", "Metal", "DX12")


class Context:
    """The adapter and device, and what every program shares."""

    def __init__(self) -> None:
        import wgpu

        try:
            from wgpu.backends.wgpu_native import extras

            extras.set_instance_extras(backends=list(_BACKENDS))
        except Exception:  # the instance exists already (someone else used wgpu first): take it as it is
            pass
        adapters = [a for a in wgpu.gpu.enumerate_adapters_sync()
                    if str(a.info.get("backend_type", "")) != "OpenGL"]
        if not adapters:
            raise RuntimeError("wgpu-native found no Vulkan/Metal/DX12 adapter")
        adapters.sort(key=lambda a: _TYPE_ORDER.get(str(a.info.get("adapter_type", "")), 9))
        self.wgpu = wgpu
        self.adapter = ad = adapters[0]
        info = ad.info
        self.device_name = str(info.get("device") or info.get("description") or "unknown adapter")
        self.adapter_type = str(info.get("adapter_type", ""))
        self.backend_type = str(info.get("backend_type", ""))
        self.cpu_device = self.adapter_type == "CPU"
        lim = ad.limits
        # The binding and buffer sizes the adapter allows (the WebGPU defaults are 128/256 MiB)
        limits = {k: int(lim[k]) for k in ("max-storage-buffer-binding-size", "max-buffer-size")
                  if k in lim}
        self.device = ad.request_device_sync(required_features=[], required_limits=limits)
        self.max_binding = int(self.device.limits["max-storage-buffer-binding-size"])
        self.max_groups = int(self.device.limits["max-compute-workgroups-per-dimension"])
        #: dynamic storage-buffer offsets must be multiples of this (256 in browsers)
        self.offset_align = max(int(self.device.limits["min-storage-buffer-offset-alignment"]), 4)
        self.features = sorted(str(f) for f in ad.features)
        self.f16 = "shader-f16" in self.features
        U = wgpu.BufferBindingType  # noqa: N806
        S = wgpu.ShaderStage.COMPUTE  # noqa: N806
        self.bind_layout = self.device.create_bind_group_layout(entries=[
            {"binding": 0, "visibility": S, "buffer": {"type": U.storage}},
            {"binding": 1, "visibility": S, "buffer": {"type": U.read_only_storage}},
            {"binding": 2, "visibility": S,
             "buffer": {"type": U.read_only_storage, "has_dynamic_offset": True}},
        ])
        self.layout = self.device.create_pipeline_layout(bind_group_layouts=[self.bind_layout])
        self._pipelines: dict[str, Any] = {}
        self._lock = threading.Lock()
        #: distinct shaders compiled (pipelines created) in this process
        self.compiled = 0

    def pipeline(self, source: str) -> Any:
        """The compute pipeline of one WGSL source, created once per process: wgpu compiles WGSL
        (naga -> SPIR-V -> driver) at pipeline creation, so there is no binary to cache on disk."""
        with self._lock:
            p = self._pipelines.get(source)
            if p is None:
                module = self.device.create_shader_module(code=source)
                p = self.device.create_compute_pipeline(layout=self.layout,
                                                        compute={"module": module, "entry_point": "main"})
                self._pipelines[source] = p
                self.compiled += 1
            return p

    def buffer(self, nbytes: int) -> Any:
        U = self.wgpu.BufferUsage  # noqa: N806
        n = max(16, -(-int(nbytes) // 16) * 16)
        if n > self.max_binding:
            raise MemoryError(f"a {n}-byte buffer exceeds this adapter's storage binding limit of "
                              f"{self.max_binding} bytes ({self.device_name})")
        return self.device.create_buffer(size=n, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)

    def write(self, buf: Any, offset: int, data: np.ndarray) -> None:
        b = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if b.size % 4:  # WebGPU writes whole words; values start 64-byte aligned, so the pad is free
            b = np.concatenate([b, np.zeros(4 - b.size % 4, np.uint8)])
        if b.size:
            self.device.queue.write_buffer(buf, int(offset), b)

    def read(self, buf: Any, offset: int, nbytes: int) -> np.ndarray:
        if nbytes <= 0:
            return np.zeros(0, np.uint8)
        lo = int(offset) // 4 * 4
        hi = -(-(int(offset) + int(nbytes)) // 4) * 4
        raw = np.frombuffer(self.device.queue.read_buffer(buf, lo, hi - lo), np.uint8)
        return raw[offset - lo:offset - lo + nbytes].copy()


@cache
def context() -> Context:
    return Context()
