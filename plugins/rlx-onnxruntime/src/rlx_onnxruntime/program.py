"""A compiled RLX program as ONE ONNX model run by one InferenceSession.

Every kernel step of the LIR program was claimed by this backend (the dispatcher decomposed or
refused the rest), so the whole program is translated: graph inputs and weights become ONNX inputs
and initializers, each step its ONNX nodes, and ONNX Runtime plans memory and threads itself (the
RLX buffer plan is not used: ORT's own allocator owns every intermediate).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from rlx_core.plugin import InputError, IRError, Step, TensorType

from . import session as ortsession
from .translate import OnnxGraph, Untranslatable, host_input, host_output, model, translate

#: ONNX Runtime's messages for an index outside its axis (Gather, ScatterElements, GatherElements).
_INDEX_ERRORS = ("out of bounds", "out of data bounds", "indices element out of", "index out of")


class OrtProgram:
    """``run(inputs) -> {value: array}``; ``profile`` counts each step's kernel once per run."""

    def __init__(self, program: Any, providers: list[str]) -> None:
        g = OnnxGraph()
        graph = program.graph
        types: dict[str, TensorType] = graph.types
        names: dict[str, str] = {}
        feeds: list[tuple[str, str, TensorType]] = []  # (rlx value, onnx name, type)
        for v in program.inputs:
            names[v.name] = g.fresh("x")
            feeds.append((v.name, names[v.name], types[v.name]))
        for p in graph.params:
            names[p.name] = g.const(np.asarray(graph.weights[p.name]))
        kernels: list[str] = []
        for s in program.steps:
            if not isinstance(s, Step):
                continue  # host memory device: the lowering inserts no transfers
            outs = [g.fresh("v") for _ in s.outputs]
            try:
                translate(g, s.op, [names[i] for i in s.inputs], outs, [types[i] for i in s.inputs],
                          [types[o] for o in s.outputs], s.attrs)
            except Untranslatable as e:  # a claim accepted what the translation refuses: a bug here
                raise IRError(f"step {s.node!r} ({s.op}) has no ONNX translation: {e}",
                              where=f"rlx-onnxruntime compiling {graph.name!r}",
                              fix="report it: the claim and the translation disagree") from None
            names.update(zip(s.outputs, outs))
            kernels.append(s.kernel)
        # Graph outputs must be produced by nodes under unique names: an input or weight returned
        # as it is, or one value returned twice, gets its own Identity.
        out_names: list[tuple[str, str, TensorType]] = []  # (rlx value, onnx name, type)
        produced = {o for n in g.nodes for o in n.output}
        seen: set[str] = set()
        for _, value in program.outputs:
            if value in seen:
                continue
            seen.add(value)
            src = names[value]
            if src not in produced:
                src = g.node("Identity", [src])
            out_names.append((value, src, types[value]))
        self.model = model(g, [(o, t) for _, o, t in feeds], [(o, t) for _, o, t in out_names])
        self.providers = providers
        self.kernels = kernels
        self._feeds = feeds
        self._outs = out_names
        self._fetch = [o.name for o in self.model.graph.output]  # a bf16 output's widened name
        data = self.model.SerializeToString()
        self.model_bytes = len(data)
        self.session, self.from_cache = ortsession.session(data, providers)
        self.graph_name = graph.name

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {onnx: host_input(inputs[rlx], t) for rlx, onnx, t in self._feeds}
        try:
            got = self.session.run_with_ort_values(self._fetch, feed)
        except Exception as e:
            text = str(e)
            if any(m in text for m in _INDEX_ERRORS):
                # An index computed inside the program fell outside its axis (the host checks
                # graph inputs before the run; ONNX Runtime checks the rest and refuses).
                raise InputError(f"an index is out of range in {self.graph_name!r}: "
                                 f"{text.strip().splitlines()[0][:300]}",
                                 where="rlx-onnxruntime run",
                                 fix="keep indices within [-n, n-1] of their axis") from None
            raise
        return {rlx: host_output(a, t) for (rlx, _, t), a in zip(self._outs, got)}

    def profile(self, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Counter[str]]:
        # One session run executes every translated step once.
        return self.run(inputs), Counter(self.kernels)
