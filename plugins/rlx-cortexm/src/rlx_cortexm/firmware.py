"""Build firmware with arm-none-eabi-gcc (cached by source hash) and run it on QEMU with semihosting.

A build compiles the generated model, the kernel library, the semihosting harness and the startup
code into ``firmware.elf`` in ``<RLX cache dir>/cortexm/<hash>/`` (the hash covers every source byte,
the flags and the compiler's version), so a program that was built once, in any process, is reused.
A run starts ``qemu-system-arm -M <board> -nographic -semihosting-config enable=on,target=native``
in a fresh temporary directory holding ``rlx_in.bin``; the firmware writes ``rlx_out.bin`` and exits
with status 0.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from .targets import CFLAGS, LDFLAGS, LIBS, Target, missing_reason, tool

CSRC = Path(__file__).with_name("csrc")
STATIC_FILES = ("rlx_types.h", "rlx_io.h", "rlx_kernels.h", "rlx_kernels.c", "rlx_semihost.h",
                "rlx_semihost.c", "rlx_startup.c", "rlx_main.c", "rlx_link.ld")
C_SOURCES = ("rlx_model.c", "rlx_kernels.c", "rlx_main.c", "rlx_startup.c", "rlx_semihost.c")
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


class FirmwareError(RuntimeError):
    pass


@dataclass(frozen=True)
class Firmware:
    """A built ELF and its section sizes (``arm-none-eabi-size``, Berkeley format)."""

    elf: str
    target: str
    text: int
    data: int
    bss: int
    arena_bytes: int
    stack_bytes: int

    @property
    def flash_bytes(self) -> int:
        """Code + constants + .data initial values: what is programmed into flash."""
        return self.text + self.data

    @property
    def ram_bytes(self) -> int:
        """.data + .bss (the arena and the reserved stack included)."""
        return self.data + self.bss

    def summary(self) -> dict[str, int | str]:
        d = asdict(self)
        d.update(flash_bytes=self.flash_bytes, ram_bytes=self.ram_bytes)
        return d


def static_sources() -> dict[str, str]:
    return {name: (CSRC / name).read_text() for name in STATIC_FILES}


@lru_cache(maxsize=4)
def _gcc_version(gcc: str) -> str:
    try:
        res = subprocess.run([gcc, "--version"], capture_output=True, text=True, timeout=30)
        return res.stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def cache_root() -> Path:
    from rlx_core.cache import default_cache_dir

    return default_cache_dir() / "cortexm"


def _lock(key: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(key, threading.Lock())


def _need(need_qemu: bool) -> None:
    why = missing_reason(need_qemu=need_qemu)
    if why:
        raise FirmwareError(why)


def compile_command(target: Target, gcc: str = "arm-none-eabi-gcc", out: str = "firmware.elf") -> list[str]:
    return [gcc, *target.arch_flags, *CFLAGS, *C_SOURCES, *target.arch_flags, *LDFLAGS, *LIBS, "-o", out]


def _sizes(elf: Path) -> tuple[int, int, int]:
    size = tool("arm-none-eabi-size")
    assert size is not None
    out = subprocess.run([size, "-B", str(elf)], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise FirmwareError(f"arm-none-eabi-size failed: {out.stderr.strip()}")
    text, data, bss = (int(v) for v in out.stdout.splitlines()[1].split()[:3])
    return text, data, bss


def _library(target: Target, gcc: str) -> Path:
    """The static part (kernels, harness, startup, semihosting) compiled once per target and compiler."""
    static = static_sources()
    h = hashlib.sha256(json.dumps([target.arch_flags, CFLAGS, _gcc_version(gcc)]).encode())
    for name in sorted(static):
        h.update(name.encode() + b"\0" + static[name].encode() + b"\0")
    key = "lib-" + h.hexdigest()[:32]
    root = cache_root()
    final = root / key
    with _lock(key):
        if (final / "done").is_file():
            return final
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="build-", dir=root) as tmp:
            work = Path(tmp)
            for name, text in static.items():
                (work / name).write_text(text)
            srcs = [n for n in C_SOURCES if n in static]
            res = subprocess.run([gcc, *target.arch_flags, *CFLAGS, "-c", *srcs], cwd=work,
                                 capture_output=True, text=True, timeout=600)
            if res.returncode != 0:
                raise FirmwareError(f"arm-none-eabi-gcc failed on the kernel library (exit "
                                    f"{res.returncode}):\n{res.stderr[-4000:]}")
            (work / "done").write_text("ok")
            _publish(work, final)
        return final


def _publish(work: Path, final: Path) -> None:
    """Move a finished build directory into place (atomically); keep an existing one."""
    try:
        os.replace(work, final)
    except OSError:
        if not final.is_dir():
            raise
    os.makedirs(work, exist_ok=True)  # TemporaryDirectory removes it again


def build(model_files: dict[str, str], target: Target, arena_bytes: int, *,
          stack_bytes: int = 1024) -> Firmware:
    """Compile and link (or reuse the cached ELF of the same sources, flags and compiler)."""
    _need(need_qemu=False)
    gcc = tool("arm-none-eabi-gcc")
    assert gcc is not None
    lib = _library(target, gcc)
    files = {**static_sources(), **model_files}
    objs = [str(lib / n.replace(".c", ".o")) for n in C_SOURCES if n not in model_files]
    srcs = [n for n in C_SOURCES if n in model_files]
    cmd = [gcc, *target.arch_flags, *CFLAGS, *srcs, *objs, *target.arch_flags, *LDFLAGS, *LIBS,
           f"-Wl,--defsym=RLX_STACK_SIZE={stack_bytes}", "-o", "firmware.elf"]
    h = hashlib.sha256()
    h.update(json.dumps([cmd[1:], _gcc_version(gcc), target.key]).encode())
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    key = h.hexdigest()[:32]
    root = cache_root()
    final = root / key
    meta = final / "firmware.json"
    with _lock(key):
        if meta.is_file():
            return Firmware(**json.loads(meta.read_text()))
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="build-", dir=root) as tmp:
            work = Path(tmp)
            for name, text in files.items():
                (work / name).write_text(text)
            res = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=600)
            if res.returncode != 0:
                raise FirmwareError(f"arm-none-eabi-gcc failed (exit {res.returncode}):\n"
                                    f"{res.stderr[-4000:]}")
            text, data, bss = _sizes(work / "firmware.elf")
            fw = Firmware(str(final / "firmware.elf"), target.key, text, data, bss, arena_bytes, stack_bytes)
            (work / "firmware.json").write_text(json.dumps(asdict(fw)))
            _publish(work, final)
        return Firmware(**json.loads(meta.read_text()))


def qemu_command(target: Target, elf: str, qemu: str = "qemu-system-arm") -> list[str]:
    return [qemu, "-M", target.board, "-nographic", "-monitor", "none",
            "-semihosting-config", "enable=on,target=native", "-kernel", elf]


@dataclass(frozen=True)
class RunResult:
    output: bytes
    #: the deepest stack use of the run (the startup code paints the stack), or -1 if unknown
    stack_peak_bytes: int
    seconds: float


def run(fw: Firmware, target: Target, data: bytes, *, timeout: float | None = None) -> RunResult:
    """Run ``fw`` once on QEMU with ``data`` as ``rlx_in.bin``; returns ``rlx_out.bin`` and statistics."""
    _need(need_qemu=True)
    qemu = tool("qemu-system-arm")
    assert qemu is not None
    limit = timeout if timeout is not None else float(os.environ.get("RLX_CORTEXM_TIMEOUT", "300"))
    with tempfile.TemporaryDirectory(prefix="rlx-cortexm-run-") as tmp:
        work = Path(tmp)
        (work / "rlx_in.bin").write_bytes(data)
        t0 = time.perf_counter()
        try:
            res = subprocess.run(qemu_command(target, fw.elf, qemu), cwd=work, stdin=subprocess.DEVNULL,
                                 capture_output=True, timeout=limit)
        except subprocess.TimeoutExpired as e:
            raise FirmwareError(f"QEMU ({target.board}) did not finish within {limit:.0f} s "
                                f"(RLX_CORTEXM_TIMEOUT)") from e
        console = (res.stdout + res.stderr).decode(errors="replace").strip()
        if res.returncode != 0:
            raise FirmwareError(f"the firmware on QEMU {target.board} exited with status {res.returncode}"
                                f"{': ' + console[-2000:] if console else ''}")
        out = work / "rlx_out.bin"
        if not out.is_file():
            raise FirmwareError("the firmware wrote no rlx_out.bin"
                                f"{': ' + console[-2000:] if console else ''}")
        stats = work / "rlx_stats.bin"
        peak = int.from_bytes(stats.read_bytes()[:4], "little") if stats.is_file() else -1
        return RunResult(out.read_bytes(), peak, time.perf_counter() - t0)
