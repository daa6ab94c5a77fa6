"""``rlx export MODEL --target hexagon -o DIR``: a model as one freestanding C file for Hexagon HVX.

The directory holds ``rlx_model.c`` (the prelude, the kernel functions, ``rlx_model_run(arena,
consts)``), ``rlx_model.h``, ``constants.bin`` (the weights, 64-byte aligned), ``io.json`` (arena
size, inputs' and outputs' arena offsets, dtypes, shapes) and, unless ``--no-build``,
``rlx_model.o`` compiled by clang for the chosen core with 128-byte HVX, with its section sizes in the
summary. Exporting never runs anything.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlx_core.plugin import safe_comment

from . import __version__
from .build import compile_c, program_c

HEADER = """/* rlx-hexagon {version}: graph {graph}. Freestanding; see io.json for the byte layout. */
#ifndef RLX_MODEL_H
#define RLX_MODEL_H
#define RLX_ARENA_BYTES {arena}
#define RLX_CONSTANT_BYTES {consts}
/* arena: RLX_ARENA_BYTES bytes, 128-byte aligned; consts: constants.bin, 128-byte aligned */
void rlx_model_run(unsigned char *arena, const unsigned char *consts);
#endif
"""


def lower_graph(graph: Any, bindings: Mapping[str, int] | None = None) -> Any:
    from rlx_core.plugin import Session

    bind = {s: 1 for s in graph.symbols}
    bind.update(bindings or {})
    return Session("hexagon:0", use_cache=False, lower_only=True).lower(graph, bind)


def export_graph(graph: Any, out_dir: str | Path, *, bindings: Mapping[str, int] | None = None,
                 cpu: str = "hexagonv73", build: bool = True) -> dict[str, Any]:
    program = lower_graph(graph, bindings)
    text, held = program_c(program)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    g = program.graph

    def io(pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
        rows = []
        for public, v in pairs:
            t = g.types[v]
            consts = held["constant_offsets"]
            place = ({"buffer": "constants", "offset": consts[v]} if v in consts
                     else {"buffer": "arena", "offset": int(program.plan.offsets[v])})
            rows.append({"name": public, "value": v, "dtype": t.dtype.value,
                         "shape": [int(d) for d in t.shape],
                         **place})
        return rows

    layout = {"rlx_hexagon": __version__, "graph": graph.name, "cpu": cpu, "arena_bytes": held["arena_bytes"],
              "constants_bytes": len(held["constants"]),
              "inputs": io([(v.name, v.name) for v in program.inputs]), "outputs": io(list(program.outputs))}
    files = {"rlx_model.c": text, "io.json": json.dumps(layout, indent=1) + "\n",
             "rlx_model.h": HEADER.format(version=__version__, graph=safe_comment(graph.name, "c"),
                                          arena=held["arena_bytes"], consts=len(held["constants"]))}
    for name, body in files.items():
        (out / name).write_text(body)
    (out / "constants.bin").write_bytes(held["constants"])
    info: dict[str, Any] = {"dir": str(out), "functions": len(held["functions"]), "cpu": cpu,
                            "arena_bytes": held["arena_bytes"], "constants_bytes": len(held["constants"]),
                            "files": sorted([*files, "constants.bin"]),
                            "verdict": f"code generated{' and compiled' if build else ''} (not executed)"}
    if build:
        _, obj = compile_c(text, cpu=cpu, keep=out / "rlx_model.o")
        info["files"].append("rlx_model.o")
        info["sections"] = {k: v for k, v in obj.sections.items() if k.startswith((".text", ".data", ".bss",
                                                                                     ".rodata"))}
    return info
