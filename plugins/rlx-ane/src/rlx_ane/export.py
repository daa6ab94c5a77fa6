"""``rlx export MODEL --target ane -o MODEL.mlpackage``: a Core ML ML Program for the Neural Engine.

The graph is dispatched and lowered for ``ane:0`` (the claims of :mod:`rlx_ane.plugin`), the LIR
becomes a MIL plan (:mod:`rlx_ane.plan`), and coremltools builds, converts, saves and validates the
``.mlpackage`` in a child process (:mod:`rlx_ane.mil_worker`). A child because importing
coremltools imports every framework it can convert from (torch, scikit-learn, TensorFlow,
transformers: tens of seconds and a changed process) unless they are hidden, and hiding modules is
something only a process of our own may do. Prediction needs macOS: nothing here runs the model.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click
import numpy as np

from rlx_core.plugin import IRError, export_options

#: Seconds the coremltools child may take per model before it is stopped.
WORKER_TIMEOUT = 600


def lower_graph(graph: Any, *, bindings: Mapping[str, int] | None = None, hub: Any = None) -> Any:
    """Dispatch and lower ``graph`` for ``ane:0`` (unavailable here: lowering needs no device).
    Symbols not in ``bindings`` are bound to 1."""
    from rlx_core.plugin import Session

    bind = {s: 1 for s in graph.symbols}
    bind.update(bindings or {})
    return Session("ane:0", hub=hub, use_cache=False, fusion=False, lower_only=True).lower(graph, bind)


def export_many(items: Sequence[tuple[Any, str | Path]], *, bindings: Mapping[str, int] | None = None,
                precision: str = "fp16", hub: Any = None) -> list[dict[str, Any]]:
    """Export each ``(graph, path.mlpackage)`` with one coremltools process; returns one report per
    model (op types in the saved MIL program, features, the checks that passed). Raises
    :class:`IRError` naming the graph when coremltools rejects or cannot reload a model."""
    from .plan import build_plan

    if precision not in ("fp16", "fp32"):
        raise IRError(f"precision {precision!r} is not fp16 or fp32", fix="use --precision fp16 (the ANE's)")
    with tempfile.TemporaryDirectory(prefix="rlx-ane-") as tmp:
        jobs = []
        for k, (graph, out) in enumerate(items):
            program = lower_graph(graph, bindings=bindings, hub=hub)
            plan, consts = build_plan(program)
            plan_path, consts_path = Path(tmp, f"plan{k}.json"), Path(tmp, f"consts{k}.npz")
            plan_path.write_text(json.dumps(plan))
            np.savez(consts_path, **consts)  # type: ignore[arg-type]  # numpy's stub misreads **kwds
            out_path = Path(out)
            if out_path.suffix != ".mlpackage":
                raise IRError(f"{out_path} does not end in .mlpackage", fix="name the output MODEL.mlpackage")
            out_path.parent.mkdir(parents=True, exist_ok=True)
            jobs.append({"plan": str(plan_path), "consts": str(consts_path), "out": str(out_path),
                         "report": str(Path(tmp, f"report{k}.json")), "precision": precision,
                         "graph": graph.name, "kernels": [s.kernel for s in program.kernels]})
        jobs_path = Path(tmp, "jobs.json")
        jobs_path.write_text(json.dumps(jobs))
        try:
            proc = subprocess.run([sys.executable, "-m", "rlx_ane.mil_worker", str(jobs_path)],
                                  capture_output=True, text=True, timeout=WORKER_TIMEOUT * max(len(jobs), 1))
        except subprocess.TimeoutExpired as e:
            raise IRError("coremltools did not finish converting", where="rlx-ane export",
                          fix="export fewer or smaller graphs at a time") from e
        reports = []
        for job in jobs:
            rp = Path(job["report"])
            if not rp.is_file():
                tail = (proc.stderr or "").strip().splitlines()[-5:]
                raise IRError(f"the coremltools worker exited with {proc.returncode} before graph "
                              f"{job['graph']!r}: {' | '.join(tail)}", where="rlx-ane export",
                              fix="check that coremltools is installed: pip install 'coremltools>=9'")
            rep = json.loads(rp.read_text())
            if not rep.get("ok"):
                raise IRError(f"coremltools rejected the ML Program of graph {job['graph']!r}: "
                              f"{rep['error']}", where="rlx-ane export",
                              fix="report it: the claims promised a valid MIL program")
            reports.append({"path": job["out"], "graph": job["graph"], "precision": precision,
                            "kernels": job["kernels"], **{k: v for k, v in rep.items() if k != "ok"}})
        return reports


def export_graph(graph: Any, out: str | Path, *, bindings: Mapping[str, int] | None = None,
                 precision: str = "fp16", hub: Any = None) -> dict[str, Any]:
    """Write ``out`` (a ``.mlpackage``) for ``graph`` and validate it; returns its report."""
    return export_many([(graph, out)], bindings=bindings, precision=precision, hub=hub)[0]


@click.command("export", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@export_options("ane", "ane = a Core ML ML Program (.mlpackage) for the Apple Neural Engine")
@click.option("--precision", type=click.Choice(["fp16", "fp32"]), default="fp16", show_default=True,
              help="Compute precision of the ML Program: fp16 is what the Neural Engine runs; fp32 "
                   "models run on the GPU or CPU.")
def export_command(model: str, target_name: str, out_dir: str, binds: tuple[str, ...], precision: str,
                   as_json: bool) -> None:
    """Export a model as a Core ML ML Program, validated with coremltools (prediction needs macOS).

    \b
    Examples:
      rlx export mlp.rlx --target ane -o mlp.mlpackage --bind batch=1
      # on a Mac: coremltools.models.MLModel("mlp.mlpackage").predict({...})
    """
    from rlx_core.plugin import echo_json, load_model, parse_bindings

    graph = load_model(model)
    out = out_dir if out_dir.endswith(".mlpackage") else str(Path(out_dir, f"{Path(model).stem}.mlpackage"))
    info = export_graph(graph, out, bindings=parse_bindings(binds), precision=precision)
    if as_json:
        echo_json(info)
        return
    ops = ", ".join(f"{k} x{v}" for k, v in sorted(info["op_types"].items()))
    click.echo(f"wrote {info['path']} (ML Program, spec {info['spec_version']}, {precision}; "
               f"coremltools {info['coremltools']})")
    click.echo(f"  inputs {', '.join(info['inputs'])}; outputs {', '.join(info['outputs'])}")
    click.echo(f"  MIL ops: {ops}")
    click.echo("  validated: " + ", ".join(info["checks"])
               + "; not executed (Core ML prediction needs macOS)")
