"""Build firmware with arm-none-eabi-gcc (cached by source hash) and run it on QEMU, sandboxed.

A build compiles the generated model, the kernel library, the I/O harness and the startup code into
``firmware.elf`` in ``<RLX cache dir>/cortexm/<hash>/`` (the hash covers every source byte, the flags
and the compiler's version), so a program that was built once, in any process, is reused.

A run (:func:`qemu_command`) gives the firmware nothing of the host but its own inputs and outputs,
because the firmware is compiled from an untrusted model file: no semihosting (its SYS_SYSTEM runs a
host shell command and its SYS_OPEN opens any host path, and QEMU cannot restrict either), no
network (``-nic none``), no monitor, and QEMU's seccomp sandbox where QEMU has one (no fork/exec).
QEMU loads ``rlx_in.bin`` into RAM at :data:`RLX_INBOX` + 4 and its length at :data:`RLX_INBOX`
(``-device loader``); the firmware sends the output bytes over UART0, which QEMU writes to
``rlx_out.bin``, prints ``rlx: stack <bytes>`` and ``rlx: exit <status>`` on UART1 (stdout), and ends
the run with a reset request (``-no-reboot``). See ``csrc/rlx_hostio.h``.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from .targets import CFLAGS, LDFLAGS, LIBS, Target, missing_reason, tool

CSRC = Path(__file__).with_name("csrc")
STATIC_FILES = ("rlx_types.h", "rlx_io.h", "rlx_kernels.h", "rlx_kernels.c", "rlx_hostio.h",
                "rlx_hostio.c", "rlx_startup.c", "rlx_main.c", "rlx_link.ld")
C_SOURCES = ("rlx_model.c", "rlx_kernels.c", "rlx_main.c", "rlx_startup.c", "rlx_hostio.c")
#: Where QEMU loads the input length (uint32) and then the bytes of rlx_in.bin: the INBOX region of
#: csrc/rlx_link.ld (the last MiB of SSRAM2/3, on every MPS2 board this backend targets).
RLX_INBOX = 0x20300000
RLX_INBOX_BYTES = 1 << 20
#: QEMU options of every run and of the exported Makefile: no semihosting (its SYS_SYSTEM and
#: SYS_OPEN reach the host), no network, no monitor, exit on the firmware's reset request.
QEMU_BASE_FLAGS = ("-display", "none", "-monitor", "none", "-serial", "file:rlx_out.bin", "-serial", "stdio",
                   "-nic", "none", "-no-reboot")
#: QEMU's seccomp sandbox (when built in): no fork/exec, no obsolete or privilege-changing calls.
QEMU_SANDBOX = ("-sandbox", "on,spawn=deny,obsolete=deny,elevateprivileges=deny,resourcecontrol=deny")
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


_PRIVATE: list[Path] = []


def cache_root() -> Path:
    """The authenticated ``cortexm`` cache directory, else a private per-process 0700 directory
    (removed at exit)."""
    from rlx_core.plugin import cache_subdir

    d = cache_subdir("cortexm", about="rlx-cortexm firmware builds")
    if d is not None:
        return d
    if not _PRIVATE:
        _PRIVATE.append(Path(tempfile.mkdtemp(prefix="rlx-cortexm-")))
        atexit.register(shutil.rmtree, _PRIVATE[0], True)
    return _PRIVATE[0]


def _ready(root: Path, final: Path, marker: str) -> bool:
    """Is the build ``final`` there and, in the cache, exactly what its authenticated manifest
    lists? (A planted or edited build is deleted and rebuilt; QEMU later loads the ELF from this
    directory, which only the user can write, so verify-then-load has no race.)"""
    from rlx_core.plugin import verify_tree

    if _PRIVATE and root == _PRIVATE[0]:
        return (final / marker).is_file()
    return verify_tree(final)


def _seal(root: Path, work: Path, final: Path) -> None:
    from rlx_core.plugin import seal_tree

    if not (_PRIVATE and root == _PRIVATE[0]):
        seal_tree(work, final.name)


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
    """The static part (kernels, harness, startup, host I/O) compiled once per target and compiler."""
    static = static_sources()
    h = hashlib.sha256(json.dumps([target.arch_flags, CFLAGS, _gcc_version(gcc)]).encode())
    for name in sorted(static):
        h.update(name.encode() + b"\0" + static[name].encode() + b"\0")
    key = "lib-" + h.hexdigest()[:32]
    root = cache_root()
    final = root / key
    with _lock(key):
        if _ready(root, final, "done"):
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
            _seal(root, work, final)
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
        if _ready(root, final, "firmware.json"):
            return Firmware(**json.loads(meta.read_text()))
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="build-", dir=root) as tmp:
            work = Path(tmp)
            for name, source in files.items():
                (work / name).write_text(source)
            res = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=600)
            if res.returncode != 0:
                raise FirmwareError(f"arm-none-eabi-gcc failed (exit {res.returncode}):\n"
                                    f"{res.stderr[-4000:]}")
            text, data, bss = _sizes(work / "firmware.elf")
            fw = Firmware(str(final / "firmware.elf"), target.key, text, data, bss, arena_bytes, stack_bytes)
            (work / "firmware.json").write_text(json.dumps(asdict(fw)))
            _seal(root, work, final)
            _publish(work, final)
        return Firmware(**json.loads(meta.read_text()))


@lru_cache(maxsize=4)
def has_sandbox(qemu: str) -> bool:
    """Whether this QEMU accepts ``-sandbox`` (built with seccomp, and seccomp allowed here)."""
    # Start an empty machine with the sandbox and quit it over QMP: the sandbox is applied at start.
    qmp = b'{"execute": "qmp_capabilities"}\n{"execute": "quit"}\n'
    try:
        res = subprocess.run([qemu, *QEMU_SANDBOX, "-M", "none", "-display", "none", "-nodefaults",
                              "-no-user-config", "-qmp", "stdio"], input=qmp, capture_output=True, timeout=30)
        return res.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def input_flags(in_bytes: int, in_file: str = "rlx_in.bin") -> list[str]:
    """QEMU options loading ``in_file`` (``in_bytes`` long) into the firmware's inbox."""
    flags = ["-device", f"loader,addr={RLX_INBOX:#x},data={in_bytes},data-len=4"]
    if in_bytes:  # the loader refuses an empty file
        flags += ["-device", f"loader,file={in_file},addr={RLX_INBOX + 4:#x},force-raw=on"]
    return flags


def qemu_command(target: Target, elf: str, qemu: str = "qemu-system-arm", *, in_bytes: int = 0,
                 sandbox: bool | None = None) -> list[str]:
    """The QEMU command line of one run, in a directory holding ``rlx_in.bin`` (``in_bytes`` long):
    the firmware writes ``rlx_out.bin`` there and its console to stdout. ``sandbox``: add QEMU's
    seccomp sandbox (default: when this QEMU has it)."""
    box = has_sandbox(qemu) if sandbox is None else sandbox
    return [qemu, *(QEMU_SANDBOX if box else ()), "-M", target.board, *QEMU_BASE_FLAGS,
            *input_flags(in_bytes), "-kernel", elf]


def parse_console(console: str) -> tuple[int | None, int]:
    """(exit status, stack peak bytes) from the firmware's console; ``None``/-1 when absent."""
    status, peak = None, -1
    for line in console.splitlines():
        if line.startswith("rlx: exit "):
            status = int(line.split()[-1]) if line.split()[-1].lstrip("-").isdigit() else None
        elif line.startswith("rlx: stack ") and line.split()[-1].isdigit():
            peak = int(line.split()[-1])
    return status, peak


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
    if len(data) > RLX_INBOX_BYTES - 4:
        raise FirmwareError(f"the inputs are {len(data)} bytes; the firmware's inbox holds "
                            f"{RLX_INBOX_BYTES - 4} (RLX_INBOX in rlx_cortexm.firmware and csrc/rlx_link.ld)")
    from .settings import TIMEOUT

    limit = timeout if timeout is not None else float(TIMEOUT.get())
    # A private directory (0700) of its own: QEMU opens only rlx_in.bin and rlx_out.bin in it.
    with tempfile.TemporaryDirectory(prefix="rlx-cortexm-run-") as tmp:
        work = Path(tmp)
        (work / "rlx_in.bin").write_bytes(data)
        t0 = time.perf_counter()
        try:
            res = subprocess.run(qemu_command(target, fw.elf, qemu, in_bytes=len(data)), cwd=work,
                                 stdin=subprocess.DEVNULL, capture_output=True, timeout=limit)
        except subprocess.TimeoutExpired as e:
            raise FirmwareError(f"QEMU ({target.board}) did not finish within {limit:.0f} s "
                                f"(RLX_CORTEXM_TIMEOUT)") from e
        console = (res.stdout + res.stderr).decode(errors="replace").strip()
        status, peak = parse_console(res.stdout.decode(errors="replace"))
        if res.returncode != 0 or status != 0:
            why = f"status {status}" if status is not None else f"QEMU status {res.returncode}"
            raise FirmwareError(f"the firmware on QEMU {target.board} exited with {why}"
                                f"{': ' + console[-2000:] if console else ''}")
        out = work / "rlx_out.bin"
        if not out.is_file():
            raise FirmwareError("the firmware wrote no rlx_out.bin"
                                f"{': ' + console[-2000:] if console else ''}")
        return RunResult(out.read_bytes(), peak, time.perf_counter() - t0)
