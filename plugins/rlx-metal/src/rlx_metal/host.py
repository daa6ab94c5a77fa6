"""MSL on host: the exact MSL rlx-metal generates, compiled as C++17 with a small ``metal_stdlib``
compatibility header (``include/metal_stdlib``) and a generated driver that runs the kernel once per
thread of the grid (``thread_position_in_grid`` becomes the loop index). Each kernel becomes one
shared library, built, cached and authenticated before every dlopen by the device kit's
:class:`~rlx_core.devicekit.Compiler` (:class:`HostCompiler`), loaded with ctypes.

This mode checks the generated MSL's semantics on any machine with clang++ or g++; it says nothing
about the Apple GPU (performance, fast-math, Metal compiler acceptance).
"""

from __future__ import annotations

import ctypes
import re
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path

from rlx_core.plugin import Compiler, IRError, tool_version

from . import msl

INCLUDE = Path(__file__).resolve().parent / "include"
FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-w", "-fno-fast-math", "-ffp-contract=off")
_LOCK = threading.Lock()


def compiler() -> str | None:
    """The C++ compiler used (``RLX_METAL_CXX``, else clang++, else g++), or None."""
    from .settings import CXX

    env: str | None = CXX.get()
    if env:
        return shutil.which(env)
    return shutil.which("clang++") or shutil.which("g++")


_SIG = re.compile(r"kernel void (\w+)\((.*?)\) \{", re.S)


def driver(source: str) -> str:
    """The host launcher of one kernel: ``rlx_launch(void** bufs, const int* P)`` runs threads
    ``0 .. P[0]-1`` (every rlx-metal kernel reads its grid size from ``P[0]``)."""
    m = _SIG.search(source)
    if m is None:
        raise IRError("rlx-metal: no kernel signature in the generated MSL", fix="report this bug")
    name, params = m.group(1), m.group(2)
    bufs = [p.split("[[")[0].strip() for p in params.split(",")
            if "[[buffer(" in p and "constant int* P" not in p]
    args = []
    for k, decl in enumerate(bufs):
        ctype = decl.rsplit("*", 1)[0].replace("device", "").strip() + "*"
        args.append(f"({ctype})b[{k}]")
    args += ["P", "g"]
    return (f'extern "C" void rlx_launch(void** b, const int* P) {{\n'
            f"  const uint n = (uint)P[0];\n"
            f"  for (uint g = 0; g < n; ++g) {name}({', '.join(args)});\n}}\n")


class HostCompiler(Compiler):
    """MSL + the generated driver -> one shared library per kernel (the kit caches and loads it)."""

    dialect = "msl-host"
    cache_name = "metal-host"
    about = "rlx-metal MSL-on-host shared libraries (dlopened)"
    suffix = ".so"

    def __init__(self, cxx: str) -> None:
        super().__init__()
        self.cxx = cxx
        self.label = f"rlx-metal: {cxx}"

    def identity(self) -> str:
        return "\0".join((self.cxx, tool_version(self.cxx), " ".join(FLAGS), msl.HEADER,
                           (INCLUDE / "metal_stdlib").read_text()))

    def build(self, source: str, out: Path) -> None:
        (out.parent / "kernels.metal").write_text(msl.module([source]))  # the exact MSL an Apple GPU gets
        cpp = out.parent / "host.cpp"
        cpp.write_text(f'#include "kernels.metal"\n\n{driver(source)}')
        self.run_tool([self.cxx, *FLAGS, "-I", str(INCLUDE), "-o", str(out), str(cpp)], source)

    def link(self, path: Path) -> ctypes.CDLL:
        lib = ctypes.CDLL(str(path))
        lib.rlx_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.rlx_launch.restype = None
        return lib


_COMPILERS: dict[str, HostCompiler] = {}


def forget() -> None:
    """Drop the loaded libraries' memo (the disk cache stays and is re-checked on the next use)."""
    for c in list(_COMPILERS.values()):
        c.forget()


def build_all(sources: Sequence[str]) -> dict[str, ctypes.CDLL]:
    """A loaded library per distinct kernel source (missing ones compiled in parallel)."""
    cxx = compiler()
    if cxx is None:
        raise IRError("rlx-metal (MSL on host) needs a C++ compiler: none of clang++/g++ was found",
                      fix="apt-get install g++ (or clang), or set RLX_METAL_CXX")
    with _LOCK:
        comp = _COMPILERS.setdefault(cxx, HostCompiler(cxx))
    return comp.load_all(sources)
