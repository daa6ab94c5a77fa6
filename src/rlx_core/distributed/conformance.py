"""``rlx conformance BACKEND --world N``: the collective ops' cases run across N ranks.

Each collective's schema carries its cases (``extra["world_cases"]``: id, attributes, per-rank
shape). Every rank builds every rank's one-node program and inputs (deterministic: seeded by case
and rank), computes the float64 reference with simulated ranks (:func:`~rlx_core.distributed.simulate`),
runs its own program on the backend and compares; rank 0 gathers the verdicts and prints the
certificate lines. Outside a launch of N ranks it starts one (``mpirun`` through :mod:`.launch`).
"""

from __future__ import annotations

import subprocess
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..dtypes import DType
from ..ir.builder import GraphBuilder
from ..ir.graph import Graph
from ..ir.schema import REGISTRY, OpSchema

Result = tuple[str, str, str]  # (check id, status, message)


def collective_schemas() -> list[OpSchema]:
    return [s for s in REGISTRY.schemas() if s.extra.get("collective")]


def _values(shape: tuple[int, ...], dt: DType, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dt.is_float:
        return rng.standard_normal(shape).astype(dt.np)
    return rng.integers(-50, 50, shape).astype(dt.np)


def case_programs(schema: OpSchema, dt: DType, case: str, attrs: dict[str, Any], shape: tuple[int, ...],
                  world: int) -> tuple[list[Graph | None], list[dict[str, np.ndarray]]]:
    """Rank r's program (None: the rank is outside the case's group) and inputs."""
    graphs: list[Graph | None] = []
    inputs: list[dict[str, np.ndarray]] = []
    group = tuple(attrs.get("group", ())) or tuple(range(world))
    for r in range(world):
        seed = zlib.crc32(f"{schema.name}[{dt.value}]-{case}".encode()) * 131 + r
        x = _values(shape, dt, seed)
        g = GraphBuilder(f"{schema.name}_{case}".replace("-", "_"))
        if schema.name in ("send", "recv"):
            xi = g.input("x", dt, shape)
            s = g.op("send", xi, peer=(r + 1) % world, tag=3)
            g.output(g.op("recv", peer=(r - 1) % world, shape=shape, dtype=dt, tag=3), "received")
            g.output(s, "sent")
            inputs.append({"x": x})
        elif r not in group:
            graphs.append(None)
            inputs.append({})
            continue
        elif schema.inputs:
            xi = g.input("x", dt, shape)
            g.output(g.op(schema.name, xi, world=len(group), **attrs), "y")
            inputs.append({"x": x})
        else:
            g.output(g.op(schema.name, world=len(group), **attrs), "y")
            inputs.append({})
        graphs.append(g.build())
    return graphs, inputs


def _tolerance(schema: OpSchema, dt: DType, world: int) -> tuple[float, float]:
    if not dt.is_float or not schema.accumulates:
        return 0.0, 0.0
    eps = float(np.finfo(dt.np).eps)
    return 2 * world * eps, 2 * world * eps


def run_rank(backend: str, world: int, keyword: str | None = None) -> list[Result]:
    """This rank's results (every rank of the launch calls it)."""
    from ..runtime import Session
    from .runtime import world as get_world
    from .simulate import simulate

    w = get_world()
    session = Session(backend)
    results: list[Result] = []
    for schema in collective_schemas():
        for dt in schema.dtypes:
            for case, attrs, shape in schema.extra["world_cases"](world, dt):
                cid = f"op::{schema.name}[{dt.value}]-{case}@world{world}"
                if keyword and keyword not in cid:
                    continue
                graphs, inputs = case_programs(schema, dt, case, dict(attrs), tuple(shape), world)
                group = [r for r, g in enumerate(graphs) if g is not None]
                mine = graphs[w.rank]
                if mine is None:
                    continue
                try:
                    full = [g for g in graphs if g is not None]
                    feeds = [inputs[r] for r in group]
                    ref = (simulate(full, feeds)[group.index(w.rank)] if len(group) == world
                           else _sim_group(full, feeds, group, w.rank))
                    got = session.compile(mine).run(inputs[w.rank])
                    rtol, atol = _tolerance(schema, dt, world)
                    msg = ""
                    for k, want in ref.items():
                        have = np.asarray(got[k])
                        scale = float(np.max(np.abs(want))) if want.size else 0.0
                        if have.shape != want.shape:
                            msg = f"{k}: shape {have.shape}, expected {want.shape}"
                        elif not np.allclose(have.astype(np.float64), want, rtol=rtol, atol=atol * scale):
                            msg = f"{k}: max error {float(np.max(np.abs(have - want)))}"
                        if msg:
                            break
                    results.append((cid, "failed" if msg else "passed", msg))
                except Exception as e:  # a crash inside the backend is this check's error
                    from ..errors import DispatchError

                    status = "skipped" if isinstance(e, DispatchError) else "error"
                    results.append((cid, status, f"{type(e).__name__}: {str(e).splitlines()[0]}"))
    return results


def _sim_group(graphs: list[Graph], inputs: list[dict[str, np.ndarray]], group: list[int], rank: int
               ) -> dict[str, np.ndarray]:
    """Simulate a sub-group case: the group's global ranks renumbered 0..k-1 in the attributes."""
    from ..ir.graph import Node
    from ..ir.types import Attrs
    from .simulate import simulate

    renum = []
    for g in graphs:
        nodes = tuple(Node(n.name, n.op, n.inputs, n.outputs, Attrs({**dict(n.attrs), "group": ()}))
                      if "group" in n.attrs else n for n in g.nodes)
        renum.append(Graph(g.name, g.inputs, g.params, nodes, g.outputs, g.weights))
    return simulate(renum, inputs)[group.index(rank)]


def main_rank(backend: str, world: int, keyword: str | None, md_path: str | None, quiet: bool) -> int:
    from .runtime import world as get_world

    w = get_world()
    if w.size != world:
        sys.stderr.write(f"rank {w.rank}: launched with {w.size} ranks, --world {world}\n")
        return 2
    mine = run_rank(backend, world, keyword)
    everything = w.base.gather(mine, root=0)
    if w.rank != 0 or everything is None:
        return 0
    merged: dict[str, tuple[str, str, list[int]]] = {}
    for r, res in enumerate(everything):
        for cid, status, msg in res:
            old = merged.get(cid)
            if old is None or (old[0] == "passed" and status != "passed"):
                merged[cid] = (status, msg, [r])
            elif status == old[0]:
                old[2].append(r)
    counts: dict[str, int] = {}
    for status, _, _ in merged.values():
        counts[status] = counts.get(status, 0) + 1
    bad = {k: v for k, v in merged.items() if v[0] in ("failed", "error")}
    variants = sorted({k.split("-")[0].split("@")[0] for k in merged})
    verdict = (f"{backend} certified for collectives over {world} ranks: {counts.get('passed', 0)} checks "
               f"passed, {counts.get('skipped', 0)} skipped, {len(variants)} variants"
               if not bad else f"{backend} NOT certified over {world} ranks: {len(bad)} checks failed")
    lines = [f"# Collective conformance: {backend}, world {world}", "", verdict, "",
             "| check | status | ranks | detail |", "|---|---|---|---|"]
    lines += [f"| {cid} | {s} | {','.join(map(str, rs))} | {m} |"
              for cid, (s, m, rs) in sorted(merged.items())]
    if md_path:
        Path(md_path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    if not quiet:
        for cid, (s, m, _) in sorted(merged.items()):
            if s != "passed":
                print(f"{s:8s} {cid}: {m}")
    print(verdict)
    return 1 if bad or not counts.get("passed") else 0


def run_world(backend: str, world: int, *, keyword: str | None = None, md_path: str | None = None,
              quiet: bool = False) -> int:
    """Run the collective cases over ``world`` ranks: here if this is such a launch, else through mpirun."""
    from .mpirun import child_env, mpirun_argv
    from .runtime import launched_size

    if launched_size() == world and world > 1:
        return main_rank(backend, world, keyword, md_path, quiet)
    cmd = ["-m", "rlx_core.distributed.conformance", backend, str(world), keyword or "", md_path or "",
           "1" if quiet else "0"]
    proc = subprocess.run(mpirun_argv(world, cmd), env=child_env(), check=False)
    return proc.returncode


def _main(argv: Sequence[str]) -> int:
    backend, world, keyword, md, quiet = argv
    return main_rank(backend, int(world), keyword or None, md or None, quiet == "1")


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
