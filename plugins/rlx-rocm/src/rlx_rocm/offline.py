"""Offline AMDGPU code objects: the generated HIP compiled by clang's AMDGPU back end, no ROCm needed.

``clang -x hip --cuda-device-only --offload-arch=ARCH -nogpuinc -nogpulib -c`` compiles the device
side and links it (lld) into the code object a ROCm loader takes (``hipModuleLoadData``): an ELF
shared object with ``e_machine == EM_AMDGPU`` and the target in ``e_flags``. :func:`inspect` reads
that header and the symbol table back, so a check can say the object really is amdgcn code for the
arch asked, with one kernel descriptor (``NAME.kd``) per generated kernel and no undefined symbol but
the ROCm device library functions the prelude maps math to.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlx_core.plugin import BackendNotFoundError, IRError

from .hip import OCML

#: The AMD targets every generated kernel is compiled for: MI200 (CDNA2) and MI300 (CDNA3).
ARCHS = ("gfx90a", "gfx942")
EM_AMDGPU = 224
#: EF_AMDGPU_MACH_* (the low byte of e_flags) of the targets we name, from LLVM's ELF.h.
MACH = {"gfx908": 0x030, "gfx90a": 0x03F, "gfx940": 0x040, "gfx941": 0x04B, "gfx942": 0x04C,
        "gfx1030": 0x036, "gfx1100": 0x041}
FLAGS = ("-x", "hip", "--cuda-device-only", "--no-gpu-bundle-output", "-nogpuinc", "-nogpulib",
         "-DRLX_HIP_OFFLINE=1", "-O3", "-Wno-tautological-compare", "-fno-fast-math", "-ffp-contract=off",
         "-c")
#: The device library functions stay undefined until a ROCm loader links ocml (see rlx_rocm.hip).
LINK_FLAGS = ("-Xoffload-linker", "--unresolved-symbols=ignore-all")
APT = "apt-get install -y clang-19 lld-19"


def find_clang() -> str | None:
    from .settings import CLANG

    want = CLANG.get()
    if want:
        return shutil.which(want) or (want if Path(want).is_file() else None)
    return shutil.which("clang-19") or shutil.which("clang")


def clang_or_raise() -> str:
    exe = find_clang()
    if exe is None:
        raise BackendNotFoundError("no clang with the AMDGPU back end (needed to build ROCm code objects "
                                   "offline)", fix=f"{APT}, or set RLX_ROCM_CLANG")
    return exe


@dataclass(frozen=True)
class CodeObject:
    """What a built code object holds, read back from its ELF."""

    arch: str
    machine: int
    mach: int
    kernels: tuple[str, ...]
    undefined: tuple[str, ...]
    nbytes: int

    @property
    def is_amdgcn(self) -> bool:
        return self.machine == EM_AMDGPU and self.mach == MACH.get(self.arch, -1)


def inspect(data: bytes, arch: str) -> CodeObject:
    """The header and symbols of an ELF64 little-endian code object."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise IRError(f"the {arch} build is not an ELF64 code object", fix="report this bug")
    machine = struct.unpack_from("<H", data, 18)[0]
    flags = struct.unpack_from("<I", data, 48)[0]
    shoff = struct.unpack_from("<Q", data, 40)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 58)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + k * shentsize) for k in range(shnum)]
    kernels: set[str] = set()
    undefined: set[str] = set()
    for _, sh_type, _, _, off, size, link, _, _, entsize in secs:
        if sh_type not in (2, 11):  # SHT_SYMTAB, SHT_DYNSYM
            continue
        str_off = secs[link][4]
        for k in range(size // (entsize or 24)):
            name_off, info, _, shndx, _, _ = struct.unpack_from("<IBBHQQ", data, off + k * (entsize or 24))
            end = data.index(b"\0", str_off + name_off)
            name = data[str_off + name_off:end].decode()
            if not name:
                continue
            if shndx == 0:
                undefined.add(name)
            elif name.endswith(".kd"):
                kernels.add(name[:-3])
    return CodeObject(arch, machine, flags & 0xFF, tuple(sorted(kernels)), tuple(sorted(undefined)),
                      len(data))


def build(text: str, arch: str, *, clang: str | None = None) -> tuple[bytes, CodeObject]:
    """Compile one HIP translation unit for ``arch`` into a code object; raise :class:`IRError`
    quoting clang when it does not compile, or when the object is not amdgcn code for ``arch`` or
    imports anything but the device library functions."""
    exe = clang or clang_or_raise()
    with tempfile.TemporaryDirectory(prefix="rlx-rocm-") as tmp:
        src, out = Path(tmp) / "kernels.hip", Path(tmp) / f"kernels-{arch}.hsaco"
        src.write_text(text)
        r = subprocess.run([exe, *FLAGS, f"--offload-arch={arch}", str(src), "-o", str(out), *LINK_FLAGS],
                           capture_output=True, text=True)
        if r.returncode != 0 or not out.is_file():
            said = (r.stdout + r.stderr)[-3000:]
            raise IRError(f"clang ({exe}) rejected the generated HIP for {arch}:\n{said}",
                          where=f"rocm kernels for {arch}",
                          fix="report this bug with the kernel source (RLX_DISPATCH_REPORT=1 names the node)")
        data = out.read_bytes()
    co = inspect(data, arch)
    if not co.is_amdgcn:
        raise IRError(f"the {arch} build is not an amdgcn code object for {arch} (e_machine {co.machine}, "
                      f"mach {co.mach:#x})", fix="check RLX_ROCM_CLANG names an LLVM clang with AMDGPU")
    stray = sorted(set(co.undefined) - set(OCML.values()))
    if stray:
        raise IRError(f"the {arch} code object needs symbols no ROCm device library provides: {stray}",
                      fix="report this bug: a generated kernel calls a function the prelude does not map")
    return data, co
