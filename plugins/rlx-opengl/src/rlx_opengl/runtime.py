"""OpenGL 4.3 compute through moderngl on a headless EGL context: the allocator and the runtime
shim of the device kit's GLSL kernel library (:mod:`rlx_core.plugin.glsl`, flavour ``OPENGL``).

An OpenGL context is current in one thread at a time, and an EGL context may not be current in two
threads at once, so one thread owns it: every GL call (buffers, shader compilation, dispatches,
reads) runs there (:meth:`Gl.call`), whichever thread compiles or runs a program. Buffers are plain
buffer objects; the arena, the constants and the program's launch parameters are bound whole to
storage-buffer bindings 0, 1, 2 and each dispatch finds its byte offsets among its parameters
(``pc.base``, a uniform set before each dispatch), so ``GL_SHADER_STORAGE_BUFFER_OFFSET_ALIGNMENT``
never matters. Dispatches are separated by ``glMemoryBarrier(GL_SHADER_STORAGE_BARRIER_BIT)``.

Shaders are compiled by the driver from source, once per context (memoised here); OpenGL has no
portable binary a moderngl program can store, so there is no RLX disk cache for them (Mesa keeps
its own shader cache, the driver's business).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from rlx_core.plugin import IRError, KitProgram, PluginError, Program, glsl

T = TypeVar("T")

#: renderers whose "GPU" is the host CPU (shaders through LLVM or a C interpreter)
SOFTWARE = ("llvmpipe", "softpipe", "swrast", "swiftshader")


class Gl:
    """One EGL context and the thread that owns it."""

    def __init__(self, device_index: int) -> None:
        self.device_index = device_index
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rlx-opengl")
        self._thread: threading.Thread | None = None
        self.ctx: Any = self.call(self._create)
        # every query is a GL call: on the context's thread
        info, ext, version_code = self.call(lambda: (dict(self.ctx.info), set(self.ctx.extensions),
                                                     int(self.ctx.version_code)))
        self.renderer = str(info.get("GL_RENDERER", "?"))
        self.version = str(info.get("GL_VERSION", "?"))
        self.vendor = str(info.get("GL_VENDOR", "?"))
        self.max_groups = int(info.get("GL_MAX_COMPUTE_WORK_GROUP_COUNT", (65535,))[0])
        #: the largest storage buffer a shader may bind (the arena must fit)
        self.max_ssbo = int(info.get("GL_MAX_SHADER_STORAGE_BLOCK_SIZE", 1 << 27))
        #: 64-bit integers and doubles in shaders (i64 values, Payne-Hanek sin/cos, accurate pow)
        self.wide = "GL_ARB_gpu_shader_int64" in ext and (
            "GL_ARB_gpu_shader_fp64" in ext or version_code >= 400)
        self.software = any(s in self.renderer.lower() for s in SOFTWARE)
        self._shaders: dict[str, Any] = {}

    def _create(self) -> Any:
        import moderngl

        self._thread = threading.current_thread()
        # (moderngl's stubs type **settings as dict values; they are glcontext's keyword arguments)
        settings: dict[str, Any] = {"backend": "egl", "device_index": self.device_index}
        ctx = moderngl.create_context(standalone=True, require=430, **settings)
        ctx.gc_mode = "context_gc"  # released objects are freed by ctx.gc(), on this thread
        return ctx

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the context's thread."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        return self._pool.submit(fn, *args).result()

    def shader(self, source: str) -> Any:
        """The compiled compute shader of ``source`` (on the context's thread; memoised)."""
        sh = self._shaders.get(source)
        if sh is None:
            import moderngl

            try:
                sh = self.ctx.compute_shader(source)
            except moderngl.Error as e:
                name = source.split("void main", 1)[0][-200:]
                raise IRError(f"the OpenGL driver ({self.renderer}) rejected a generated compute shader:\n"
                              f"{str(e)[-2000:]}", where=f"opengl shader ...{name[-60:]!r}",
                              fix="report this bug with the shader source (RLX_DISPATCH_REPORT=1 names "
                                  "the node)") from None
            self._shaders[source] = sh
        return sh


_GL: dict[int, Gl] = {}
_ERR: dict[int, str] = {}
_LOCK = threading.Lock()


def context(device_index: int) -> Gl:
    """The process-wide context of EGL device ``device_index`` (created once; a failure is kept
    and re-raised, so a missing driver is not retried per call)."""
    with _LOCK:
        gl = _GL.get(device_index)
        if gl is None:
            if device_index in _ERR:
                raise RuntimeError(_ERR[device_index])
            try:
                gl = _GL[device_index] = Gl(device_index)
            except Exception as e:
                _ERR[device_index] = f"{type(e).__name__}: {e}"
                raise RuntimeError(_ERR[device_index]) from None
        return gl


class GlAllocator:
    """Buffer objects, written and read at byte offsets on the context's thread."""

    def __init__(self, gl: Gl) -> None:
        self.gl = gl

    def alloc(self, nbytes: int) -> Any:
        return self.gl.call(lambda: self.gl.ctx.buffer(reserve=max(int(nbytes), 16), dynamic=True))

    def copyin(self, buf: Any, offset: int, data: np.ndarray) -> None:
        b = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if b.size:
            self.gl.call(buf.write, b.tobytes(), int(offset))

    def copyout(self, buf: Any, offset: int, nbytes: int) -> np.ndarray:
        if not nbytes:
            return np.empty(0, np.uint8)
        return np.frombuffer(self.gl.call(buf.read, int(nbytes), int(offset)), np.uint8).copy()


class GlRuntime:
    """Compiles each distinct shader once and binds a program's dispatches: a run binds the three
    buffers, then per dispatch sets ``pc.base``, dispatches and places a storage barrier."""

    def __init__(self, gl: Gl) -> None:
        self.gl = gl

    def load(self, sources: Sequence[str]) -> Mapping[str, Any]:
        def build() -> dict[str, Any]:
            self.gl.ctx.gc()  # buffers of programs collected since: freed here, on the GL thread
            return {src: self.gl.shader(src) for src in dict.fromkeys(sources)}

        return self.gl.call(build)

    def bind(self, prog: KitProgram) -> Callable[[], None]:
        import moderngl

        gl = self.gl
        launches = prog.all_launches()
        meta, bases = glsl.meta_block(launches)
        metabuf = gl.call(lambda: gl.ctx.buffer(meta.tobytes()))
        calls = []
        for ln, base in zip(launches, bases):
            sh = prog.functions[ln.source]
            calls.append((sh, sh.get("pc.base", None), base, tuple(int(g) for g in ln.grid)))
        storage, every = moderngl.SHADER_STORAGE_BARRIER_BIT, moderngl.ALL_BARRIER_BITS
        arena, consts, ctx = prog.arena, prog.constant_buf, gl.ctx

        def dispatch_all() -> None:
            arena.bind_to_storage_buffer(0)
            consts.bind_to_storage_buffer(1)
            metabuf.bind_to_storage_buffer(2)
            for sh, uniform, base, grid in calls:
                if uniform is not None:  # absent only if the compiler dropped it as unused
                    uniform.value = base
                sh.run(*grid)
                ctx.memory_barrier(storage)
            ctx.memory_barrier(every)  # the reads that follow see every write

        def run() -> None:
            gl.call(dispatch_all)

        run.keep = metabuf  # type: ignore[attr-defined]
        return run


def compile_program(program: Program, gl: Gl, tiled: bool) -> KitProgram:
    if program.plan.arena_bytes > gl.max_ssbo:
        raise PluginError(f"the program's arena ({program.plan.arena_bytes} bytes) exceeds the largest "
                          f"storage buffer {gl.renderer} binds "
                          f"(GL_MAX_SHADER_STORAGE_BLOCK_SIZE = {gl.max_ssbo})",
                          where=f"opengl program {program.graph.name!r}",
                          fix="run a smaller batch, or the model on another backend (vulkan, cuda)",
                          kind="other")
    return glsl.GlslProgram(program, GlAllocator(gl), GlRuntime(gl), glsl.OPENGL, prefix="opengl.",
                            cpu_device=gl.software and not tiled, max_groups=gl.max_groups)
