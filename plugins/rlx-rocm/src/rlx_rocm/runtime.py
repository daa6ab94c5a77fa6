"""The ROCm runtime shim: ctypes on ``libamdhip64`` (memory, modules, launches) and ``libhiprtc``
(HIP C++ -> code object on the machine, for its own GPU), driving the device kit's
:class:`~rlx_core.plugin.KitProgram`.

Written for machines with an AMD GPU and ROCm; none exists where this package is developed, so this
path is not executed by its tests (they compile the same kernels offline, see :mod:`rlx_rocm.check`).
Every HIP call is checked and a failure raises :class:`~rlx_core.plugin.PluginError` with HIP's own
error string.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx_core.plugin import Compiler, IRError, KitProgram, PluginError

from .hip import BLOCK, kernel_name, module, step_launches

#: Exact IEEE arithmetic (no contraction into FMA): the numbers match the float64 reference's bounds.
OPTIONS = ("-O3", "-ffp-contract=off")

_c = ctypes
VP = _c.c_void_p


def _load(names: Sequence[str]) -> Any:
    errors = []
    for n in names:
        path = ctypes.util.find_library(n.removeprefix("lib").split(".so")[0]) if "/" not in n else n
        for cand in dict.fromkeys(p for p in (n, path, f"/opt/rocm/lib/{n}") if p):
            try:
                return _c.CDLL(cand)
            except OSError as e:
                errors.append(str(e))
    raise OSError("; ".join(errors[-2:]))


class Hip:
    """The few HIP runtime and hiprtc entry points RLX uses."""

    def __init__(self) -> None:
        self.lib = _load(["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"])
        try:
            self.rtc = _load(["libhiprtc.so", "libhiprtc.so.6", "libhiprtc.so.5"])
        except OSError:  # ROCm 5 shipped hiprtc inside libamdhip64
            self.rtc = self.lib
        self.lib.hipGetErrorString.restype = _c.c_char_p
        self.rtc.hiprtcGetErrorString.restype = _c.c_char_p
        self.check(self.lib.hipInit(0), "hipInit")

    def check(self, err: int, what: str) -> None:
        if err:
            msg = self.lib.hipGetErrorString(err).decode(errors="replace")
            raise PluginError(f"{what} failed: {msg} (hipError {err})", where="rlx-rocm runtime",
                              fix="run `rlx doctor`; check the ROCm install (rocminfo) and the GPU's state",
                              kind="runtime")

    def device_count(self) -> int:
        n = _c.c_int(0)
        return n.value if self.lib.hipGetDeviceCount(_c.byref(n)) == 0 else 0

    def device_name(self, index: int) -> str:
        buf = _c.create_string_buffer(256)
        self.check(self.lib.hipDeviceGetName(buf, 256, index), "hipDeviceGetName")
        return buf.value.decode(errors="replace")

    def runtime_version(self) -> int:
        v = _c.c_int(0)
        self.check(self.lib.hipRuntimeGetVersion(_c.byref(v)), "hipRuntimeGetVersion")
        return v.value

    def malloc(self, nbytes: int) -> int:
        p = VP()
        self.check(self.lib.hipMalloc(_c.byref(p), _c.c_size_t(max(int(nbytes), 16))), "hipMalloc")
        return int(p.value or 0)

    def htod(self, dst: int, src: np.ndarray) -> None:
        self.check(self.lib.hipMemcpyHtoD(VP(dst), VP(src.ctypes.data), _c.c_size_t(src.nbytes)),
                   "hipMemcpyHtoD")

    def dtoh(self, dst: np.ndarray, src: int) -> None:
        self.check(self.lib.hipMemcpyDtoH(VP(dst.ctypes.data), VP(src), _c.c_size_t(dst.nbytes)),
                   "hipMemcpyDtoH")

    def compile(self, text: str, options: Sequence[str]) -> bytes:
        prog = VP()
        self.rtc_check(self.rtc.hiprtcCreateProgram(_c.byref(prog), text.encode(), b"rlx_kernels.hip", 0,
                                                    None, None), "hiprtcCreateProgram")
        try:
            opts = (_c.c_char_p * len(options))(*[o.encode() for o in options])
            err = self.rtc.hiprtcCompileProgram(prog, len(options), opts)
            if err:
                size = _c.c_size_t(0)
                self.rtc.hiprtcGetProgramLogSize(prog, _c.byref(size))
                log = _c.create_string_buffer(size.value + 1)
                self.rtc.hiprtcGetProgramLog(prog, log)
                said = log.value.decode(errors="replace")[-3000:]
                raise IRError(f"hiprtc rejected the generated HIP:\n{said}", where="rlx-rocm kernels",
                              fix="report this bug with the kernel source (RLX_DISPATCH_REPORT=1 names "
                                  "the node)")
            size = _c.c_size_t(0)
            self.rtc_check(self.rtc.hiprtcGetCodeSize(prog, _c.byref(size)), "hiprtcGetCodeSize")
            code = _c.create_string_buffer(size.value)
            self.rtc_check(self.rtc.hiprtcGetCode(prog, code), "hiprtcGetCode")
            return code.raw[:size.value]
        finally:
            self.rtc.hiprtcDestroyProgram(_c.byref(prog))

    def rtc_check(self, err: int, what: str) -> None:
        if err:
            msg = self.rtc.hiprtcGetErrorString(err).decode(errors="replace")
            raise PluginError(f"{what} failed: {msg}", where="rlx-rocm hiprtc", fix="check the ROCm install",
                              kind="runtime")

    def load_module(self, image: bytes) -> tuple[Any, Any]:
        mod = VP()
        buf = _c.create_string_buffer(image, len(image))
        self.check(self.lib.hipModuleLoadData(_c.byref(mod), buf), "hipModuleLoadData")
        return mod, buf

    def function(self, mod: Any, name: str) -> Any:
        fn = VP()
        self.check(self.lib.hipModuleGetFunction(_c.byref(fn), mod, name.encode()), "hipModuleGetFunction")
        return fn

    def launch(self, fn: Any, blocks: int, args: Any) -> None:
        self.check(self.lib.hipModuleLaunchKernel(fn, _c.c_uint(blocks), 1, 1, _c.c_uint(BLOCK), 1, 1, 0,
                                                  None, args, None), "hipModuleLaunchKernel")

    def synchronize(self) -> None:
        self.check(self.lib.hipDeviceSynchronize(), "hipDeviceSynchronize")


_HIP: Hip | None = None
_LOCK = threading.Lock()


def hip() -> Hip:
    """The loaded runtime (``OSError`` when libamdhip64 is missing)."""
    global _HIP
    with _LOCK:
        if _HIP is None:
            _HIP = Hip()
        return _HIP


class HiprtcCompiler(Compiler):
    """HIP C++ -> a code object for this machine's GPU, cached and authenticated by the device kit."""

    dialect = "hip"
    cache_name = "rocm-code-objects"
    about = "rlx-rocm: AMDGPU code objects built by hiprtc, per device, authenticated"
    suffix = ".hsaco"
    label = "hiprtc"

    def __init__(self, h: Hip, index: int) -> None:
        super().__init__()
        self.h, self.index = h, index

    def options(self) -> list[str]:
        from .settings import ARCH

        arch = ARCH.get()
        return [*OPTIONS, *([f"--offload-arch={arch}"] if arch else [])]

    def identity(self) -> str:
        return "\0".join((self.h.device_name(self.index), str(self.h.runtime_version()), *self.options()))

    def build(self, source: str, out: Path) -> None:
        out.write_bytes(self.h.compile(module([source]), self.options()))


class HipAllocator:
    def __init__(self, h: Hip) -> None:
        self.h = h

    def alloc(self, nbytes: int) -> int:
        return self.h.malloc(nbytes)

    def copyin(self, buf: int, offset: int, data: np.ndarray) -> None:
        b = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if b.size:
            self.h.htod(buf + int(offset), b)

    def copyout(self, buf: int, offset: int, nbytes: int) -> np.ndarray:
        out = np.empty(int(nbytes), np.uint8)
        if nbytes:
            self.h.dtoh(out, buf + int(offset))
        return out


class HipRuntime:
    """Loads code objects and binds every launch once: device pointers and parameter blocks are
    fixed at bind time, so a run only launches the kernels in order and synchronises."""

    def __init__(self, h: Hip, compiler: HiprtcCompiler) -> None:
        self.h, self.compiler = h, compiler
        self.modules: list[Any] = []

    def load(self, sources: Sequence[str]) -> Mapping[str, Any]:
        out = {}
        for src, image in self.compiler.load_all(sources, blob=True).items():
            mod, keep = self.h.load_module(image)
            self.modules.append((mod, keep))
            out[src] = self.h.function(mod, kernel_name(src))
        return out

    def bind(self, prog: KitProgram) -> Callable[[], None]:
        lns = prog.all_launches()
        blocks = [np.ascontiguousarray(ln.params, np.int32) for ln in lns]
        sizes = [(b.nbytes + 63) // 64 * 64 for b in blocks]
        pbuf = self.h.malloc(sum(sizes) or 16)
        calls: list[tuple[Any, int, Any]] = []
        keep: list[Any] = []
        off = 0
        for ln, b, size in zip(lns, blocks, sizes):
            self.h.htod(pbuf + off, b)
            ptrs = [VP(a + o) for a, o in (prog.buffer(v) for v in ln.bufs)] + [VP(pbuf + off)]
            args = (VP * len(ptrs))(*[_c.cast(_c.pointer(p), VP) for p in ptrs])
            keep += [ptrs, args]
            calls.append((prog.functions[ln.source], (int(ln.grid[0]) + BLOCK - 1) // BLOCK, args))
            off += size
        h = self.h

        def run() -> None:
            for fn, nblocks, args in calls:
                h.launch(fn, nblocks, args)
            h.synchronize()

        run.keep = keep  # type: ignore[attr-defined]
        return run


def compile_program(program: Any, index: int) -> KitProgram:
    h = hip()
    h.check(h.lib.hipSetDevice(index), "hipSetDevice")
    return KitProgram(program, HipAllocator(h), HipRuntime(h, HiprtcCompiler(h, index)),
                      lambda s, p: step_launches(s, p.types))
