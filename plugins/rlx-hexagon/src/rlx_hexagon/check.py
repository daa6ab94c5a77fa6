"""The compile check: what stands in for the conformance suite, since no Hexagon HVX core can execute
code here. Every program the conformance suite builds (op cases, HIR cases, model graphs) is
dispatched and lowered for ``hexagon:0``; every distinct kernel function they generate (deduplicated
by source: the function name is a hash of it) is compiled by clang for Hexagon HVX, all of them, no
sampling. The verdict is "code generated and compiled", never "executed"; ``rlx conformance
hexagon`` refuses (the device is unavailable), so no certificate exists.

The functions are split round-robin over :data:`PARTS` translation units compiled side by side:
one unit of ~1200 functions costs clang ~25 s of CPU (its per-module passes grow faster than
linearly), four cost ~13 s together and finish in half that on two cores.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .build import HexObject, compile_c, hvx_counts, module, step_functions

PARTS = 4


@dataclass
class CheckResult:
    programs: int = 0
    lowered: int = 0
    not_claimed: int = 0
    sources: dict[str, str] = field(default_factory=dict)
    objects: list[HexObject] = field(default_factory=list)
    images: list[bytes] = field(default_factory=list)
    #: HVX instructions per generated function (0: clang kept it scalar)
    hvx: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def sections(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for o in self.objects:
            total.update(o.sections)
        return dict(total)

    def summary(self) -> dict[str, Any]:
        secs = self.sections
        return {"verdict": "code generated and compiled (not executed: no Hexagon HVX device or simulator)",
                "programs": self.programs, "lowered": self.lowered, "not_claimed": self.not_claimed,
                "functions": len(self.sources), "objects": len(self.objects),
                "hvx_functions": sum(1 for n in self.sources if self.hvx.get(n, 0)),
                "sections": {k: v for k, v in secs.items()
                             if k.startswith((".text", ".rodata", ".data", ".bss"))},
                "seconds": {k: round(v, 2) for k, v in self.seconds.items()}}


def conformance_programs() -> list[tuple[str, Any, dict[str, int]]]:
    """``(id, graph, bindings)`` of every program the conformance suite builds."""
    from rlx_conformance.cases import all_cases, build_case_graph, hir_cases
    from rlx_conformance.graphs import _bindings, graph_cases

    out: list[tuple[str, Any, dict[str, int]]] = [(c.id, build_case_graph(c), {})
                                                   for c in [*all_cases(), *hir_cases()]]
    out += [(c.id, c.graph, _bindings(c.graph, c.inputs)) for c in graph_cases()]
    return out


def generated_sources(programs: Iterable[tuple[str, Any, dict[str, int]]], res: CheckResult) -> None:
    """Lower each program for ``hexagon:0`` (dispatch only) and collect its kernel functions."""
    from rlx_core.plugin import DispatchError, Session

    session = Session("hexagon:0", use_cache=False, lower_only=True)
    for _, graph, binds in programs:
        res.programs += 1
        try:
            program = session.lower(graph, binds)
        except DispatchError:
            res.not_claimed += 1
            continue
        res.lowered += 1
        for _, lowered in step_functions(program):
            for name, src, _ in lowered:
                res.sources.setdefault(name, src)


def compile_sources(sources: dict[str, str], res: CheckResult, *, cpu: str | None = None,
                    parts: int = PARTS) -> None:
    """Compile ``sources`` in ``parts`` translation units side by side; :class:`IRError` (clang's
    message) on the first that fails, or when an object lacks a generated function."""
    from rlx_core.plugin import IRError

    names = sorted(sources)
    chunks = [names[k::parts] for k in range(parts) if names[k::parts]]

    def one(chunk: list[str]) -> tuple[bytes, HexObject, dict[str, int]]:
        image, obj = compile_c(module([sources[n] for n in chunk]), cpu=cpu)
        missing = sorted(set(chunk) - set(obj.functions))
        if missing:
            raise IRError(f"the object lacks {len(missing)} generated functions: {missing[:5]}",
                          fix="report this bug")
        return image, obj, hvx_counts(image)

    with ThreadPoolExecutor(max_workers=max(1, min(len(chunks), os.cpu_count() or 1))) as ex:
        for image, obj, hvx in ex.map(one, chunks):
            res.images.append(image)
            res.objects.append(obj)
            res.hvx.update(hvx)


def compile_check(programs: Iterable[tuple[str, Any, dict[str, int]]] | None = None, *,
                  cpu: str | None = None, parts: int = PARTS,
                  log: Callable[[str], None] | None = None) -> CheckResult:
    """Generate every kernel function of ``programs`` (default: the conformance suite's) and compile
    them all for Hexagon HVX."""
    res = CheckResult()
    t = time.perf_counter()
    generated_sources(conformance_programs() if programs is None else programs, res)
    res.seconds["generate"] = time.perf_counter() - t
    if log:
        log(f"{res.programs} programs ({res.not_claimed} not claimed): {len(res.sources)} distinct functions")
    t = time.perf_counter()
    compile_sources(res.sources, res, cpu=cpu, parts=parts)
    res.seconds["compile"] = time.perf_counter() - t
    if log:
        s = res.summary()
        log(f"hexagon objects: {s['functions']} functions in {s['objects']} objects, .text "
            f"{s['sections'].get('.text', 0)} bytes, {s['hvx_functions']} with HVX instructions "
            f"({res.seconds['compile']:.1f} s)")
    return res
