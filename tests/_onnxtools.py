"""Small ONNX models for importer tests: one home for the builder and the rlx-cpu runner."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def make_model(nodes: Any, inputs: Sequence[tuple[str, int, Sequence[int]]], outputs: Sequence[str],
               inits: dict[str, np.ndarray] | None = None, opset: int = 18,
               ir_version: int | None = None) -> Any:
    """A model of ``nodes`` (one node or a list); output types come from ONNX shape inference (ONNX
    Runtime needs them), else the first input's type."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = nodes if isinstance(nodes, list) else [nodes]
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs]
    graph = helper.make_graph(nodes, "case",
                              [helper.make_tensor_value_info(n, dt, list(s)) for n, dt, s in inputs], outs,
                              initializer=[numpy_helper.from_array(np.asarray(a), n)
                                           for n, a in (inits or {}).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version if ir_version is not None else (8 if opset <= 18 else 10)
    inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in inferred.graph.output}
    for vi in m.graph.output:
        vi.type.tensor_type.elem_type = types.get(vi.name) or inputs[0][1]
    return m


def run_rlx(m: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Import ``m``, compile it on rlx-cpu (no disk cache), run ``feeds``: the outputs in order."""
    from rlx_core.frontends.onnx import load_onnx
    from rlx_core.runtime import Session

    graph = load_onnx(m)
    out = Session("cpu", use_cache=False).compile(graph).run(feeds)
    return [np.asarray(out[o]) for o in graph.outputs]
