"""The compile check: what stands in for the conformance suite where no AMD GPU exists.

``rlx conformance rocm`` executes kernels; without a ROCm device it refuses (the device is
unavailable), so nothing here is *certified*. Instead this dispatches and lowers every program the
conformance suite builds (its op cases, HIR cases and model graphs) for ``rocm:0``, collects every
distinct HIP kernel those programs generate, and compiles them all with clang's AMDGPU back end for
each target (:data:`rlx_rocm.offline.ARCHS`): the verdict is "code generated and compiled", never
"executed". Programs the backend does not claim (``DispatchError``) generate no kernel and are
counted as such.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .offline import ARCHS, CodeObject, build


@dataclass
class CheckResult:
    programs: int = 0
    lowered: int = 0
    not_claimed: int = 0
    sources: list[str] = field(default_factory=list)
    objects: dict[str, CodeObject] = field(default_factory=dict)
    images: dict[str, bytes] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"verdict": "code generated and compiled (not executed: no ROCm device)",
                "programs": self.programs, "lowered": self.lowered, "not_claimed": self.not_claimed,
                "kernels": len(self.sources),
                "archs": {a: {"kernels": len(co.kernels), "bytes": co.nbytes,
                              "device_library_imports": list(co.undefined)}
                          for a, co in self.objects.items()},
                "seconds": {k: round(v, 2) for k, v in self.seconds.items()}}


def conformance_programs(*, ops: bool = True, hir: bool = True,
                         graphs: bool = True) -> list[tuple[str, Any, dict[str, int]]]:
    """``(id, graph, bindings)`` of every program the conformance suite builds."""
    from rlx_core.plugin import CapabilityError

    try:
        from rlx_conformance.cases import all_cases, build_case_graph, hir_cases
        from rlx_conformance.graphs import _bindings, graph_cases
    except ImportError as e:
        raise CapabilityError(f"the compile check enumerates the conformance suite's programs, but "
                              f"rlx-conformance is not importable ({e})", where="rlx-rocm compile check",
                              fix="pip install rlx-conformance (or rlx-rocm[test])") from None

    out: list[tuple[str, Any, dict[str, int]]] = []
    if ops:
        out += [(c.id, build_case_graph(c), {}) for c in all_cases()]
    if hir:
        out += [(c.id, build_case_graph(c), {}) for c in hir_cases()]
    if graphs:
        out += [(c.id, c.graph, _bindings(c.graph, c.inputs)) for c in graph_cases()]
    return out


def generated_sources(programs: Iterable[tuple[str, Any, dict[str, int]]], result: CheckResult,
                      device: str = "rocm:0") -> None:
    """Lower each program for ``device`` (dispatch only: no GPU needed) and collect its kernels."""
    from rlx_core.plugin import DispatchError, Session

    from .hip import program_launches

    session = Session(device, use_cache=False, lower_only=True)
    seen: dict[str, None] = dict.fromkeys(result.sources)
    for _, graph, binds in programs:
        result.programs += 1
        try:
            program = session.lower(graph, binds)
        except DispatchError:
            result.not_claimed += 1
            continue
        result.lowered += 1
        for _, lns in program_launches(program):
            for ln in lns:
                seen.setdefault(ln.source, None)
    result.sources = list(seen)


def compile_check(archs: Sequence[str] = ARCHS,
                  programs: Iterable[tuple[str, Any, dict[str, int]]] | None = None, *,
                  log: Callable[[str], None] | None = None) -> CheckResult:
    """Generate every kernel of ``programs`` (default: the conformance suite's) and compile them all
    for each arch; raises :class:`~rlx_core.plugin.IRError` (clang's message) on the first failure."""
    from .hip import kernel_name, module

    res = CheckResult()
    t = time.perf_counter()
    generated_sources(conformance_programs() if programs is None else programs, res)
    res.seconds["generate"] = time.perf_counter() - t
    if log:
        log(f"{res.programs} programs ({res.not_claimed} not claimed): {len(res.sources)} distinct kernels")
    text = module(res.sources)
    want = {kernel_name(s) for s in res.sources}
    def one(arch: str) -> tuple[str, bytes, CodeObject, float]:
        t0 = time.perf_counter()
        image, co = build(text, arch)
        return arch, image, co, time.perf_counter() - t0

    # one clang per arch, side by side (separate processes)
    with ThreadPoolExecutor(max_workers=max(len(archs), 1)) as ex:
        built = list(ex.map(one, archs))
    for arch, image, co, secs in built:
        res.seconds[arch] = secs
        missing = sorted(want - set(co.kernels))
        if missing:
            from rlx_core.plugin import IRError

            raise IRError(f"the {arch} code object lacks {len(missing)} generated kernels: {missing[:5]}",
                          fix="report this bug")
        res.objects[arch], res.images[arch] = co, image
        if log:
            log(f"{arch}: {len(co.kernels)} kernels in an amdgcn code object of {co.nbytes} bytes "
                f"({secs:.1f} s)")
    return res
