"""MSL on host: the exact MSL rlx-metal generates, compiled as C++17 with a small ``metal_stdlib``
compatibility header (``include/metal_stdlib``) and a generated driver that runs the kernel once per
thread of the grid (``thread_position_in_grid`` becomes the loop index). Each kernel becomes one
shared library (cached on disk by source hash, authenticated before every dlopen: see
:mod:`rlx_core.cache`), loaded with ctypes.

This mode checks the generated MSL's semantics on any machine with clang++ or g++; it says nothing
about the Apple GPU (performance, fast-math, Metal compiler acceptance).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlx_core.errors import IRError

from . import msl

INCLUDE = Path(__file__).resolve().parent / "include"
FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-w", "-fno-fast-math", "-ffp-contract=off")
_LIBS: dict[str, ctypes.CDLL] = {}
_LOCK = threading.Lock()


def compiler() -> str | None:
    """The C++ compiler used (``RLX_METAL_CXX``, else clang++, else g++), or None."""
    from .settings import CXX

    env: str | None = CXX.get()
    if env:
        return shutil.which(env)
    return shutil.which("clang++") or shutil.which("g++")


def cache_dir() -> Path | None:
    """The authenticated ``metal-host`` cache directory, or None (libraries then built per process)."""
    from rlx_core.cache import cache_subdir

    return cache_subdir("metal-host", about="rlx-metal MSL-on-host shared libraries (dlopened)")


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


def _build(source: str, cxx: str) -> ctypes.CDLL:
    unit = msl.module([source])
    key = hashlib.sha256((cxx + " ".join(FLAGS) + (INCLUDE / "metal_stdlib").read_text() + unit)
                         .encode()).hexdigest()[:24]
    with _LOCK:
        lib = _LIBS.get(key)
    if lib is not None:
        return lib
    from rlx_core.cache import publish_file, verify_file

    d = cache_dir()
    so = d / f"k_{key}.so" if d is not None else None
    # A cached library is dlopened only after its MAC sidecar matched (a planted or edited one is
    # deleted and rebuilt); race-free because only the user can write the cache directory.
    if so is None or not verify_file(so):
        with tempfile.TemporaryDirectory(dir=d) as tmp:
            metal = Path(tmp) / "kernels.metal"
            metal.write_text(unit)  # the exact MSL an Apple GPU would get
            cpp = Path(tmp) / "host.cpp"
            cpp.write_text(f'#include "kernels.metal"\n\n{driver(source)}')
            out = Path(tmp) / "k.so"
            r = subprocess.run([cxx, *FLAGS, "-I", str(INCLUDE), "-o", str(out), str(cpp)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise IRError(f"rlx-metal: {cxx} rejected the generated MSL:\n{r.stderr[-2000:]}",
                              fix="report this bug with the kernel source")
            if so is None or not publish_file(out, so):
                lib = ctypes.CDLL(str(out))  # no cache: loaded from the private temporary directory
                return _register(key, lib)
    return _register(key, ctypes.CDLL(str(so)))


def _register(key: str, lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.rlx_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.rlx_launch.restype = None
    with _LOCK:
        _LIBS[key] = lib
    return lib


def build_all(sources: Sequence[str]) -> dict[str, ctypes.CDLL]:
    """A loaded library per distinct kernel source (missing ones compiled in parallel)."""
    cxx = compiler()
    if cxx is None:
        raise IRError("rlx-metal (MSL on host) needs a C++ compiler: none of clang++/g++ was found",
                      fix="apt-get install g++ (or clang), or set RLX_METAL_CXX")
    uniq = list(dict.fromkeys(sources))
    if len(uniq) <= 1:
        return {s: _build(s, cxx) for s in uniq}
    with ThreadPoolExecutor(max_workers=min(len(uniq), os.cpu_count() or 2)) as ex:
        libs = list(ex.map(lambda s: _build(s, cxx), uniq))
    return dict(zip(uniq, libs))
