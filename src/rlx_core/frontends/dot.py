"""Write a graph as Graphviz DOT: ``to_dot(graph, report=None) -> str``.

Nodes are labelled with the op and its variant (the dispatch report's variant when a report is
given, else the op's attributes) and coloured by dispatch path: native, common_ir or rewritten
(white without a report). Edges carry the tensor type of the value they move. Render with
``dot -Tsvg graph.dot -o graph.svg``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..ir.graph import Graph

#: Fill colour per dispatch path.
PATH_COLORS: Mapping[str, str] = {"native": "#b7e4c7", "common_ir": "#a5d8ff", "rewritten": "#ffd8a8"}
_NO_REPORT = "#ffffff"
_INPUT, _PARAM, _OUTPUT = "#e9ecef", "#f8f9fa", "#fff3bf"
_NL = "\n"


def _q(s: str) -> str:
    """A DOT double-quoted string."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _attrs_text(attrs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in attrs.items() if v is not None)


def to_dot(graph: Graph, report: Any = None, *, params: bool = True, max_label: int = 80) -> str:
    """The graph as a Graphviz ``digraph``.

    ``report`` is a :class:`~rlx_core.report.DispatchReport` (from ``Session.plan`` or
    ``Executable.report``) for the same graph; its nodes are matched by name. ``params=False``
    leaves out parameter nodes (their edges too), which keeps large models readable.
    """
    entries = {e.node: e for e in getattr(report, "entries", ())} if report is not None else {}
    title = f"{graph.name}"
    if report is not None:
        title += f" on {report.device} (backend {report.backend} {report.backend_version})"
        if getattr(report, "bindings", None):
            title += " with " + ", ".join(f"{k}={v}" for k, v in report.bindings.items())
    lines = [
        f"digraph {_q(graph.name)} {{",
        f"  graph [label={_q(title)}, labelloc=t, fontname=\"Helvetica\", rankdir=TB];",
        '  node [fontname="Helvetica", fontsize=10, style="filled", shape=box];',
        '  edge [fontname="Helvetica", fontsize=8, color="#495057"];',
    ]
    ids: dict[str, str] = {}  # value name -> DOT id of the node that produces it
    param_names = {p.name for p in graph.params}
    for i, inp in enumerate(graph.inputs):
        ids[inp.name] = f"in{i}"
        label = _q(f"{inp.name}{_NL}{inp.type}")
        lines.append(f"  in{i} [label={label}, shape=ellipse, fillcolor=\"{_INPUT}\"];")
    if params:
        for i, p in enumerate(graph.params):
            ids[p.name] = f"p{i}"
            label = _q(f"{_cut(p.name, max_label)}{_NL}{p.type}")
            lines.append(f"  p{i} [label={label}, shape=note, fontsize=8, fillcolor=\"{_PARAM}\"];")
    for i, n in enumerate(graph.nodes):
        nid = f"n{i}"
        for o in n.outputs:
            ids[o] = nid
        e = entries.get(n.name)
        if e is not None:
            color = PATH_COLORS.get(e.path, _NO_REPORT)
            how = e.path + (f" via {e.via}" if e.via else "")
            kernels = ", ".join(e.kernels[:3]) + (f", +{len(e.kernels) - 3}" if len(e.kernels) > 3 else "")
            label = f"{n.op}\n{_cut(e.variant, max_label)}\n{how}: {_cut(kernels, max_label)}"
            tip = f"{n.name}: {e.variant} [{e.path}] on {e.device}"
        else:
            color = _NO_REPORT
            attrs = _attrs_text(n.attrs)
            label = f"{n.op}\n{_cut(attrs, max_label)}" if attrs else n.op
            tip = n.name
        lines.append(f"  {nid} [label={_q(label)}, tooltip={_q(tip)}, fillcolor=\"{color}\", "
                     f"style=\"filled,rounded\"];")
        for v in n.inputs:
            if v in param_names and not params:
                continue
            src = ids.get(v)
            if src is not None:
                lines.append(f"  {src} -> {nid} [label={_q(str(graph.types[v]))}];")
    for i, o in enumerate(graph.outputs):
        oid = f"out{i}"
        label = _q(f"{o}{_NL}{graph.types[o]}")
        lines.append(f"  {oid} [label={label}, shape=ellipse, fillcolor=\"{_OUTPUT}\"];")
        src = ids.get(o)
        if src is not None:
            lines.append(f"  {src} -> {oid} [label={_q(str(graph.types[o]))}];")
    if report is not None:
        lines.append("  subgraph cluster_legend {")
        lines.append('    label="dispatch path"; fontsize=9; style=dashed;')
        for path, color in PATH_COLORS.items():
            lines.append(f"    legend_{path} [label={_q(path)}, fillcolor=\"{color}\", "
                         f"style=\"filled,rounded\", fontsize=9];")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


__all__ = ["PATH_COLORS", "to_dot"]
