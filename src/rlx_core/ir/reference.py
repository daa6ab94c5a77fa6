"""The oracle: evaluate a graph with every op's float64 NumPy reference."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..dtypes import DType, reference_np_dtype
from ..errors import InputError, IRError
from .graph import Graph
from .schema import REGISTRY


def to_reference(x: Any, dtype: DType) -> np.ndarray:
    return np.asarray(x).astype(reference_np_dtype(dtype))


def round_to(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Round a reference result to ``dtype`` and back, so the oracle sees storage precision."""
    with np.errstate(all="ignore"):
        if dtype.is_complex and x.dtype.kind != "c":
            x = x.astype(np.complex128)
        return np.asarray(x).astype(dtype.np).astype(reference_np_dtype(dtype))


def evaluate(graph: Graph, inputs: Mapping[str, Any], *, round_intermediates: bool = True
             ) -> dict[str, np.ndarray]:
    """Run ``graph`` with reference kernels; results are float64 (complex128, exact ints).

    Index operands (gather, scatter_add, embedding) follow ONNX: valid in ``[-n, n - 1]``, a
    negative index counts from the end once, anything else raises :class:`InputError` naming the
    node (:func:`rlx_core.ir.indices.normalize`), as ``Executable.run`` does.

    With ``round_intermediates`` every value is rounded to its declared dtype, which is what a
    correct backend computes (it stores f16 as f16); the op itself still computes in float64.
    """
    env: dict[str, np.ndarray] = {}
    for v in graph.inputs:
        if v.name not in inputs:
            raise InputError(f"missing input {v.name!r}", fix=f"pass {v.name}: {v.type}")
    if graph.symbols:
        # Bind symbols from the input shapes so every attribute (reshape targets ...) is concrete.
        bindings: dict[str, int] = {}
        for v in graph.inputs:
            for d, n in zip(v.type.shape, np.shape(inputs[v.name])):
                if isinstance(d, str) and d.isidentifier():  # expressions follow from their symbols
                    bindings.setdefault(d, int(n))
        graph = graph.specialize(bindings)
    for v in graph.inputs:
        env[v.name] = to_reference(inputs[v.name], v.type.dtype)
    for p in graph.params:
        env[p.name] = to_reference(graph.weights[p.name], p.type.dtype)
    for node in graph.nodes:
        schema = REGISTRY.get(node.op, where=node.where)
        try:
            outs = schema.reference([env[i] for i in node.inputs], node.attrs)
        except (IRError, InputError) as e:  # e.g. an index out of range (rlx_core.ir.indices)
            raise type(e)(e.what, where=e.where or node.where, fix=e.fix) from None
        for name, val in zip(node.outputs, outs):
            t = graph.types[name]
            val = np.asarray(val)
            if round_intermediates:
                val = round_to(val, t.dtype)
            else:
                val = val.astype(reference_np_dtype(t.dtype))
            env[name] = val
    return {o: env[o] for o in graph.outputs}
