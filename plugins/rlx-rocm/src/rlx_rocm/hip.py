"""HIP C++ from the device kit: the C-style kernel library (:mod:`rlx_core.plugin.cstyle`) in a HIP
dialect, whose elementwise bodies come from the shared renderer's ``cuda`` dialect (HIP keeps CUDA's
C++ and math names).

One prelude serves both ways the source is compiled:

* on a ROCm machine hiprtc compiles it: hiprtc brings the HIP runtime header itself (``__global__``,
  ``expf`` and friends from ROCm's device libraries), the prelude only fills in ``INFINITY``/``NAN``;
* offline, clang's AMDGPU back end compiles it with ``-nogpuinc -nogpulib -DRLX_HIP_OFFLINE``: no
  HIP headers exist here, so the prelude declares what they would, mapping each C math function to
  the ROCm device library (ocml) function HIP's own headers call. The code object then imports
  exactly those ``__ocml_*`` symbols (:data:`OCML`), which the loader of a real ROCm build links in;
  any other undefined symbol is a bug the compile check reports.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from rlx_core.plugin import DType, IRError, cstyle

#: Threads per workgroup of every launch (the kernels' flat work-group size bound says the same).
BLOCK = 256

#: C math function the renderer and templates emit -> the ocml function HIP's math header calls.
OCML: Mapping[str, str] = {f"{f}f": f"__ocml_{f}_f32" for f in (
    "exp", "log", "sqrt", "sin", "cos", "tanh", "erf", "floor", "ceil", "fabs", "rint")} | {
    "powf": "__ocml_pow_f32"}


def _offline_decls() -> str:
    lines = []
    for c, o in OCML.items():
        n = 2 if c == "powf" else 1
        ps = ", ".join(["float"] * n)
        args = ", ".join(f"float x{k}" for k in range(n))
        call = ", ".join(f"x{k}" for k in range(n))
        lines.append(f'extern "C" __device__ __attribute__((visibility("default"))) float {o}({ps});')
        lines.append(f"static __device__ inline float {c}({args}) {{ return {o}({call}); }}")
    # HIP's cmath gives integer abs overloads (the renderer emits abs for i32/i64 too)
    lines.append("static __device__ inline int abs(int x) { return __builtin_abs(x); }")
    lines.append("static __device__ inline long long abs(long long x) { return __builtin_llabs(x); }")
    return "\n".join(lines)


PRELUDE = f"""// rlx-rocm kernels (HIP C++). hiprtc provides the HIP runtime header; an offline build
// (clang -x hip -nogpuinc -nogpulib -DRLX_HIP_OFFLINE) gets the few declarations it would give.
#ifdef RLX_HIP_OFFLINE
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
{_offline_decls()}
#endif
#ifndef INFINITY
#define INFINITY __builtin_inff()
#endif
#ifndef NAN
#define NAN __builtin_nanf("")
#endif
#define RLX_GID (__builtin_amdgcn_workgroup_id_x() * __builtin_amdgcn_workgroup_size_x() + \\
                 __builtin_amdgcn_workitem_id_x())
"""


def _signature(name: str, params: Sequence[str], pblock: str) -> str:
    # extern "C": hipModuleGetFunction finds the kernel by its plain name.
    return (f'extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(1, {BLOCK}))) void {name}('
            + ", ".join([p.strip() for p in params] + [pblock.strip()]) + ") {")


HIP = cstyle.KernelDialect(
    "hip", "cuda", PRELUDE,
    {DType.F32: "float", DType.I32: "int", DType.I64: "long long", DType.BOOL: "bool"}, "", "const",
    {"exp": "expf", "log": "logf", "sqrt": "sqrtf"}, _signature,
    prologue="  const unsigned gid = RLX_GID;")

_KERNEL = re.compile(r'extern "C" __global__ [^\n]*? void ([A-Za-z_][A-Za-z0-9_]*)\(')


def kernel_name(source: str) -> str:
    """The function name of the one kernel in ``source``."""
    m = _KERNEL.search(source)
    if m is None:
        raise IRError("no HIP kernel in the generated source", fix="report this bug")
    return m.group(1)


def step_launches(step: Any, types: Mapping[str, Any]) -> list[Any]:
    """The launches of one LIR step (the device kit's lowering, in the HIP dialect)."""
    return list(cstyle.launches(HIP, step, types, "rocm.ew."))


def program_launches(program: Any) -> list[tuple[Any, list[Any]]]:
    """``(step, launches)`` for every kernel step of an LIR program."""
    return [(s, step_launches(s, program.graph.types)) for s in program.kernels]


def module(sources: Sequence[str], notes: Mapping[str, str] | None = None) -> str:
    """One translation unit: the prelude, then each distinct kernel once, preceded by its note (a
    comment the caller has already made safe)."""
    parts = [PRELUDE]
    for src in dict.fromkeys(sources):
        note = (notes or {}).get(src)
        parts.append((note + "\n" if note else "") + src)
    return "\n".join(parts)
