"""LIR program -> a plain-data MIL plan that :mod:`rlx_ane.mil_worker` turns into an ML Program.

The plan is JSON plus one ``.npz`` of constants, so the coremltools side runs in a child process
(see :mod:`rlx_ane.export` for why). Value names never reach MIL: every value is ``__v<N>`` by
position, and the model's feature names are :class:`rlx_core.plugin.Namer` identifiers of the
public names (the mapping is kept in the model's metadata). Core ML has no 64-bit integers: i64
values become int32 (constants are range-checked here), as coremltools' own converters do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_core.plugin import DType, InputError, Namer, Program, slice_params

#: RLX dtype -> MIL dtype name (mil_worker maps these to coremltools types).
MIL_DTYPES: dict[DType, str] = {DType.F32: "fp32", DType.F16: "fp16", DType.I32: "int32",
                                DType.I64: "int32", DType.BOOL: "bool"}
#: What a Core ML model's inputs and outputs may be (multi-arrays: no bool, no 64-bit ints).
FEATURE_DTYPES = frozenset({DType.F32, DType.F16, DType.I32, DType.I64})


def _attr(v: Any) -> Any:
    if isinstance(v, DType):
        return v.value
    if isinstance(v, (tuple, list)):
        return [_attr(x) for x in v]
    if isinstance(v, (np.integer, np.floating)):
        return v.item()
    return v


def build_plan(program: Program) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The plan and its constants (``c<N>`` arrays) for ``program``."""
    g = program.graph
    ids: dict[str, str] = {}

    def ref(name: str) -> str:
        # Feature names never start with "__" (Namer keeps only single underscores), so these
        # internal names cannot collide with one.
        return ids.setdefault(name, f"__v{len(ids)}")

    def typ(name: str) -> dict[str, Any]:
        t = g.types[name]
        if t.dtype not in MIL_DTYPES:
            raise InputError(f"value {name!r} is {t.dtype}, which Core ML cannot hold",
                             where=f"graph {g.name!r}", fix="cast it to f32, f16 or i32 in the graph")
        return {"dtype": MIL_DTYPES[t.dtype], "rlx_dtype": t.dtype.value, "shape": [int(d) for d in t.shape]}

    features = Namer()
    inputs = []
    for v in program.inputs:
        if v.type.dtype not in FEATURE_DTYPES:
            raise InputError(f"input {v.name!r} is {v.type.dtype}; Core ML inputs are fp32, fp16 or int32",
                             where=f"graph {g.name!r}",
                             fix="take the input as f32 or i32 and cast it in the graph")
        inputs.append({"id": ref(v.name), "feature": features(v.name), "rlx": v.name, **typ(v.name)})
    consts: dict[str, np.ndarray] = {}
    const_ids = []
    for p in g.params:
        w = np.asarray(g.weights[p.name])
        if p.type.dtype == DType.I64:
            if w.size and (w.min() < np.iinfo(np.int32).min or w.max() > np.iinfo(np.int32).max):
                raise InputError(f"i64 constant {p.name!r} has values outside int32, which Core ML "
                                 "cannot hold",
                                 where=f"graph {g.name!r}", fix="keep integer constants within int32")
            w = w.astype(np.int32)
        key = f"c{len(consts)}"
        consts[key] = np.ascontiguousarray(w)
        const_ids.append({"id": ref(p.name), "key": key, **typ(p.name)})
    ops = []
    for s in program.kernels:
        attrs = {k: _attr(v) for k, v in s.attrs.items()}
        if s.op == "slice":
            # Python's clamping resolved here, with the reference's own helper, so the worker
            # only translates concrete bounds.
            shape = [int(d) for d in g.types[s.inputs[0]].shape]
            attrs["resolved"] = [(ax, *sl.indices(shape[ax])) for ax, sl in slice_params(s.attrs, shape)]
        ops.append({"op": s.op, "kernel": s.kernel, "in": [ref(i) for i in s.inputs],
                    "in_types": [typ(i) for i in s.inputs],
                    "out": [ref(o) for o in s.outputs], "out_types": [typ(o) for o in s.outputs],
                    "attrs": attrs})
    # Core ML wants input and output features distinct: an output named like an input gets a suffix.
    out_features = Namer(taken=[i["feature"] for i in inputs])
    outputs = []
    for public, value in program.outputs:
        t = g.types[value]
        if t.dtype not in FEATURE_DTYPES:
            raise InputError(f"output {public!r} is {t.dtype}; Core ML outputs are fp32, fp16 or int32",
                             where=f"graph {g.name!r}", fix="cast the output to f32 or i32 in the graph")
        outputs.append({"id": ref(value), "feature": out_features(public), "rlx": public, **typ(value)})
    plan = {"graph": g.name, "inputs": inputs, "consts": const_ids, "ops": ops, "outputs": outputs}
    return plan, consts
