"""Up-front coverage of an ONNX model: every problem the importer would meet, all at once.

:func:`coverage` reads the file and checks each node against the importer's handler table and
its static rules (domain, operator, operator version for the model's opset, attributes the
schema defines, attribute values a handler refuses, dtypes RLX has, optional outputs), without
translating anything or building a graph. Where :func:`~rlx_core.frontends.onnx.load_onnx` stops
at the first problem, this lists them all, grouped, with counts and node names, so one look says
how far a model is from importing. ``rlx explain model.onnx --coverage`` prints it.

Nodes whose inputs are all known at import time (initializers, ``Constant``, shapes) are folded by
the importer, so they are counted apart and not held against the model. Problems that depend on
run-time values (a shape computed from tensor data, a symbolic dim that cannot be expressed) show
only when the model is actually imported.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import onnx as _o

#: Kinds of problem, in the order the report lists them.
KINDS = ("opset", "domain", "operator", "version", "attribute", "dtype", "output")

#: Node names listed per problem in the text report (all of them are in the JSON).
_TEXT_NAMES = 5


@dataclass
class Problem:
    """One unsupported thing, with every node that has it."""

    kind: str
    op: str
    detail: str
    fix: str
    nodes: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.nodes)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "op": self.op, "detail": self.detail, "fix": self.fix,
                "count": self.count, "nodes": list(self.nodes)}


@dataclass
class CoverageReport:
    """What :func:`coverage` found: ``ok`` is True when nothing is unsupported."""

    source: str
    opset: int | None
    domains: dict[str, int]
    nodes: int
    folded: int
    ops: dict[str, int]
    problems: list[Problem]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def unsupported_nodes(self) -> int:
        return len({n for p in self.problems for n in p.nodes if n})

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "opset": self.opset, "domains": dict(self.domains),
                "nodes": self.nodes, "folded_at_import": self.folded, "ops": dict(self.ops),
                "ok": self.ok, "unsupported_nodes": self.unsupported_nodes,
                "problems": [p.to_json() for p in self.problems]}

    def to_text(self) -> str:
        head = (f"{self.source}: default-domain opset {self.opset if self.opset is not None else 'none'}, "
                f"{self.nodes} node(s), {len(self.ops)} operator type(s)")
        if self.folded:
            head += f", {self.folded} folded at import (constant inputs)"
        lines = [head]
        if self.ok:
            lines.append("coverage: every node is supported by the RLX ONNX importer")
            return "\n".join(lines)
        lines.append(f"coverage: {len(self.problems)} problem(s) in {self.unsupported_nodes} node(s) "
                     f"the RLX ONNX importer cannot translate:")
        for p in self.problems:
            names = ", ".join(repr(n) for n in p.nodes[:_TEXT_NAMES])
            more = f" (+{p.count - _TEXT_NAMES} more)" if p.count > _TEXT_NAMES else ""
            where = f": {names}{more}" if p.nodes and p.nodes[0] else ""
            lines.append(f"  [{p.kind}] {p.op}: {p.detail} -- {p.count} node(s){where}")
            lines.append(f"      fix: {p.fix}")
        return "\n".join(lines)


class _Collector:
    def __init__(self) -> None:
        self.problems: dict[tuple[str, str, str], Problem] = {}

    def add(self, kind: str, op: str, detail: str, fix: str, node: str) -> None:
        p = self.problems.setdefault((kind, op, detail), Problem(kind, op, detail, fix))
        if node not in p.nodes:
            p.nodes.append(node)

    def sorted(self) -> list[Problem]:
        return sorted(self.problems.values(), key=lambda p: (KINDS.index(p.kind), -p.count, p.op, p.detail))


def _type_problem(tp: Any) -> str | None:
    """Why an ONNX TypeProto is not an RLX tensor type (None when it is, or is not given)."""
    which = tp.WhichOneof("value") if tp is not None else None
    if which is None:
        return None
    if which == "sequence_type":  # a list of tensors at import (onnx_seq): its elements must be RLX tensors
        inner = _type_problem(tp.sequence_type.elem_type)
        return None if inner is None else f"a sequence of {inner}"
    if which != "tensor_type":
        return {"sequence_type": "a sequence", "map_type": "a map", "optional_type": "an optional",
                "sparse_tensor_type": "a sparse tensor"}.get(which, which) + " (RLX values are dense tensors)"
    code = tp.tensor_type.elem_type
    if code and code not in _o._ONNX_TO_DTYPE:
        return f"dtype {_o._onnx_type_name(code)} (not an RLX dtype)"
    return None


_DTYPE_FIX = (f"RLX dtypes: {', '.join(d.value for d in _o.DType)}; cast to one of them in the model "
              f"before export")


def _node_attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    out: dict[str, Any] = {}
    for a in node.attribute:
        if a.ref_attr_name:
            continue
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v  # as the importer reads it
    return out


def _walk(graph: Any, prefix: str, opset: int, col: _Collector, static: set[str], counts: dict[str, int],
          ops: dict[str, int], folded: list[int]) -> None:
    for t in graph.initializer:
        static.add(t.name)
        if t.data_type not in _o._ONNX_TO_DTYPE:
            col.add("dtype", "(initializer)", f"dtype {_o._onnx_type_name(t.data_type)} (not an RLX dtype)",
                    _DTYPE_FIX, f"{prefix}{t.name}")
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        why = _type_problem(vi.type)
        if why is not None:
            col.add("dtype", "(value)", why, _DTYPE_FIX, f"{prefix}{vi.name}")
    for idx, node in enumerate(graph.node):
        op = node.op_type
        label = f"{prefix}{node.name or f'{op}_{idx}'}"
        counts["nodes"] += 1
        key = op if node.domain in ("", "ai.onnx") else f"{node.domain}.{op}"
        ops[key] = ops.get(key, 0) + 1
        attrs = _node_attrs(node)
        for a in attrs.values():  # subgraphs (If branches, Loop/Scan bodies): checked too
            for sub in (a if isinstance(a, list) else [a]):
                if hasattr(sub, "node") and hasattr(sub, "initializer"):
                    _walk(sub, f"{label}/", opset, col, set(static), counts, ops, folded)
        present = [i for i in node.input if i]
        if node.domain not in ("", "ai.onnx"):
            if (node.domain, op) not in _o._CUSTOM:
                col.add("domain", f"{node.domain}.{op}", f"domain {node.domain!r} is not translated",
                        "RLX translates the default ONNX domain (plus handlers registered with "
                        f"rlx_core.frontends.onnx.register_handler({op!r}, fn, domain={node.domain!r})); "
                        "export with standard ONNX operators only", label)
            continue
        custom = ("", op) in _o._CUSTOM
        # A node whose inputs are all known at import is folded (or evaluated as shape arithmetic).
        if present and op not in _o._NO_FOLD and not custom and all(i in static for i in present):
            static.update(o for o in node.output if o)
            folded[0] += 1
            continue
        if op in ("Shape", "Size", "Constant"):
            static.update(o for o in node.output if o)
        if custom:
            continue
        if op not in _o._HANDLERS:
            col.add("operator", op, "not translated by the RLX ONNX importer",
                    "rewrite it with supported operators before export (rlx_core.frontends.onnx."
                    "supported_ops()), fold it away (onnx-simplifier), or add a converter with "
                    f"rlx_core.frontends.onnx.register_handler({op!r}, fn)", label)
            continue
        why = _o.op_version_problem(op, opset)
        if why is not None:
            col.add("version", op, why, _o._VERSION_FIX, label)
            continue
        known = _o._schema_attrs(op, opset)
        unknown = sorted(a for a in attrs if known and a not in known)
        if unknown:
            names = ", ".join(map(repr, unknown))
            col.add("attribute", op, f"attribute(s) {names} not defined in opset {opset}",
                    "the model is malformed or was written for another opset; check it with "
                    "onnx.checker.check_model", label)
        for rule in _o._ATTR_RULES.get(op, ()):
            refusal = rule(attrs, opset, node)
            if refusal is not None:
                col.add("attribute", op, refusal[0], refusal[1], label)
        if op in ("Cast", "ConstantOfShape", "Constant", "EyeLike", "RandomNormal", "RandomUniform"):
            code = _target_dtype(op, attrs)
            if code is not None and code not in _o._ONNX_TO_DTYPE:
                col.add("dtype", op, f"dtype {_o._onnx_type_name(code)} (not an RLX dtype)", _DTYPE_FIX,
                        label)
        limit = _o._MAX_OUTPUTS.get(op)
        if limit is not None:
            extra = [k for k, name in enumerate(node.output) if name and k >= limit]
            for k in extra:
                col.add("output", op, f"optional output {k} is not translated",
                        "do not use that output (re-export without it)", label)


def _target_dtype(op: str, attrs: dict[str, Any]) -> int | None:
    if op in ("Cast", "EyeLike", "RandomNormal", "RandomUniform"):
        v = attrs.get("to", attrs.get("dtype"))
        return None if v is None else int(v)
    t = attrs.get("value")
    return None if t is None or not hasattr(t, "data_type") else int(t.data_type)


def coverage(model: str | os.PathLike[str] | bytes | Any) -> CoverageReport:
    """Check every node of an ONNX model against what the importer translates, without importing.

    ``model`` is a path, bytes or an ``onnx.ModelProto``. A malformed file still raises
    :class:`~rlx_core.errors.SerializationError` (there is nothing to check then).
    """
    proto, source = _o.read_model(model)
    col = _Collector()
    domains = {(o.domain or "ai.onnx"): int(o.version) for o in proto.opset_import}
    opset = next((int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        col.add("opset", "(model)", "the model imports no default-domain (ai.onnx) opset",
                _o._domain_fix(), "")
        walk_opset = _o.MAX_OPSET
    elif not _o.MIN_OPSET <= opset <= _o.MAX_OPSET:
        col.add("opset", "(model)", f"default-domain opset {opset} is outside {_o.MIN_OPSET}-{_o.MAX_OPSET}",
                _o._VERSION_FIX, "")
        walk_opset = min(max(opset, _o.MIN_OPSET), _o.MAX_OPSET)
    else:
        walk_opset = opset
    if proto.functions:
        try:
            import onnx.inliner

            proto = onnx.inliner.inline_local_functions(proto)
        except Exception as e:
            col.add("operator", "(functions)", f"the model's local functions cannot be inlined ({e})",
                    "export without functions (export_modules_as_functions=False)", "")
    counts = {"nodes": 0}
    ops: dict[str, int] = {}
    folded = [0]
    _walk(proto.graph, "", walk_opset, col, set(), counts, ops, folded)
    return CoverageReport(source=source, opset=opset, domains=domains, nodes=counts["nodes"],
                          folded=folded[0], ops=dict(sorted(ops.items())), problems=col.sorted())


__all__: Sequence[str] = ("KINDS", "CoverageReport", "Problem", "coverage")
