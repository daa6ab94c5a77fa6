"""NVRTC on the device kit: generated CUDA C -> cubin, cached on disk and authenticated.

CuPy's ``RawKernel`` keeps its own cubin cache (``CUPY_CACHE_DIR``) and loads whatever it finds
there; a planted file would run on the GPU. Here the kit's :class:`~rlx_core.plugin.Compiler`
stores every cubin as an authenticated entry of RLX's private cache (``rlx cache info`` lists it),
keyed by the source, the NVRTC version and the options, and CuPy only loads the bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlx_core.plugin import Compiler, IRError

#: What CuPy's RawKernel passes NVRTC too (it adds -ftz=true), so numbers do not change.
BASE_OPTIONS = ("-ftz=true",)


def _nvrtc() -> Any:
    from cupy_backends.cuda.libs import nvrtc

    return nvrtc


def arch_for(compute_capability: str) -> str:
    """The device's SM version, capped at the newest NVRTC can target (as CuPy does)."""
    nvrtc = _nvrtc()
    cc = int(compute_capability)
    try:
        newest = max(int(a) for a in nvrtc.getSupportedArchs())
    except (AttributeError, ValueError):  # NVRTC before 11.2 has no list; trust the device
        return str(cc)
    return str(min(cc, newest))


class NvrtcCompiler(Compiler):
    dialect = "cuda"
    cache_name = "cuda-kernels"
    about = "rlx-cuda: NVRTC-compiled kernels (cubin), authenticated"
    suffix = ".cubin"
    label = "NVRTC"

    def __init__(self, arch: str) -> None:
        super().__init__()
        self.options = (*BASE_OPTIONS, f"-arch=sm_{arch}")

    def identity(self) -> str:
        major, minor = _nvrtc().getVersion()
        return f"nvrtc {major}.{minor} {' '.join(self.options)}"

    def build(self, source: str, out: Path) -> None:
        nvrtc = _nvrtc()
        prog = nvrtc.createProgram(source, "rlx_kernel.cu", [], [])
        try:
            try:
                nvrtc.compileProgram(prog, list(self.options))
            except nvrtc.NVRTCError as e:
                log = nvrtc.getProgramLog(prog)
                raise IRError(f"NVRTC rejected a generated kernel ({e}):\n{log[-2000:]}",
                              where=f"cuda kernel {self.key(source)[:12]}",
                              fix="report this bug with the kernel source (RLX_DISPATCH_REPORT=1 names "
                                  "the node)") from None
            out.write_bytes(nvrtc.getCUBIN(prog))
        finally:
            nvrtc.destroyProgram(prog)


_COMPILERS: dict[str, NvrtcCompiler] = {}


def compiler(compute_capability: str) -> NvrtcCompiler:
    """One compiler per target architecture (its cubins differ)."""
    arch = arch_for(compute_capability)
    c = _COMPILERS.get(arch)
    if c is None:
        c = _COMPILERS.setdefault(arch, NvrtcCompiler(arch))
    return c


__all__ = ["BASE_OPTIONS", "NvrtcCompiler", "arch_for", "compiler"]
