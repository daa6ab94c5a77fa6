"""The boards this backend builds for, the compiler flags, and where the toolchain is.

Each device of the backend is one (core, float ABI, QEMU board) triple:

======== ================= ================== ============================================
device   core              float ABI          QEMU machine
======== ================= ================== ============================================
cortexm:0 Cortex-M4F       hard, fpv4-sp-d16  ``mps2-an386``
cortexm:1 Cortex-M7        hard, fpv5-sp-d16  ``mps2-an500``
cortexm:2 Cortex-M4        soft               ``mps2-an386``
cortexm:3 Cortex-M3        soft (no DSP)      ``mps2-an385`` (the portable C kernels)
======== ================= ================== ============================================
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from . import settings

#: The Debian/Ubuntu package that provides each tool.
APT_PACKAGES = {"arm-none-eabi-gcc": "gcc-arm-none-eabi", "arm-none-eabi-size": "binutils-arm-none-eabi",
                "qemu-system-arm": "qemu-system-arm"}
_ENV = {"arm-none-eabi-gcc": settings.GCC, "arm-none-eabi-size": settings.SIZE,
        "qemu-system-arm": settings.QEMU}
INSTALL_HINT = "apt-get install gcc-arm-none-eabi qemu-system-arm"

#: Flags every build uses (the exported Makefile uses the same).
CFLAGS = ("-O2", "-std=c99", "-ffreestanding", "-fwrapv", "-fno-strict-aliasing", "-ffp-contract=off",
          "-fno-tree-loop-distribute-patterns", "-ffunction-sections", "-fdata-sections", "-Wall", "-Wextra",
          "-Wno-unused-parameter", "-Wno-unused-const-variable")
LDFLAGS = ("-nostdlib", "-Wl,--gc-sections", "-T", "rlx_link.ld")
LIBS = ("-lgcc",)


@dataclass(frozen=True)
class Target:
    key: str
    cpu: str
    board: str
    float_abi: str
    fpu: str | None
    description: str
    mhz: float

    @property
    def arch_flags(self) -> tuple[str, ...]:
        flags = (f"-mcpu={self.cpu}", "-mthumb", f"-mfloat-abi={self.float_abi}")
        return flags + ((f"-mfpu={self.fpu}",) if self.fpu else ())


TARGETS: tuple[Target, ...] = (
    Target("m4", "cortex-m4", "mps2-an386", "hard", "fpv4-sp-d16",
           "Cortex-M4F (DSP, single-precision FPU) on QEMU mps2-an386", 168.0),
    Target("m7", "cortex-m7", "mps2-an500", "hard", "fpv5-sp-d16",
           "Cortex-M7 (DSP, FPU) on QEMU mps2-an500", 216.0),
    Target("m4-soft", "cortex-m4", "mps2-an386", "soft", None,
           "Cortex-M4 (DSP, soft-float ABI) on QEMU mps2-an386", 168.0),
    Target("m3", "cortex-m3", "mps2-an385", "soft", None,
           "Cortex-M3 (no DSP, soft float: portable C kernels) on QEMU mps2-an385", 72.0),
)


def target(key_or_index: str | int) -> Target:
    if isinstance(key_or_index, int) or str(key_or_index).isdigit():
        return TARGETS[int(key_or_index)]
    for t in TARGETS:
        if t.key == key_or_index or t.cpu == key_or_index:
            return t
    raise KeyError(f"unknown Cortex-M target {key_or_index!r}; choose one of "
                   f"{', '.join(t.key for t in TARGETS)}")


def tool(name: str) -> str | None:
    """Path of ``name`` (or of the override in its RLX_CORTEXM_* variable), or None."""
    path = _ENV[name].get()
    if path is not None:
        override = str(path)
        return override if os.path.isfile(override) and os.access(override, os.X_OK) else None
    return shutil.which(name)


def missing_tools(*, need_qemu: bool = True) -> list[str]:
    names = ["arm-none-eabi-gcc", "arm-none-eabi-size"] + (["qemu-system-arm"] if need_qemu else [])
    return [n for n in names if tool(n) is None]


def missing_reason(*, need_qemu: bool = True) -> str | None:
    """Why the backend cannot build and run firmware here, naming the packages to install."""
    missing = missing_tools(need_qemu=need_qemu)
    if not missing:
        return None
    pkgs = sorted({APT_PACKAGES[m] for m in missing})
    return (f"{', '.join(missing)} not found on PATH: install the Debian/Ubuntu package(s) "
            f"{' '.join(pkgs)} (apt-get install {' '.join(pkgs)}), or point "
            f"{', '.join(_ENV[m].name for m in missing)} at the executables")
