"""The compiled program: one OpenVINO model for the whole LIR program, compiled once for one
OpenVINO device, run through its own infer request."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter, OrderedDict
from typing import Any

import numpy as np

from rlx_core.plugin import DType, Program

from .runtime import compile_config, core
from .translate import build_model

#: Compiled models by translation key. Compiling costs OpenVINO's CPU plugin ~30 ms of CPU even
#: for one node; programs that translate to the same model (same steps, types and constants under
#: other value names) share one compiled model, each with its own infer request.
_COMPILED: OrderedDict[str, Any] = OrderedDict()
_LOCK = threading.Lock()
_CAPACITY = 128


def translation_key(program: Program, ov_device: str) -> str:
    """What the OpenVINO model depends on, with value names replaced by positions."""
    g = program.graph
    ids: dict[str, int] = {}

    def ref(name: str) -> int:
        return ids.setdefault(name, len(ids))

    h = hashlib.sha256()
    doc: dict[str, Any] = {"device": ov_device,
                           "inputs": [(ref(v.name), str(g.types[v.name])) for v in program.inputs],
                           "params": [(ref(p.name), str(g.types[p.name])) for p in g.params]}
    for p in g.params:
        h.update(np.ascontiguousarray(g.weights[p.name]).tobytes())
    doc["steps"] = [(s.op, s.kernel, [ref(i) for i in s.inputs],
                     [(ref(o), str(g.types[o])) for o in s.outputs], repr(sorted(s.attrs.items())))
                    for s in program.kernels]
    doc["outputs"] = [ref(v) for _, v in program.outputs]
    h.update(json.dumps(doc, sort_keys=True).encode())
    return h.hexdigest()


def _compiled(program: Program, ov_device: str) -> tuple[Any, list[str]]:
    key = translation_key(program, ov_device)
    kernels = [s.kernel for s in program.kernels]
    with _LOCK:
        hit = _COMPILED.get(key)
        if hit is not None:
            _COMPILED.move_to_end(key)
            return hit, kernels
    model, kernels = build_model(program)
    compiled = core().compile_model(model, ov_device, compile_config(ov_device))
    with _LOCK:
        _COMPILED[key] = compiled
        while len(_COMPILED) > _CAPACITY:
            _COMPILED.popitem(last=False)
    return compiled, kernels


class OneApiProgram:
    """``run`` feeds the inputs by position and returns the outputs keyed by value name."""

    def __init__(self, program: Program, ov_device: str) -> None:
        self.compiled, self.kernels = _compiled(program, ov_device)
        self._request = self.compiled.create_infer_request()
        self._inputs = [(v.name, v.type.dtype.np) for v in program.inputs]
        self._outputs = [v for _, v in program.outputs]
        self._bf16_out = [program.graph.types[v].dtype == DType.BF16 for v in self._outputs]

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # np.require keeps 0-d arrays 0-d (ascontiguousarray would make them 1-d).
        feed = [_tensor(np.require(np.asarray(inputs[name], dtype), requirements="C"))
                for name, dtype in self._inputs]
        res = self._request.infer(feed)
        # The request owns its output tensors and reuses them on the next call: hand out copies.
        outs = [np.array(res[i], copy=True) for i in range(len(self._outputs))]
        # OpenVINO hands bf16 tensors over as float16 arrays holding bf16 bits.
        outs = [o.view(np.uint16).view(DType.BF16.np) if bf else o for o, bf in zip(outs, self._bf16_out)]
        return dict(zip(self._outputs, outs))

    def profile(self, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Counter[str]]:
        # One model: every step's translation runs once per inference.
        return self.run(inputs), Counter(self.kernels)


def _tensor(a: np.ndarray) -> Any:
    """``a`` as what an infer request takes: the array itself, or for bf16 (which OpenVINO's Python
    API does not read from NumPy) a bf16 tensor holding its bits."""
    if a.dtype != DType.BF16.np:
        return a
    import openvino as ov

    t = ov.Tensor(ov.Type.bf16, ov.Shape(list(a.shape)))
    t.data.view(np.uint16)[...] = a.view(np.uint16)
    return t


def compile_program(program: Program, ov_device: str) -> Any:
    return OneApiProgram(program, ov_device)
