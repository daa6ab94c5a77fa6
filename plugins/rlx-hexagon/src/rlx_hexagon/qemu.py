"""Executing the generated C under ``qemu-hexagon`` (QEMU's Linux user-mode emulator, Debian's
``qemu-user``): the one Hexagon *execution* available here, with a limit worth stating up front.

QEMU 7.2 (Debian 12) emulates the scalar Hexagon V67 ISA and V66-era HVX, not the V68+ HVX floating
point (``qf32``/``sf`` vector ops) that clang emits for f32 kernels on ``hexagonv73``: such an object
dies in QEMU's decoder. So the executable build here is the **same generated C** (prelude, kernels,
``rlx_model_run``) compiled for ``-mcpu=hexagonv67`` *without* HVX, linked by lld with a freestanding
``_start`` (no libc exists for Hexagon here) that reads the constants and the arena image from stdin
through raw Linux syscalls (``trap0``), runs the model and writes the arena back to stdout. It checks
what the C computes on a Hexagon core (scalar code paths); the HVX object is compiled and
disassembled (:mod:`rlx_hexagon.check`), never executed. Nothing here makes ``hexagon:0`` available
or certifies the backend.

Several programs share one executable (:func:`build_executables`: clang and lld are most of the
cost); a header on stdin picks the program. :func:`conformance_sweep` runs every conformance case
the backend claims this way through the suite's own comparison (``rlx hexagon-qemu-check``).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx_core.plugin import BackendNotFoundError, InputError, IRError, PluginError, RLXError

from .build import find_clang, program_parts
from .codegen import PRELUDE

APT = "apt-get install -y qemu-user clang-19 lld-19"
#: the newest core QEMU 7.2 decodes; no -mhvx (see the module docstring)
CPU = "hexagonv67"
FLAGS = ("--target=hexagon-unknown-linux-musl", f"-mcpu={CPU}", "-ffreestanding", "-nostdlib", "-static",
         "-fuse-ld=lld", "-O3", "-fno-fast-math", "-ffp-contract=off", "-Wno-tautological-compare")

# Linux syscall numbers of the generic table Hexagon uses: read 63, write 64, exit_group 94.
HARNESS = r"""/* rlx-hexagon qemu harness. stdin: a header of three uint32 (which program, constant bytes,
   arena bytes), the constants, the arena image; stdout: the arena after the run. */
#include <stdint.h>
extern void rlx_model_run_any(uint32_t k, unsigned char *arena, const unsigned char *consts);
static unsigned char rlx_consts[RLX_CONSTANT_BYTES + 1] __attribute__((aligned(128)));
static unsigned char rlx_arena[RLX_ARENA_BYTES + 1] __attribute__((aligned(128)));
static uint32_t rlx_head[3];
static long rlx_sys(long n, long a, long b, long c) {
  register long r0 __asm__("r0") = a;
  register long r1 __asm__("r1") = b;
  register long r2 __asm__("r2") = c;
  register long r6 __asm__("r6") = n;
  __asm__ volatile("trap0(#1)" : "+r"(r0) : "r"(r1), "r"(r2), "r"(r6) : "memory");
  return r0;
}
static int rlx_io(long n, long fd, unsigned char *p, long len) {
  while (len > 0) {
    const long r = rlx_sys(n, fd, (long)p, len);
    if (r <= 0) return 1;
    p += r;
    len -= r;
  }
  return 0;
}
void _start(void) {
  if (rlx_io(63, 0, (unsigned char *)rlx_head, sizeof rlx_head) || rlx_head[1] > RLX_CONSTANT_BYTES ||
      rlx_head[2] > RLX_ARENA_BYTES || rlx_io(63, 0, rlx_consts, rlx_head[1]) ||
      rlx_io(63, 0, rlx_arena, rlx_head[2]))
    rlx_sys(94, 2, 0, 0);
  rlx_model_run_any(rlx_head[0], rlx_arena, rlx_consts);
  rlx_sys(94, rlx_io(64, 1, rlx_arena, rlx_head[2]) ? 3 : 0, 0, 0);
  for (;;) {}
}
"""


def find_qemu() -> str | None:
    return shutil.which("qemu-hexagon")


@dataclass
class QemuProgram:
    """A lowered program built as a static Hexagon V67 executable; :meth:`run` executes it."""

    program: Any
    elf: bytes
    index: int
    constants: bytes
    constant_offsets: dict[str, int]
    qemu: str

    def run(self, inputs: Mapping[str, np.ndarray], *, timeout: float = 60.0) -> dict[str, np.ndarray]:
        """Outputs keyed by value name, as ``rlx_compile``'s programs return them."""
        p = self.program
        g = p.graph
        arena = bytearray(int(p.plan.arena_bytes))
        for v in p.inputs:
            if v.name not in inputs:
                raise InputError(f"missing input {v.name!r}", where="rlx-hexagon qemu run",
                                 fix=f"pass every input: {[x.name for x in p.inputs]}")
            t = g.types[v.name]
            raw = np.ascontiguousarray(np.asarray(inputs[v.name], dtype=t.dtype.np)).tobytes()
            off = int(p.plan.offsets[v.name])
            arena[off:off + len(raw)] = raw
        with tempfile.TemporaryDirectory(prefix="rlx-hexagon-qemu-") as tmp:
            exe = Path(tmp) / "rlx_model.elf"
            exe.write_bytes(self.elf)
            exe.chmod(0o755)
            head = struct.pack("<3I", self.index, len(self.constants), len(arena))
            r = subprocess.run([self.qemu, str(exe)], input=head + self.constants + bytes(arena),
                               capture_output=True, timeout=timeout)
        if r.returncode != 0 or len(r.stdout) != len(arena):
            raise PluginError(f"the Hexagon executable failed under {self.qemu} (exit {r.returncode}, "
                              f"{len(r.stdout)} of {len(arena)} arena bytes back): "
                              f"{r.stderr.decode(errors='replace')[-1500:]}", fix="report this bug")
        out: dict[str, np.ndarray] = {}
        for _, v in p.outputs:
            t = g.types[v]
            shape = tuple(int(d) for d in t.shape)
            count = int(np.prod(shape, dtype=np.int64))
            src, off = ((self.constants, self.constant_offsets[v]) if v in self.constant_offsets
                        else (r.stdout, int(p.plan.offsets[v])))
            out[v] = np.frombuffer(src, dtype=t.dtype.np, count=count, offset=off).reshape(shape).copy()
        return out


def build_executable(program: Any) -> QemuProgram:
    """Compile ``program``'s C and the harness for Hexagon V67 (scalar) and link them statically."""
    return build_executables([program])[0]


def build_executables(programs: Sequence[Any]) -> list[QemuProgram]:
    """Several programs in one static V67 executable (one clang and lld run: most of the cost),
    each kernel function once; the header sent on stdin picks the program."""
    clang, qemu = find_clang(), find_qemu()
    if clang is None or qemu is None:
        raise BackendNotFoundError("executing Hexagon code needs clang-19 (with lld) and qemu-hexagon",
                                   fix=APT)
    funcs: dict[str, str] = {}
    runs: list[str] = []
    helds: list[dict[str, Any]] = []
    for k, program in enumerate(programs):
        fs, calls, held = program_parts(program)
        for name, body in fs.items():
            funcs.setdefault(name, body)
        runs += [f"static void rlx_model_run_{k}(unsigned char *arena, const unsigned char *consts) {{",
                 "  (void)arena; (void)consts;", *calls, "}"]
        helds.append(held)
    cases = [f"  case {k}: rlx_model_run_{k}(arena, consts); break;" for k in range(len(programs))]
    any_run = "void rlx_model_run_any(uint32_t k, unsigned char *arena, const unsigned char *consts) {"
    text = "\n".join([PRELUDE, *funcs.values(), *runs, any_run, "  switch (k) {", *cases, "  default: break;",
                      "  }", "}"]) + "\n"
    arena = max([int(h["arena_bytes"]) for h in helds] or [0])
    consts = max([len(h["constants"]) for h in helds] or [0])
    with tempfile.TemporaryDirectory(prefix="rlx-hexagon-qemu-") as tmp:
        src, harness, exe = Path(tmp) / "rlx_model.c", Path(tmp) / "harness.c", Path(tmp) / "rlx_model.elf"
        src.write_text(text)
        harness.write_text(HARNESS)
        defs = [f"-DRLX_ARENA_BYTES={arena}", f"-DRLX_CONSTANT_BYTES={consts}"]
        r = subprocess.run([clang, *FLAGS, *defs, str(src), str(harness), "-o", str(exe)],
                           capture_output=True, text=True)
        if r.returncode != 0 or not exe.is_file():
            raise IRError(f"clang ({clang}) could not build the Hexagon V67 executable:\n"
                          f"{(r.stdout + r.stderr)[-3000:]}", where="hexagon qemu build",
                          fix="report this bug with the kernel source")
        elf = exe.read_bytes()
    return [QemuProgram(p, elf, k, h["constants"], dict(h["constant_offsets"]), qemu)
            for k, (p, h) in enumerate(zip(programs, helds))]


class _Executable:
    """What the conformance suite's ``run_case`` runs: outputs keyed by public name."""

    report = None

    def __init__(self, built: QemuProgram) -> None:
        self.built = built

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        got = self.built.run(feed)
        return {public: got[v] for public, v in self.built.program.outputs}


class _Prebuilt:
    """A "session" whose compile hands back the executable built for that case beforehand."""

    def __init__(self, exe: _Executable) -> None:
        self.exe = exe

    def compile(self, graph: Any) -> _Executable:
        return self.exe


@dataclass
class SweepResult:
    counts: dict[str, int]
    failures: list[tuple[str, str]]
    seconds: float

    def summary(self) -> dict[str, Any]:
        return {"verdict": f"executed as scalar {CPU} code under qemu-hexagon (not the HVX build; "
                           "no certificate)",
                **self.counts, "failures": [{"case": c, "message": m} for c, m in self.failures],
                "seconds": round(self.seconds, 1)}


def conformance_sweep(keep: Callable[[Any], bool] | None = None, *, batch: int = 100,
                      log: Callable[[str], None] | None = None) -> SweepResult:
    """Every conformance op and HIR case ``hexagon:0`` claims, built for scalar V67 (``batch``
    programs per executable), run under qemu-hexagon and compared by the suite's own
    :func:`run_case` (its tolerances, NaN and signed-zero rules)."""
    import time

    from rlx_conformance.cases import all_cases, build_case_graph, hir_cases, run_case

    from rlx_core.plugin import DispatchError, Session

    t = time.perf_counter()
    session = Session("hexagon:0", use_cache=False, lower_only=True)
    counts = {"cases": 0, "not_claimed": 0, "passed": 0, "failed": 0, "error": 0}
    failures: list[tuple[str, str]] = []
    claimed: list[tuple[Any, Any]] = []
    for case in [*all_cases(), *hir_cases()]:
        if case.kind == "out_of_range" or (keep is not None and not keep(case)):
            continue  # out_of_range cases check the host's index validation, not kernels
        counts["cases"] += 1
        try:
            claimed.append((case, session.lower(build_case_graph(case), {})))
        except DispatchError:
            counts["not_claimed"] += 1

    def record(case: Any, status: str, message: str) -> None:
        counts[status] += 1
        if status != "passed":
            failures.append((case.id, message[:500]))
            if log:
                log(f"{status.upper()} {case.id}: {message[:300]}")

    for k in range(0, len(claimed), batch):
        part = claimed[k:k + batch]
        try:
            built = build_executables([p for _, p in part])
        except RLXError as e:
            for case, _ in part:
                record(case, "error", f"building the executable failed: {e.what}")
            continue
        for (case, _), q in zip(part, built):
            res = run_case(case, _Prebuilt(_Executable(q)))
            record(case, res.status, res.message)
    return SweepResult(counts, failures, time.perf_counter() - t)
