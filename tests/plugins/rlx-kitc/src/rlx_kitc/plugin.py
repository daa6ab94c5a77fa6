"""rlx-kitc: a whole device backend on the device kit, as small as one can be (a test backend).

Kernels are C (the shared renderer's ``c`` dialect), built by the host C compiler into one shared
library each and called through ctypes over host memory. Everything else is the kit's: the render
check and claim list, the compile cache (authenticated, keyed by compiler version + flags + source),
the arena laid out by the LIR buffer plan, constants uploaded once, the run loop and profile counts.
A new GPU target has the same shape: a dialect, ``lower``, a ``Compiler`` and a ``Runtime``.
"""

from __future__ import annotations

import ctypes
import math
import shutil
from pathlib import Path

from rlx_core import API_VERSION
from rlx_core.plugin import (
    DIALECTS,
    FUSED,
    BackendInfo,
    Compiler,
    CtypesRuntime,
    DeviceCaps,
    DeviceInfo,
    DType,
    KernelClaim,
    KitProgram,
    Launch,
    NodeVariant,
    Program,
    Step,
    elementwise_claims,
    fused_claim,
    hookimpl,
    program_of,
    render_check,
    render_program,
    renders,
    tool_version,
)

C = DIALECTS["c"]
GEN = frozenset({DType.F32, DType.BOOL})
FLAGS = ("-std=c11", "-O2", "-fPIC", "-shared", "-fno-fast-math", "-ffp-contract=off")
HEADER = "#include <math.h>\n#include <stdbool.h>\n#include <string.h>\n"
# Every kernel: rlx_kernel(void** buffers, const int* P); P[0] is the work size.
MATMUL = HEADER + """void rlx_kernel(void** b, const int* P) {
  const float* A = (const float*)b[0]; const float* B = (const float*)b[1]; float* Y = (float*)b[2];
  const int M = P[1], N = P[2], K = P[3];
  for (int i = 0; i < M; ++i) for (int j = 0; j < N; ++j) {
    float s = 0; for (int k = 0; k < K; ++k) s += A[i * K + k] * B[k * N + j]; Y[i * N + j] = s; }
}
"""
COPY = HEADER + "void rlx_kernel(void** b, const int* P) { memmove(b[1], b[0], (size_t)P[0]); }\n"


def cc() -> str | None:
    return shutil.which("gcc") or shutil.which("cc")


def elementwise_source(program: str, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str:
    """P = [n, R, out dims[R], strides of input k[R] for each k] (broadcast strides are 0)."""
    ni, ty = len(in_dtypes), C.ctype
    lines, res, _ = render_program(program, [f"a{k}" for k in range(ni)], list(in_dtypes), C)
    body = [f"  const {ty(dt)}* x{k} = (const {ty(dt)}*)b[{k}];" for k, dt in enumerate(in_dtypes)]
    body += [f"  {ty(out_dtype)}* y = ({ty(out_dtype)}*)b[{ni}];", "  const int n = P[0], R = P[1];",
             "  for (int g = 0; g < n; ++g) {", "    int r = g;", *[f"    int o{k} = 0;" for k in range(ni)],
             "    for (int d = R - 1; d >= 0; --d) {", "      const int c = r % P[2 + d]; r /= P[2 + d];",
             *[f"      o{k} += c * P[2 + R * {k + 1} + d];" for k in range(ni)], "    }",
             *[f"    const {ty(dt)} a{k} = x{k}[o{k}];" for k, dt in enumerate(in_dtypes)],
             *["    " + ln for ln in lines], f"    y[g] = ({ty(out_dtype)})({res});", "  }"]
    return HEADER + "void rlx_kernel(void** b, const int* P) {\n" + "\n".join(body) + "\n}\n"


class CCompiler(Compiler):
    dialect = "c"
    cache_name = "kitc"
    about = "rlx-kitc test backend: C kernels as shared libraries (dlopened)"
    suffix = ".so"
    label = "rlx-kitc: the C compiler"

    def identity(self) -> str:
        exe = cc() or ""
        return "\0".join((exe, tool_version(exe) if exe else "", *FLAGS, HEADER))

    def build(self, source: str, out: Path) -> None:
        src = out.with_suffix(".c")
        src.write_text(source)
        self.run_tool([cc() or "cc", *FLAGS, "-o", str(out), str(src), "-lm"], source)

    def link(self, path: Path) -> ctypes.CDLL:
        lib = ctypes.CDLL(str(path))
        lib.rlx_kernel.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.rlx_kernel.restype = None
        return lib


COMPILER = CCompiler()


def _bstrides(shape: tuple[int, ...], out: tuple[int, ...]) -> list[int]:
    full = (1,) * (len(out) - len(shape)) + shape
    st = [math.prod(full[d + 1:]) for d in range(len(full))]
    return [0 if full[d] == 1 else st[d] for d in range(len(full))]


def lower(s: Step, prog: KitProgram) -> list[Launch]:
    out = s.outputs[0]
    shape = prog.shape(out)
    n = math.prod(shape)
    if s.op == "matmul":
        (m, k), nn = prog.shape(s.inputs[0]), prog.shape(s.inputs[1])[1]
        return [Launch(s.kernel, MATMUL, (*s.inputs, out), [m * nn, m, nn, k], (m * nn, 1, 1))]
    if s.op == "reshape":
        nb = prog.types[out].nbytes()
        return [Launch(s.kernel, COPY, (s.inputs[0], out), [nb], (nb, 1, 1))]
    v = NodeVariant(s.op, tuple(prog.types[i] for i in s.inputs), (prog.types[out],), s.attrs)
    src = elementwise_source(program_of(v), v.in_dtypes, prog.types[out].dtype)
    strides = [st for i in s.inputs for st in _bstrides(prog.shape(i), shape)]
    return [Launch(s.kernel, src, (*s.inputs, out), [n, len(shape), *shape, *strides], (n, 1, 1))]


@hookimpl
def rlx_backend_info() -> BackendInfo:
    return BackendInfo(name="kitc", version="0.1.0", api_version=API_VERSION, vendor="RLX tests",
                       description="test backend on the device kit: C kernels via the host compiler")


@hookimpl
def rlx_probe_devices() -> list[DeviceInfo]:
    caps = DeviceCaps(peak_flops={"default": 1e9}, mem_bandwidth=5e9, launch_overhead=2e-6,
                      host_link_bandwidth=None, source="test estimates")
    why = "" if cc() else "no C compiler (gcc or cc) on PATH"
    return [DeviceInfo(backend="kitc", name="kitc:0", available=not why, caps=caps, host_memory=True,
                       reason=why)]


def _op_ok(op: str, ins: tuple[DType, ...], out: DType) -> str | None:
    return None if all(d in GEN for d in (*ins, out)) else "f32/bool only (C integer division traps)"


def _2d(v: NodeVariant) -> str | None:
    return None if v.in_types[0].rank == 2 and v.in_types[1].rank == 2 else "2-D operands only"


@hookimpl
def rlx_kernels(device: DeviceInfo) -> list[KernelClaim]:
    renderable = renders(render_check(elementwise_source, "as C", op_ok=_op_ok))
    return [*elementwise_claims("kitc.", GEN, renderable), fused_claim(f"kitc.{FUSED}", renderable),
            KernelClaim("matmul", "kitc.matmul", dtypes=frozenset({DType.F32}), predicate=_2d),
            KernelClaim("reshape", "kitc.reshape", dtypes=GEN, in_place=True)]


@hookimpl
def rlx_compile(program: Program, device: DeviceInfo) -> KitProgram:
    rt = CtypesRuntime(COMPILER.load_all, "rlx_kernel")
    return KitProgram(program, rt.allocator, rt, lower)
