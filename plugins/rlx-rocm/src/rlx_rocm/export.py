"""``rlx export MODEL --target rocm -o DIR``: a model as HIP kernels, AMDGPU code objects and the launch
table a HIP host program follows.

The directory holds:

* ``kernels.hip``: every distinct kernel once, after the prelude, each preceded by a comment naming
  the graph nodes that launch it (escaped: names come from the model file);
* ``rlx_<arch>.hsaco``: the code object per target (``hipModuleLoadData``), built with clang's AMDGPU
  back end (skipped with ``--no-build``); exporting never runs anything;
* ``launches.json``: the arena size, the constants' offsets in ``constants.bin``, the inputs' and
  outputs' arena offsets, and per launch the kernel function, its buffer arguments (``arena`` or
  ``constants`` + byte offset), the ``int32`` parameter block and the grid (threads; blocks of
  :data:`rlx_rocm.hip.BLOCK`);
* ``constants.bin``: the weights, each 64-byte aligned.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx_core.plugin import safe_comment

from . import __version__
from .hip import BLOCK, kernel_name, module, program_launches
from .offline import ARCHS
from .offline import build as build_code_object

ALIGN = 64


def lower_graph(graph: Any, bindings: Mapping[str, int] | None = None) -> Any:
    """Dispatch and lower ``graph`` for rocm:0 (no GPU needed); unbound symbols are 1."""
    from rlx_core.plugin import Session

    bind = {s: 1 for s in graph.symbols}
    bind.update(bindings or {})
    return Session("rocm:0", use_cache=False, lower_only=True).lower(graph, bind)


def export_graph(graph: Any, out_dir: str | Path, *, bindings: Mapping[str, int] | None = None,
                 archs: Sequence[str] = ARCHS, build: bool = True) -> dict[str, Any]:
    program = lower_graph(graph, bindings)
    g = program.graph
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    consts: dict[str, tuple[int, int]] = {}
    blob = bytearray()
    for p in g.params:
        arr = np.ascontiguousarray(np.asarray(g.weights[p.name], dtype=p.type.dtype.np))
        consts[p.name] = (len(blob), arr.nbytes)
        blob += arr.tobytes()
        blob += b"\0" * ((-len(blob)) % ALIGN)

    def where(value: str) -> dict[str, Any]:
        if value in consts:
            return {"value": value, "buffer": "constants", "offset": consts[value][0]}
        return {"value": value, "buffer": "arena", "offset": int(program.plan.offsets[value])}

    users: dict[str, list[str]] = {}
    launches = []
    for step, lns in program_launches(program):
        for ln in lns:
            if ln.empty:
                continue
            users.setdefault(ln.source, []).append(step.node)
            launches.append({"node": step.node, "kernel": ln.kernel, "function": kernel_name(ln.source),
                             "args": [where(v) for v in ln.bufs],
                             "params": [int(x) for x in np.asarray(ln.params).reshape(-1)],
                             "threads": int(ln.grid[0]), "block": BLOCK})
    notes = {src: "// launched by: " + safe_comment(", ".join(dict.fromkeys(nodes)), "cuda")
             for src, nodes in users.items()}
    text = module(list(users), notes)

    def io(values: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
        rows = []
        for public, v in values:
            t = g.types[v]
            rows.append({"name": public, "value": v, "dtype": t.dtype.value,
                         "shape": [int(d) for d in t.shape], **where(v)})
        return rows

    table = {"rlx_rocm": __version__, "graph": graph.name, "arena_bytes": int(program.plan.arena_bytes),
             "constants_bytes": len(blob),
             "constants": [{"value": k, "offset": o, "nbytes": n} for k, (o, n) in consts.items()],
             "inputs": io([(v.name, v.name) for v in program.inputs]), "outputs": io(program.outputs),
             "launches": launches}
    files = {"kernels.hip": text, "launches.json": json.dumps(table, indent=1) + "\n"}
    for name, body in files.items():
        (out / name).write_text(body)
    (out / "constants.bin").write_bytes(bytes(blob))
    info: dict[str, Any] = {"dir": str(out), "kernels": len(users), "launches": len(launches),
                            "arena_bytes": table["arena_bytes"], "constants_bytes": len(blob),
                            "files": sorted([*files, "constants.bin"]),
                            "verdict": f"code generated{' and compiled' if build else ''} (not executed)"}
    if build and users:
        objs = {}
        for arch in archs:
            data, co = build_code_object(text, arch)
            (out / f"rlx_{arch}.hsaco").write_bytes(data)
            info["files"].append(f"rlx_{arch}.hsaco")
            objs[arch] = {"kernels": len(co.kernels), "bytes": co.nbytes,
                          "device_library_imports": list(co.undefined)}
        info["code_objects"] = objs
    return info

