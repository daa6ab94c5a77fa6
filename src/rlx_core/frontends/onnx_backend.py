"""An ``onnx.backend.base.Backend`` for RLX, and the ONNX backend node-test suite run on it.

``RLXBackend.prepare(model, device)`` imports the model with :func:`~rlx_core.frontends.onnx.load_onnx`
and compiles it with :class:`~rlx_core.runtime.Session` on an RLX device; the returned
:class:`RLXBackendRep` runs it and gives the outputs in the model's output order, as every ONNX
backend does. So the official runner works unchanged::

    import onnx.backend.test
    from rlx_core.frontends.onnx_backend import RLXBackend
    globals().update(onnx.backend.test.BackendTest(RLXBackend, __name__).test_cases)

Device: an ONNX device string maps to an RLX device (``"CPU"`` -> ``"cpu"``, ``"CUDA:1"`` ->
``"cuda:1"``); an RLX device name (``"cpu"``, ``"vulkan:0"``) is used as given. ``RLX_ONNX_DEVICE``
(or :data:`DEFAULT_DEVICE`, or ``prepare(..., rlx_device=...)``) replaces the mapping, so the ONNX
runner's ``"CPU"`` tests can run on any installed RLX backend.

Nothing is hidden: a model the importer cannot translate raises
:class:`~rlx_core.frontends.onnx.UnsupportedOnnxError`, one the backend cannot run raises
:class:`~rlx_core.errors.DispatchError`, both from ``prepare``.

The node tests (:func:`node_test_cases`, :func:`run_case`, :func:`run_suite`) are generated in
memory from the ``onnx`` package's own test-case code (``onnx.backend.test.case.node``; the data
files are no longer shipped), and compared exactly as ``onnx.backend.test.runner`` does, with each
case's own tolerances (rtol=1e-3, atol=1e-7). ``scripts/onnx_node_tests.py`` is the command line;
``plugins/rlx-<backend>/onnx-node-excludes.txt`` lists, with a reason, every case that does not
pass on that backend.
"""

from __future__ import annotations

import os
import re
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DispatchError, IRError, PluginError, RLXError, SerializationError
from .onnx import (
    MAX_OPSET,
    MIN_OPSET,
    DataDependentShapeError,
    RuntimeValueError,
    SymbolicShapeError,
    UnsupportedOnnxError,
    load_onnx,
    read_model,
)
from .onnx_optional import optional_tensor_inputs, with_presence
from .onnx_seq import pack_outputs

try:  # the adapter subclasses onnx's own base classes when onnx is installed
    from onnx.backend.base import Backend as _OnnxBackend
    from onnx.backend.base import BackendRep as _OnnxBackendRep
    from onnx.backend.base import namedtupledict as _namedtupledict
except ImportError:  # pragma: no cover - load_onnx raises the install hint on first use
    _OnnxBackend = object  # type: ignore[assignment,misc]
    _OnnxBackendRep = object  # type: ignore[assignment,misc]
    _namedtupledict = None  # type: ignore[assignment]

#: The RLX device every ONNX device maps to when set (``RLX_ONNX_DEVICE`` wins over it).
DEFAULT_DEVICE: str | None = None

_ONNX_DEVICE_RE = re.compile(r"^(CPU|CUDA)(?::(\d+))?$")


def rlx_device(device: str | None = "CPU", rlx_device: str | None = None) -> str:
    """The RLX device for an ONNX device string (see the module docstring for the order)."""
    if rlx_device:
        return rlx_device
    from ..settings import ONNX_DEVICE

    forced = ONNX_DEVICE.get() or DEFAULT_DEVICE
    if forced:
        return forced
    device = (device or "CPU").strip()
    m = _ONNX_DEVICE_RE.match(device)
    if m:
        return m.group(1).lower() + (f":{m.group(2)}" if m.group(2) else "")
    return device


_SESSIONS: dict[tuple[int, str, bool | None, bool | None], Any] = {}


def _session(device: str, use_cache: bool | None, fusion: bool | None) -> Any:
    """One Session per (hub, device, options): its dispatcher memoises per op variant across models."""
    from .._hub import hub
    from ..runtime import Session

    h = hub()
    key = (id(h), device, use_cache, fusion)
    s = _SESSIONS.get(key)
    if s is None or s.hub is not h:
        s = _SESSIONS[key] = Session(device, hub=h, use_cache=use_cache, fusion=fusion)
    return s


def _clamped(proto: Any) -> Any:
    """A copy whose default-domain opset is clamped into [MIN_OPSET, MAX_OPSET] (what-if only: an
    operator whose definition changed across the clamp is then read with the other definition)."""
    from onnx import ModelProto

    m = ModelProto()
    m.CopyFrom(proto)
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = min(max(int(o.version), MIN_OPSET), MAX_OPSET)
    return m


def _independent_outputs(graph: Any) -> list[str]:
    """Outputs that depend on no graph input (computed entirely at import time)."""
    live = {v.name for v in graph.inputs}
    for node in graph.nodes:
        if any(i in live for i in node.inputs):
            live.update(node.outputs)
    return [o for o in graph.outputs if o not in live]


class RLXBackendRep(_OnnxBackendRep):
    """A compiled model: ``run(inputs)`` -> the outputs, in the model's output order.

    ``executable``: the compiled graph when one RLX graph holds the model; ``staged``: the core's
    :class:`~rlx_core.frontends.onnx_staged.StagedModel` when its shapes depend on run-time values or
    data (then ``executable`` and ``graph`` are None).
    """

    def __init__(self, executable: Any, input_names: Sequence[str], output_names: Sequence[str],
                 device: str, *, staged: Any = None) -> None:
        self.executable = executable
        self.staged = staged
        self.graph = executable.graph if executable is not None else None
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self.device = device

    def _feed(self, inputs: Any) -> dict[str, Any]:
        if isinstance(inputs, Mapping):
            return dict(inputs)
        if isinstance(inputs, np.ndarray) or not isinstance(inputs, (list, tuple)):
            inputs = [inputs]
        if len(inputs) != len(self.input_names):
            from ..errors import InputError

            raise InputError(f"{len(inputs)} input(s) given, the model takes {len(self.input_names)} "
                             f"({', '.join(self.input_names) or 'none'})", where="ONNX backend rep",
                             fix="pass one array per model input, in order, or a dict by name")
        return dict(zip(self.input_names, inputs))

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """``inputs``: a list/tuple in the model's input order, a dict by name, or one array."""
        feed = self._feed(inputs)
        if self.staged is not None:
            out = self.staged.run(feed)
        else:  # a sequence output's elements y[0], y[1] ... as one list (onnx_seq)
            out = pack_outputs(self.output_names, self.executable.run(feed))[0]
        values = [out[n] for n in self.output_names]
        if _namedtupledict is None:  # pragma: no cover
            return tuple(values)
        return _namedtupledict("Outputs", self.output_names)(*values)


class PresenceRep(RLXBackendRep):
    """A model with ``optional(tensor)`` inputs: fed an array, an optional is that tensor; fed None,
    it is empty. One :class:`RLXBackendRep` per presence signature (which optional inputs are None),
    each prepared from the model with the empty ones removed (:func:`~rlx_core.frontends.onnx_optional.
    with_presence`); ``executable``/``staged``/``graph`` are those of the variant run last."""

    def __init__(self, proto: Any, input_names: Sequence[str], output_names: Sequence[str], device: str,
                 prepare: Any) -> None:
        super().__init__(None, input_names, output_names, device)
        self.proto = proto
        self.optional = tuple(optional_tensor_inputs(proto))
        self.prepare = prepare
        self.variants: dict[tuple[str, ...], RLXBackendRep] = {}

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        feed = self._feed(inputs)
        absent = tuple(n for n in self.optional if n in feed and feed[n] is None)
        rep = self.variants.get(absent)
        if rep is None:
            rep = self.variants[absent] = self.prepare(with_presence(self.proto, absent))
        self.executable, self.staged, self.graph = rep.executable, rep.staged, rep.graph
        return rep.run({k: v for k, v in feed.items() if k not in absent}, **kwargs)


class RLXBackend(_OnnxBackend):
    """ONNX backend API over RLX: ``prepare`` = ``load_onnx`` + ``Session(device).compile``.

    ``prepare`` keywords:

    * ``rlx_device``: an RLX device name (wins over ``device``);
    * ``use_cache``: the on-disk compile cache (default: on unless ``RLX_NO_CACHE``);
    * ``fusion``: elementwise fusion (default: ``RLX_FUSION``, on);
    * staged execution: a model whose shapes depend on run-time values or data (the importer's
      RuntimeValueError, DataDependentShapeError, SymbolicShapeError: ``ReduceSum(x, axes)`` with
      ``axes`` fed at run time, as the ONNX node tests do, NonZero, ...) runs as the core's
      :class:`~rlx_core.frontends.onnx_staged.StagedModel` (``rep.staged``), exactly as
      :func:`~rlx_core.frontends.onnx.load_onnx_model` and ``rlx run`` run it;
    * ``freeze_inputs``: accepted for compatibility and ignored (the adapter's own input freezing was
      replaced by the core's staged execution);
    * ``clamp_opset`` (default False, a what-if): read the model as if its default-domain opset were
      clamped into the importer's range [MIN_OPSET, MAX_OPSET];
    * ``load_onnx``'s ``symbols``, ``input_shapes``, ``batch_symbol``, ``fuse``, ``name``.
    """

    @classmethod
    def is_compatible(cls, model: Any, device: str = "CPU", **kwargs: Any) -> bool:
        return True  # the importer itself says what it cannot translate, with the reason

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> RLXBackendRep:
        dev = rlx_device(device, kwargs.pop("rlx_device", None))
        use_cache, fusion = kwargs.pop("use_cache", None), kwargs.pop("fusion", None)
        session = _session(dev, use_cache, fusion)
        kwargs.pop("freeze_inputs", None)  # replaced by the core's staged execution
        clamp = kwargs.pop("clamp_opset", False)
        load_kw = {k: kwargs.pop(k) for k in ("symbols", "input_shapes", "batch_symbol", "fuse", "name")
                   if k in kwargs}
        proto, _ = read_model(model)
        if clamp:
            proto = _clamped(proto)
        inits = {t.name for t in proto.graph.initializer}
        input_names = [vi.name for vi in proto.graph.input if vi.name not in inits]
        output_names = [o.name for o in proto.graph.output]
        if optional_tensor_inputs(proto):  # compiled per presence of each optional input (None: empty)
            return PresenceRep(proto, input_names, output_names, dev,
                               lambda p: cls.prepare(p, rlx_device=dev, use_cache=use_cache, fusion=fusion,
                                                     **load_kw))
        try:
            graph = load_onnx(proto, **load_kw)
        except (RuntimeValueError, DataDependentShapeError, SymbolicShapeError):
            from .onnx_staged import StagedModel

            staged = StagedModel(proto, session=session, **load_kw)
            return RLXBackendRep(None, input_names, output_names, dev, staged=staged)
        return RLXBackendRep(session.compile(graph), input_names, output_names, dev)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: Any, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one ``NodeProto`` on ``inputs`` (arrays in the node's input order)."""
        from onnx import defs, helper

        opset = int(kwargs.pop("opset_version", min(defs.onnx_opset_version(), MAX_OPSET)))
        arrays = [np.asarray(a) for a in (inputs.values() if isinstance(inputs, Mapping) else inputs)]
        names = [n for n in node.input if n]
        vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
               for n, a in zip(names, arrays)]
        outs = []
        for k, n in enumerate(o for o in node.output if o):
            if outputs_info is not None and k < len(outputs_info):
                dt, shape = outputs_info[k]
                outs.append(helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(dt)),
                                                          shape))
            else:
                outs.append(helper.make_tensor_value_info(n, 0, None))
        graph = helper.make_graph([node], f"{node.op_type or 'node'}_graph", vis, outs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        return cls.prepare(model, device, **kwargs).run(arrays)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        from .._hub import hub, parse_device

        try:
            name, idx = parse_device(rlx_device(device))
            hub().load(name).device(idx)
        except Exception:
            return False
        return True


# ---------------------------------------------------------------------------------------------
# The node test suite

PASSED, FAILED, UNSUPPORTED, ERROR = "passed", "failed", "unsupported", "error"
STATUSES = (PASSED, FAILED, UNSUPPORTED, ERROR)

#: Out of scope for RLX (tensors only): these operators, and any optional/map/string value. Sequences
#: are in scope: import-time lists of tensors (:mod:`rlx_core.frontends.onnx_seq`).
SEQUENCE_OPS = frozenset({"SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase",
                          "SequenceInsert", "SequenceLength", "SequenceMap", "SplitToSequence",
                          "ConcatFromSequence"})
OPTIONAL_OPS = frozenset({"Optional", "OptionalGetElement", "OptionalHasElement"})
STRING_OPS = frozenset({"StringNormalizer", "StringConcat", "StringSplit", "RegexFullMatch"})
TRAINING_DOMAINS = frozenset({"ai.onnx.preview.training", "ai.onnx.training"})


@dataclass
class CaseResult:
    """One node test case on one device."""

    name: str
    op: str
    status: str
    stage: str = ""           # where it stopped: import, compile, run, compare ("" when passed)
    reason: str = ""          # one line: why it is not passed
    detail: str = ""          # the full message
    opset: int | None = None
    expanded: bool = False    # a function-expanded variant (``*_expanded``) of the op's test
    folded: bool = False      # an output was computed at import time (it uses no run-time input)
    staged: str = ""          # how the core's staged execution ran it ("" when one plain graph did)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SuiteResult:
    device: str
    onnx_version: str
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        c = dict.fromkeys(STATUSES, 0)
        for r in self.results:
            c[r.status] += 1
        return c

    def by_name(self) -> dict[str, CaseResult]:
        return {r.name: r for r in self.results}


def node_test_cases(pattern: str | None = None) -> list[Any]:
    """The ``onnx`` package's node test cases (``onnx.backend.test.case.TestCase``), generated in
    memory from its Python code; ``pattern`` keeps names containing that substring."""
    import onnx.backend.test.case.node as node_cases
    from onnx.backend.test.loader import load_node_model_tests

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = list(load_node_model_tests())
    origin = {name: n for name, n in node_cases._existing_names.items()}
    for c in cases:
        base = re.sub(r"_expanded(_ver\d+)?$", "", c.name)
        n = origin.get(base)
        c.rlx_op = _op_label(n) if n is not None else _model_op(c.model)  # type: ignore[attr-defined]
        c.rlx_expanded = base != c.name  # type: ignore[attr-defined]
    if pattern:
        cases = [c for c in cases if pattern in c.name]
    return sorted(cases, key=lambda c: c.name)


def _op_label(node: Any) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _model_op(model: Any) -> str:
    nodes = [n for n in model.graph.node if n.op_type != "Constant"] or list(model.graph.node)
    return _op_label(nodes[-1]) if nodes else "(none)"


def _default_opset(model: Any) -> int | None:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return None


def _value_kinds(model: Any) -> set[str]:
    """The non-tensor kinds (and string tensors) among the model's typed values."""
    kinds: set[str] = set()

    def visit(tp: Any) -> None:
        which = tp.WhichOneof("value")
        if which == "tensor_type":
            if tp.tensor_type.elem_type == 8:  # STRING
                kinds.add("string")
        elif which in ("sequence_type", "optional_type", "map_type"):
            kinds.add(which.split("_")[0])
        elif which == "sparse_tensor_type":
            kinds.add("sparse")

    g = model.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        visit(vi.type)
    if any(t.data_type == 8 for t in g.initializer):
        kinds.add("string")
    return kinds


def _all_nodes(graph: Any) -> Iterator[Any]:
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.type == 5:  # GRAPH
                yield from _all_nodes(a.g)
            elif a.type == 10:  # GRAPHS
                for sub in a.graphs:
                    yield from _all_nodes(sub)


def out_of_scope(model: Any) -> str | None:
    """Why a model is out of scope for RLX (optional/string/training), or None."""
    nodes = list(_all_nodes(model.graph))
    kinds = _value_kinds(model)
    ops = {n.op_type for n in nodes}
    if any(n.domain in TRAINING_DOMAINS for n in nodes):
        return "out of scope: training operator (ai.onnx.preview.training: optimizers, gradients)"
    if ops & OPTIONAL_OPS or "optional" in kinds:
        return "out of scope: optional values (RLX graphs carry tensors only)"
    if ops & STRING_OPS or "string" in kinds:
        return "out of scope: string tensors (RLX has numeric dtypes only)"
    if "map" in kinds or "sparse" in kinds:
        return "out of scope: map/sparse values (RLX graphs carry dense tensors only)"
    return None


def _one_line(e: BaseException) -> str:
    what = e.what if isinstance(e, RLXError) else str(e)
    line = " ".join(what.strip().split())
    return line[:300]


def run_case(case: Any, device: str = "cpu", *, use_cache: bool = False, fusion: bool | None = None,
             clamp_opset: bool = False) -> CaseResult:
    """Prepare, run and compare one node test case, as ``onnx.backend.test.runner`` does.

    passed: the outputs match; failed: it ran, the outputs differ (numbers, shape or dtype);
    unsupported: the importer raised UnsupportedOnnxError, the backend has no dispatch path
    (DispatchError), or the model is out of scope (optional/string/training); error:
    anything else (an importer or backend bug).
    """
    from onnx.backend.test.runner import Runner, _normalize_tensor

    model = case.model
    res = CaseResult(case.name, getattr(case, "rlx_op", _model_op(model)), PASSED,
                     opset=_default_opset(model), expanded=getattr(case, "rlx_expanded", False))
    t0 = time.perf_counter()
    stage, rep = "import", None
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            rep = RLXBackend.prepare(model, "CPU", rlx_device=device, use_cache=use_cache, fusion=fusion,
                                     clamp_opset=clamp_opset)
            for inputs, ref_outputs in case.data_sets:
                stage = "run"
                outs = rep.run([_normalize_tensor(x) for x in inputs])
                stage = "compare"
                refs = [_normalize_tensor(x) for x in ref_outputs]
                Runner.assert_similar_outputs(refs, list(outs), rtol=case.rtol, atol=case.atol)
    except AssertionError as e:
        res.status, res.stage = FAILED, stage
        res.detail = str(e).strip()
        res.reason = _compare_reason(res.detail)
    except Exception as e:
        if isinstance(e, DispatchError) or (stage == "import" and isinstance(e, PluginError)):
            stage = "compile"
        elif isinstance(e, (IRError, SerializationError)):
            stage = "import"  # also when a staged model imports its next stage at run
        res.stage = stage
        res.detail = f"{type(e).__name__}: {e}"
        scope = out_of_scope(model)
        if scope is not None:
            res.status, res.reason = UNSUPPORTED, scope
        elif isinstance(e, UnsupportedOnnxError):
            res.status, res.reason = UNSUPPORTED, _one_line(e)
        elif isinstance(e, DispatchError):
            res.status, res.reason = UNSUPPORTED, "no dispatch path on the backend: " + _one_line(e)
        else:
            res.status, res.reason = ERROR, f"{type(e).__name__}: {_one_line(e)}"
    if rep is not None:
        if rep.graph is not None:
            res.folded = bool(_independent_outputs(rep.graph))
        if rep.staged is not None:
            res.staged = _staged_summary(rep.staged)
            if res.status == PASSED and rep.staged.last_origins and \
                    all(o == "host" for o in rep.staged.last_origins.values()):
                # Comparing onnx's reference with itself certifies nothing about the backend.
                res.status, res.stage = UNSUPPORTED, "run"
                res.reason = (f"staged execution computes every output on the host ({res.staged}); "
                              f"nothing runs on the backend")
    res.seconds = time.perf_counter() - t0
    return res


def _staged_summary(sm: Any) -> str:
    """One line: the boundaries staged execution met (value-keyed inputs, host ops, shapes)."""
    parts: list[str] = []

    def visit(st: Any) -> None:
        if st.kind == "values":
            parts.append("value-keyed " + ",".join(st.needed))
        elif st.kind == "host":
            parts.append("host op " + st.host.op_type)
        elif st.kind == "bounded":
            parts.append("bounded op " + st.host.op_type)
        elif st.kind == "shapes":
            parts.append("shape-specialised")
        for sub in ([st.stage1] if st.stage1 is not None else []) + list(st.variants.items.values()):
            visit(sub)

    visit(sm.root)
    return "; ".join(dict.fromkeys(parts))


def _compare_reason(detail: str) -> str:
    lines = [ln.strip() for ln in detail.splitlines() if ln.strip()]
    head = lines[0] if lines else "outputs differ"
    for ln in lines:
        if ln.startswith("Mismatched elements") or ln.startswith("Max absolute"):
            head = f"{head} ({ln})"
            break
    return head[:300]


def run_suite(device: str = "cpu", *, pattern: str | None = None, cases: Iterable[Any] | None = None,
              use_cache: bool = False, fusion: bool | None = None,
              clamp_opset: bool = False, progress: Any = None) -> SuiteResult:
    """Run every node test case (or those whose name contains ``pattern``) on ``device``."""
    import onnx

    t0 = time.perf_counter()
    todo = list(cases) if cases is not None else node_test_cases(pattern)
    suite = SuiteResult(device, onnx.__version__)
    for i, case in enumerate(todo):
        r = run_case(case, device, use_cache=use_cache, fusion=fusion,
                     clamp_opset=clamp_opset)
        suite.results.append(r)
        if progress is not None:
            progress(i, len(todo), r)
    suite.seconds = time.perf_counter() - t0
    return suite


# ---------------------------------------------------------------------------------------------
# Per-backend exclusion files: ``test_name # reason`` per line


def excludes_path(device: str) -> Path:
    """``plugins/rlx-<backend>/onnx-node-excludes.txt`` in this source tree."""
    backend = device.split(":")[0]
    return Path(__file__).resolve().parents[3] / "plugins" / f"rlx-{backend}" / "onnx-node-excludes.txt"


def read_excludes(path: str | os.PathLike[str]) -> dict[str, str]:
    """``{test name: reason}``; raises ValueError for a line without a reason or a repeated name."""
    out: dict[str, str] = {}
    for k, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, reason = line.partition(" # ")
        name, reason = name.strip(), reason.strip()
        if not sep or not reason:
            raise ValueError(f"{path}:{k}: {name!r} has no reason (write 'test_name # why it fails')")
        if name in out:
            raise ValueError(f"{path}:{k}: {name!r} is listed twice")
        out[name] = reason
    return out


@dataclass
class ExcludeCheck:
    regressions: list[CaseResult]     # not excluded, not passed
    stale: list[str]                  # excluded, but passed
    unknown: list[str]                # excluded, but no such test case

    @property
    def ok(self) -> bool:
        return not (self.regressions or self.stale or self.unknown)

    def to_text(self) -> str:
        lines = []
        if self.regressions:
            lines.append(f"{len(self.regressions)} test(s) do not pass and are not in the exclusion file:")
            lines += [f"  {r.name}: {r.status} at {r.stage}: {r.reason}" for r in self.regressions]
        if self.stale:
            lines.append(f"{len(self.stale)} excluded test(s) now pass (remove them from the file):")
            lines += [f"  {n}" for n in self.stale]
        if self.unknown:
            lines.append(f"{len(self.unknown)} excluded name(s) are not node test cases:")
            lines += [f"  {n}" for n in self.unknown]
        return "\n".join(lines)


def check_excludes(suite: SuiteResult, excludes: Mapping[str, str], *,
                   names: Iterable[str] | None = None) -> ExcludeCheck:
    """Like ``xfail_strict``: every failing case is excluded, and every excluded case fails.
    ``names``: all case names known (for unknown-name detection); default: the suite's results."""
    by = suite.by_name()
    known = set(names) if names is not None else set(by)
    regress = [r for r in suite.results if r.status != PASSED and r.name not in excludes]
    stale = sorted(n for n in excludes if n in by and by[n].status == PASSED)
    unknown = sorted(n for n in excludes if n not in known)
    return ExcludeCheck(regress, stale, unknown)


__all__ = ["DEFAULT_DEVICE", "ERROR", "FAILED", "MAX_OPSET", "MIN_OPSET", "PASSED", "STATUSES", "UNSUPPORTED",
           "CaseResult", "ExcludeCheck", "RLXBackend", "RLXBackendRep", "SuiteResult", "check_excludes",
           "excludes_path", "node_test_cases", "out_of_scope", "read_excludes", "rlx_device", "run_case",
           "run_suite"]
