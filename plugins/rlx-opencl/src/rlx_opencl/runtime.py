"""OpenCL through pyopencl on the device kit: the allocator, the compiler and the runtime shim.

Kernels are the device kit's C-style kernel library in its OpenCL dialect
(:data:`rlx_core.plugin.KERNEL_DIALECTS` ``["opencl"]``): every buffer arrives as the arena (or
constants) buffer plus a byte offset, and ``P`` as a small constant buffer. Programs are built
from source once per device, and the device binary is stored as an authenticated entry of RLX's
private cache (:class:`ClCompiler`): pyopencl's own source cache (pickled metadata in the user's
cache) is never used, only a temporary private directory while building.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx_core.plugin import Compiler, IRError, KitProgram, cstyle

#: Exact IEEE arithmetic (no -cl-fast-relaxed-math, no mad contraction): numbers match the reference.
OPTIONS = ("-cl-std=CL1.2",)


def _cl() -> Any:
    import pyopencl as cl

    return cl


def devices() -> list[tuple[str, Any]]:
    """Every OpenCL device as ``("platform / device", device)``; [] without a platform."""
    cl = _cl()
    out = []
    try:
        platforms = cl.get_platforms()
    except Exception:  # no ICD loader or no platform: pyopencl raises LogicError/RuntimeError
        return []
    for p in platforms:
        try:
            devs = p.get_devices()
        except Exception:
            continue
        out += [(f"{p.name.strip()} / {d.name.strip()}", d) for d in devs]
    return out


def pick(wanted: str) -> tuple[str, Any] | None:
    """``wanted`` (a substring) or the first GPU, else the first device."""
    found = devices()
    if wanted:
        hits = [x for x in found if wanted.lower() in x[0].lower()]
        return hits[0] if hits else None
    cl = _cl()
    gpus = [x for x in found if x[1].type & cl.device_type.GPU]
    pool = gpus or found
    return pool[0] if pool else None


class Context:
    """One device: its context, queue and compiler (shared by every program on it)."""

    def __init__(self, label: str, device: Any) -> None:
        cl = _cl()
        self.label, self.device = label, device
        self.ctx = cl.Context([device])
        self.queue = cl.CommandQueue(self.ctx)
        self.compiler = ClCompiler(self)


_CONTEXTS: dict[str, Context] = {}
_LOCK = threading.Lock()


def context(label: str, device: Any) -> Context:
    with _LOCK:
        c = _CONTEXTS.get(label)
        if c is None:
            c = _CONTEXTS[label] = Context(label, device)
        return c


class ClCompiler(Compiler):
    """OpenCL C -> the device's program binary, cached and authenticated by the device kit."""

    dialect = "opencl"
    cache_name = "opencl-binaries"
    about = "rlx-opencl: OpenCL program binaries per device, authenticated"
    suffix = ".clbin"
    label = "the OpenCL compiler"

    def __init__(self, ctx: Context) -> None:
        super().__init__()
        self.c = ctx

    def identity(self) -> str:
        d = self.c.device
        return "\0".join((self.c.label, d.version, d.driver_version, d.platform.version, *OPTIONS))

    def build(self, source: str, out: Path) -> None:
        cl = _cl()
        unit = cstyle.module(cstyle.OPENCL, [source])
        prg = cl.Program(self.c.ctx, unit)
        try:
            with tempfile.TemporaryDirectory() as tmp:  # pyopencl's cache, private and thrown away
                prg.build(options=list(OPTIONS), cache_dir=tmp)
        except cl.RuntimeError as e:
            raise IRError(f"the OpenCL compiler of {self.c.label} rejected a generated kernel:\n"
                          f"{str(e)[-2000:]}", where=f"opencl kernel {self.key(source)[:12]}",
                          fix="report this bug with the kernel source (RLX_DISPATCH_REPORT=1 names the "
                              "node)") from None
        (binary,) = prg.get_info(cl.program_info.BINARIES)
        out.write_bytes(bytes(binary))


class ClAllocator:
    """Device memory: whole buffers, bytes at offsets (blocking copies)."""

    def __init__(self, c: Context) -> None:
        self.c = c

    def alloc(self, nbytes: int) -> Any:
        cl = _cl()
        return cl.Buffer(self.c.ctx, cl.mem_flags.READ_WRITE, size=max(int(nbytes), 16))

    def copyin(self, buf: Any, offset: int, data: np.ndarray) -> None:
        b = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if b.size:
            _cl().enqueue_copy(self.c.queue, buf, b, dst_offset=int(offset), is_blocking=True)

    def copyout(self, buf: Any, offset: int, nbytes: int) -> np.ndarray:
        out = np.empty(int(nbytes), np.uint8)
        if nbytes:
            _cl().enqueue_copy(self.c.queue, out, buf, src_offset=int(offset), is_blocking=True)
        return out


class ClRuntime:
    """Loads binaries (built through :class:`ClCompiler`) and binds every launch once: a run only
    enqueues the kernels in order and waits."""

    def __init__(self, c: Context) -> None:
        self.c = c

    def load(self, sources: Sequence[str]) -> Mapping[str, Any]:
        cl = _cl()
        binaries = self.c.compiler.load_all(sources, blob=True)
        out = {}
        for src, binary in binaries.items():
            prg = cl.Program(self.c.ctx, [self.c.device], [binary])
            prg.build(options=list(OPTIONS))
            out[src] = prg
        return out

    def bind(self, prog: KitProgram) -> Callable[[], None]:
        cl = _cl()
        calls: list[tuple[Any, tuple[int]]] = []
        keep: list[Any] = []
        for ln in prog.all_launches():
            args: list[Any] = []
            for v in ln.bufs:
                buf, off = prog.buffer(v)
                args += [buf, np.int32(off)]
            params = np.ascontiguousarray(ln.params, np.int32)
            pbuf = cl.Buffer(self.c.ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=params)
            keep.append(pbuf)
            # One Kernel object per launch: its arguments are set once, here.
            k = cl.Kernel(prog.functions[ln.source], cstyle.kernel_name(ln.source))
            k.set_args(*args, pbuf)
            calls.append((k, (int(ln.grid[0]),)))
        q = self.c.queue

        def run() -> None:
            for k, size in calls:
                cl.enqueue_nd_range_kernel(q, k, size, None)
            q.finish()

        run.keep = keep  # type: ignore[attr-defined]
        return run


def compile_program(program: Any, c: Context) -> KitProgram:
    return KitProgram(program, ClAllocator(c), ClRuntime(c),
                      lambda s, p: cstyle.launches(cstyle.OPENCL, s, p.types, "opencl.ew."))
