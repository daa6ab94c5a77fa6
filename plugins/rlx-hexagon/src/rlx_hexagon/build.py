"""Whole programs as one C file, and clang's Hexagon back end over it.

:func:`program_c` writes an LIR program as the prelude, one function per distinct kernel and
``rlx_model_run(arena, consts)`` calling them in order on the planned arena (a step's node is named
in an escaped comment above its call). :func:`compile_c` compiles C for Hexagon with 128-byte HVX
and reads the object back (:func:`inspect`): ELF32, ``EM_HEXAGON``, its sections' sizes, its function
symbols, and no undefined symbol (freestanding: nothing to link against).
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx_core.plugin import BackendNotFoundError, IRError, safe_comment

from .codegen import ALIGN, PRELUDE, step_calls, stype

EM_HEXAGON = 164
APT = "apt-get install -y clang-19 lld-19"


def flags(cpu: str | None = None, *, hvx: bool = True) -> list[str]:
    """clang's arguments; ``hvx=False`` builds scalar code only (what QEMU 7.2 can run, rlx_hexagon.qemu)."""
    from .settings import CPU

    # -hexagon-autohvx: without it LLVM's loop vectoriser never targets HVX (scalar code only).
    vec = ["-mhvx", "-mhvx-length=128B"] if hvx else []
    auto = ["-mllvm", "-hexagon-autohvx"] if hvx else []
    return ["--target=hexagon", f"-mcpu={cpu or CPU.get()}", *vec, "-ffreestanding", "-O3", "-fno-fast-math",
            "-ffp-contract=off", "-Wno-tautological-compare", *auto, "-c"]


def find_clang() -> str | None:
    from .settings import CLANG

    want = CLANG.get()
    if want:
        return shutil.which(want) or (want if Path(want).is_file() else None)
    return shutil.which("clang-19") or shutil.which("clang")


@dataclass(frozen=True)
class HexObject:
    machine: int
    sections: dict[str, int]
    functions: tuple[str, ...]
    undefined: tuple[str, ...]

    @property
    def is_hexagon(self) -> bool:
        return self.machine == EM_HEXAGON


def inspect(data: bytes) -> HexObject:
    """The machine, section sizes and symbols of an ELF32 little-endian object."""
    if data[:4] != b"\x7fELF" or data[4] != 1 or data[5] != 1:
        raise IRError("the Hexagon build is not an ELF32 object", fix="report this bug")
    machine = struct.unpack_from("<H", data, 18)[0]
    shoff = struct.unpack_from("<I", data, 32)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 46)
    secs = [struct.unpack_from("<IIIIIIIIII", data, shoff + k * shentsize) for k in range(shnum)]
    names_off = secs[shstrndx][4]

    def cstr(off: int) -> str:
        return data[off:data.index(b"\0", off)].decode()

    sections = {cstr(names_off + s[0]): s[5] for s in secs if s[1] != 0}
    functions, undefined = set(), set()
    for _, sh_type, _, _, off, size, link, _, _, entsize in secs:
        if sh_type != 2:  # SHT_SYMTAB
            continue
        str_off = secs[link][4]
        for k in range(size // (entsize or 16)):
            name_off, _, _, info, _, shndx = struct.unpack_from("<IIIBBH", data, off + k * (entsize or 16))
            name = cstr(str_off + name_off)
            if not name:
                continue
            if shndx == 0 and info >> 4:  # global undefined
                undefined.add(name)
            elif info & 0xF == 2:  # STT_FUNC
                functions.add(name)
    return HexObject(machine, sections, tuple(sorted(functions)), tuple(sorted(undefined)))


def compile_c(text: str, *, cpu: str | None = None, hvx: bool = True,
              keep: Path | None = None) -> tuple[bytes, HexObject]:
    """Compile C for Hexagon HVX; :class:`IRError` quoting clang when it does not compile, or when the
    object is not Hexagon code or needs any symbol from outside."""
    exe = find_clang()
    if exe is None:
        raise BackendNotFoundError("no clang with the Hexagon back end",
                                   fix=f"{APT}, or set RLX_HEXAGON_CLANG")
    with tempfile.TemporaryDirectory(prefix="rlx-hexagon-") as tmp:
        src, out = Path(tmp) / "rlx_model.c", Path(tmp) / "rlx_model.o"
        src.write_text(text)
        r = subprocess.run([exe, *flags(cpu, hvx=hvx), str(src), "-o", str(out)], capture_output=True,
                           text=True)
        if r.returncode != 0 or not out.is_file():
            said = (r.stdout + r.stderr)[-3000:]
            raise IRError(f"clang ({exe}) rejected the generated Hexagon C:\n{said}", where="hexagon kernels",
                          fix="report this bug with the kernel source (RLX_DISPATCH_REPORT=1 names the node)")
        data = out.read_bytes()
    obj = inspect(data)
    if not obj.is_hexagon:
        raise IRError(f"the build is not a Hexagon object (e_machine {obj.machine})",
                      fix="check RLX_HEXAGON_CLANG names an LLVM clang with the Hexagon target")
    if obj.undefined:
        raise IRError(f"the freestanding Hexagon object needs outside symbols: {list(obj.undefined)}",
                      fix="report this bug: generated C must not call libc/libm")
    if keep is not None:
        keep.write_bytes(data)
    return data, obj


def find_objdump() -> str | None:
    return shutil.which("llvm-objdump-19") or shutil.which("llvm-objdump")


#: an HVX operand in llvm-objdump's Hexagon syntax: a vector register (v0..v31, pairs v1:0, with a
#: type suffix such as .sf/.qf32), a vector predicate (q0..q3), or an HVX load/store (vmem)
HVX_OPERAND = re.compile(r"\b(?:v\d{1,2}(?::\d{1,2})?(?:\.\w+)?|q[0-3])\b|\bvmem\(")


def hvx_counts(data: bytes) -> dict[str, int]:
    """HVX instructions per function of a Hexagon object, from llvm-objdump's disassembly (the proof
    that clang vectorised a kernel, not only that it compiled)."""
    exe = find_objdump()
    if exe is None:
        raise BackendNotFoundError("no llvm-objdump to disassemble the Hexagon object", fix=f"{APT} llvm-19")
    with tempfile.TemporaryDirectory(prefix="rlx-hexagon-") as tmp:
        obj = Path(tmp) / "k.o"
        obj.write_bytes(data)
        r = subprocess.run([exe, "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True)
    if r.returncode != 0:
        raise IRError(f"{exe} could not disassemble the Hexagon object: {r.stderr[-1000:]}",
                      fix="report this bug")
    counts: dict[str, int] = {}
    fn = ""
    for line in r.stdout.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if head:
            fn = head.group(1)
            counts.setdefault(fn, 0)
        elif fn and "\t" in line and HVX_OPERAND.search(line.split("\t", 1)[1]):
            counts[fn] += 1
    return counts


def constants(program: Any) -> tuple[dict[str, int], bytes]:
    """Every weight's offset in one 64-byte aligned blob, and the blob."""
    g = program.graph
    offs: dict[str, int] = {}
    blob = bytearray()
    for p in g.params:
        arr = np.ascontiguousarray(np.asarray(g.weights[p.name], dtype=p.type.dtype.np))
        offs[p.name] = len(blob)
        blob += arr.tobytes()
        blob += b"\0" * ((-len(blob)) % ALIGN)
    return offs, bytes(blob)


def step_functions(program: Any) -> list[tuple[Any, list[tuple[str, str, list[str]]]]]:
    return [(s, step_calls(s, program.graph.types)) for s in program.kernels]


def program_parts(program: Any) -> tuple[dict[str, str], list[str], dict[str, Any]]:
    """A program's kernel functions (name -> source), the body of its run function (one call per
    step on the planned arena, the node named in an escaped comment) and what it holds."""
    offs, blob = constants(program)
    types = program.graph.types
    funcs: dict[str, str] = {}
    calls: list[str] = []
    for step, lowered in step_functions(program):
        calls.append(f"  /* node {safe_comment(step.node, 'c')} ({step.kernel}) */")
        for name, src, values in lowered:
            funcs.setdefault(name, src)
            args = []
            for k, v in enumerate(values):
                t = stype(types[v].dtype)
                const = "const " if k < len(values) - 1 else ""
                base, off = ("consts", offs[v]) if v in offs else ("arena", int(program.plan.offsets[v]))
                args.append(f"({const}{t} *)({base} + {off})")
            calls.append(f"  {name}({', '.join(args)});")
    return funcs, calls, {"functions": sorted(funcs), "constant_offsets": offs, "constants": blob,
                          "arena_bytes": int(program.plan.arena_bytes)}


def program_c(program: Any) -> tuple[str, dict[str, Any]]:
    """The whole program as one C file, and what it holds (functions, constants, arena size)."""
    funcs, calls, held = program_parts(program)
    run = ["/* Runs every step on the planned arena; consts holds the weights (see io.json). */",
           "void rlx_model_run(unsigned char *arena, const unsigned char *consts) {",
           "  (void)arena; (void)consts;", *calls, "}"]
    return "\n".join([PRELUDE, *funcs.values(), *run]) + "\n", held


def module(sources: Sequence[str]) -> str:
    """The prelude and each distinct kernel function once (the compile check's translation unit)."""
    return "\n".join([PRELUDE, *dict.fromkeys(sources)]) + "\n"
