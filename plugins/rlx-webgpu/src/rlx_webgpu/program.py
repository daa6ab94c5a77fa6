"""The WebGPU executable, on the device kit: a :class:`~rlx_core.plugin.KitProgram` with one arena
buffer laid out by ``program.plan``, one constants buffer and one launch-parameter ("meta") buffer
holding every dispatch's parameters at its own aligned offset (bound with a dynamic offset). WebGPU
command buffers are single-use, so nothing is replayed: at bind time every dispatch is resolved to
(pipeline, offset, workgroups) and a run encodes one compute pass from that list and submits it
(WebGPU orders the dispatches of a pass itself). The kit copies inputs in, runs, copies outputs out;
this module lowers each LIR step to WGSL dispatches. The lowering is also what ``rlx export --target
webgpu`` writes out (:mod:`rlx_webgpu.export`), with a recording runtime instead of a device."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import (
    DType,
    HostAllocator,
    KitProgram,
    Launch,
    Program,
    Step,
    glsl,
)

from . import wgsl


def meta_layout(launches: Sequence[Launch], align: int) -> tuple[np.ndarray, list[int], int]:
    """Every launch's parameters at its own ``align``-byte offset in one int32 array: (array, byte
    offsets, the binding size every dispatch sees)."""
    size = max([4 * len(ln.params) for ln in launches] + [4])
    stride = -(-size // align) * align
    meta = np.zeros(max(len(launches), 1) * stride // 4, np.int32)
    offsets = []
    for i, ln in enumerate(launches):
        at = i * stride // 4
        meta[at:at + len(ln.params)] = np.asarray(ln.params, np.int64).astype(np.int32)
        offsets.append(i * stride)
    return meta, offsets, size


class GpuAllocator:
    """wgpu storage buffers, written and read through the queue."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def alloc(self, nbytes: int) -> Any:
        return self.ctx.buffer(nbytes)

    def copyin(self, buf: Any, offset: int, data: np.ndarray) -> None:
        self.ctx.write(buf, offset, data)

    def copyout(self, buf: Any, offset: int, nbytes: int) -> np.ndarray:
        return self.ctx.read(buf, offset, nbytes)


class GpuRuntime:
    """A compute pipeline per WGSL source (the context memoises them per process); one bind group
    (arena, constants, parameters with a dynamic offset) per program; a run encodes every dispatch
    into one compute pass and submits it."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def load(self, sources: Sequence[str]) -> Mapping[str, Any]:
        return {src: self.ctx.pipeline(src) for src in dict.fromkeys(sources)}

    def bind(self, prog: KitProgram) -> Callable[[], None]:
        assert isinstance(prog, WebGPUProgram)
        ctx = self.ctx
        launches = prog.all_launches()
        if not launches:
            return lambda: None
        meta, offsets, size = meta_layout(launches, ctx.offset_align)
        prog.metabuf = ctx.buffer(meta.nbytes)
        ctx.write(prog.metabuf, 0, meta)
        group = ctx.device.create_bind_group(layout=ctx.bind_layout, entries=[
            {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
            for i, b in enumerate((prog.arena, prog.constant_buf))] + [
            {"binding": 2, "resource": {"buffer": prog.metabuf, "offset": 0, "size": size}}])
        calls = [(prog.functions[ln.source], [off], ln.grid) for ln, off in zip(launches, offsets)]
        device = ctx.device

        def run() -> None:
            enc = device.create_command_encoder()
            cp = enc.begin_compute_pass()
            for pipe, dyn, grid in calls:
                cp.set_pipeline(pipe)
                cp.set_bind_group(0, group, dyn)
                cp.dispatch_workgroups(*grid)
            cp.end()
            device.queue.submit([enc.finish()])

        run.group = group  # type: ignore[attr-defined]
        return run


class RecordingRuntime:
    """No device: keeps the launches (what ``rlx export --target webgpu`` writes out)."""

    def load(self, sources: Sequence[str]) -> Mapping[str, Any]:
        return {src: None for src in dict.fromkeys(sources)}

    def bind(self, prog: KitProgram) -> Callable[[], None]:
        def run() -> None:
            raise RuntimeError("an export-only program does not run")
        return run


class WebGPUProgram(glsl.ShaderProgram):
    """The device kit's shader lowering (:class:`rlx_core.plugin.glsl.ShaderProgram`) with WGSL
    templates (:mod:`rlx_webgpu.wgsl`): only the language, the buffers and the runtime are WebGPU's."""

    #: f16/bf16 are stored two to a word as well (WGSL has no 16-bit storage without shader-f16)
    PACKED = {DType.BOOL: 4, DType.F16: 2, DType.BF16: 2}

    def __init__(self, program: Program, ctx: Any = None, *, tiled: bool | None = None,
                 max_groups: int = 65535) -> None:
        """``ctx``: the :class:`~rlx_webgpu.gpu.Context` to run on, or None for an export-only program
        (host buffers, nothing compiled); ``tiled``: the workgroup-memory matmul (GPUs) instead of
        the untiled one (CPU adapters); default: tiled unless the adapter is a CPU."""
        self.ctx = ctx
        self.tiled = (not ctx.cpu_device if ctx is not None else True) if tiled is None else tiled
        self.metabuf: Any = None
        allocator: Any = HostAllocator() if ctx is None else GpuAllocator(ctx)
        runtime: Any = RecordingRuntime() if ctx is None else GpuRuntime(ctx)
        super().__init__(program, allocator, runtime, prefix="webgpu.", cpu_device=not self.tiled,
                         max_groups=ctx.max_groups if ctx is not None else max_groups)

    def source(self, name: str, *args: Any) -> str:
        return str(getattr(wgsl, name)(*args))

    def _k_linear(self, s: Step) -> None:
        # WebGPU caps every dispatch dimension (maxComputeWorkgroupsPerDimension): rows beyond it loop
        # in the WGSL shader.
        x, w = self.shape(s.inputs[0]), self.shape(s.inputs[1])
        N, K = w  # noqa: N806
        R = math.prod(x[:-1])  # noqa: N806
        wname = self.transposed.get(s.inputs[1], s.inputs[1])
        meta = [R, N, K, *self.locate(s.inputs[0]), *self.locate(wname), *self.locate(s.inputs[2]),
                self.locate(s.outputs[0])[1], 1 if wname != s.inputs[1] else 0]
        self.emit(wgsl.linear(), meta, groups=(-(-N // wgsl.WG), min(R, self.max_groups), 1))

