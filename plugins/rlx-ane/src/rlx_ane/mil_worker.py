"""The coremltools side, run as ``python -m rlx_ane.mil_worker JOBS.json`` (see :mod:`rlx_ane.export`).

For each job (a plan from :mod:`rlx_ane.plan`, its constants, an output path) it builds the ML
Program with coremltools' MIL Builder, converts it (``ct.convert(prog, convert_to="mlprogram")``,
which runs coremltools' MIL validation and optimisation passes), saves the ``.mlpackage``, and
validates what was written with coremltools' own readers: the package reloads
(``MLModel(path, skip_model_load=True)``), its spec is an ML Program with the planned features, and
its MIL proto loads back into a typed MIL program (every op re-checked by MIL type inference). The
report (op types, features, checks) goes to the job's ``report`` path as JSON. Nothing here
predicts: Core ML prediction needs macOS.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

#: coremltools imports every framework it can convert from at import time (torch, scikit-learn,
#: TensorFlow, transformers: tens of seconds). An ML Program built with the MIL Builder needs none
#: of them, and this process is ours alone, so they are hidden from it.
_UNUSED_FRAMEWORKS = ("torch", "torchvision", "torchaudio", "torchao", "sklearn", "tensorflow", "tf_keras",
                      "keras", "transformers", "xgboost", "libsvm", "executorch")


def _quiet_import() -> Any:
    for m in _UNUSED_FRAMEWORKS:
        sys.modules.setdefault(m, None)  # type: ignore[arg-type]
    import logging

    logging.getLogger("coremltools").setLevel(logging.ERROR)
    import coremltools as ct

    return ct


def _build(ct: Any, plan: dict[str, Any], consts: dict[str, np.ndarray], precision: str) -> Any:
    from coremltools.converters.mil import Builder as mb  # noqa: N813 (coremltools' own spelling)
    from coremltools.converters.mil.mil import Function, Program, types

    tmap = {"fp32": types.fp32, "fp16": types.fp16, "int32": types.int32, "bool": types.bool}
    placeholders = {i["feature"]: mb.placeholder(shape=tuple(i["shape"]), dtype=tmap[i["dtype"]])
                    for i in plan["inputs"]}
    with Function(placeholders, opset_version=ct.target.iOS17) as fn:
        env: dict[str, Any] = {}
        for i in plan["inputs"]:
            env[i["id"]] = fn.inputs[i["feature"]]
        for c in plan["consts"]:
            env[c["id"]] = mb.const(val=consts[c["key"]], name=c["id"])
        const_ids = {c["id"] for c in plan["consts"]}
        for op in plan["ops"]:
            args = [env[i] for i in op["in"]]
            out = _translate(mb, op, args, [i in const_ids for i in op["in"]], consts, plan)
            env[op["out"][0]] = out
        outs = [mb.identity(x=env[o["id"]], name=o["feature"]) for o in plan["outputs"]]
        fn.set_outputs(outs)
    prog = Program()
    prog.add_function("main", fn)
    return prog


def _np_dtype(t: dict[str, Any]) -> Any:
    return {"fp32": np.float32, "fp16": np.float16, "int32": np.int32, "bool": np.bool_}[t["dtype"]]


def _translate(mb: Any, op: dict[str, Any], x: list[Any], is_const: list[bool], consts: Any,
               plan: dict[str, Any]) -> Any:
    """One LIR step as MIL ops; the last op is named after the step's output id."""
    name = op["out"][0]
    kind, a = op["op"], op["attrs"]
    in_t, out_t = op["in_types"], op["out_types"][0]
    shape_in = in_t[0]["shape"] if in_t else []
    rank = len(shape_in)

    def ax(v: int, r: int = rank) -> int:
        return int(v) % max(r, 1)

    def scalar(v: float, t: dict[str, Any]) -> Any:
        return np.array(v, dtype=_np_dtype(t))

    binary = {"add": mb.add, "sub": mb.sub, "mul": mb.mul, "div": mb.real_div, "pow": mb.pow,
              "maximum": mb.maximum, "minimum": mb.minimum, "equal": mb.equal, "not_equal": mb.not_equal,
              "greater": mb.greater, "greater_equal": mb.greater_equal, "less": mb.less,
              "less_equal": mb.less_equal, "logical_and": mb.logical_and, "logical_or": mb.logical_or,
              "logical_xor": mb.logical_xor}
    unary = {"abs": mb.abs, "exp": mb.exp, "sqrt": mb.sqrt, "sigmoid": mb.sigmoid, "tanh": mb.tanh,
             "erf": mb.erf, "sin": mb.sin, "cos": mb.cos, "floor": mb.floor, "ceil": mb.ceil, "sign": mb.sign,
             "logical_not": mb.logical_not, "relu": mb.relu, "silu": mb.silu}
    if kind in ("equal", "not_equal") and in_t[0]["dtype"] == "bool":  # MIL compares numbers only
        if kind == "not_equal":
            return mb.logical_xor(x=x[0], y=x[1], name=name)
        return mb.logical_not(x=mb.logical_xor(x=x[0], y=x[1]), name=name)
    if kind in binary:
        return binary[kind](x=x[0], y=x[1], name=name)
    if kind in unary:
        return unary[kind](x=x[0], name=name)
    # MIL's log, rsqrt and inverse add an epsilon by default (1e-45, 1e-12, 1e-4): RLX's do not.
    if kind == "log":
        return mb.log(x=x[0], epsilon=0.0, name=name)
    if kind == "rsqrt":
        return mb.rsqrt(x=x[0], epsilon=0.0, name=name)
    if kind == "reciprocal":
        return mb.inverse(x=x[0], epsilon=0.0, name=name)
    if kind == "neg":
        return mb.mul(x=x[0], y=scalar(-1, in_t[0]), name=name)
    if kind == "where":
        return mb.select(cond=x[0], a=x[1], b=x[2], name=name)
    if kind == "cast":
        if out_t["dtype"] == "bool" and in_t[0]["dtype"] != "bool":
            return mb.not_equal(x=x[0], y=scalar(0, in_t[0]), name=name)
        if out_t["dtype"] == in_t[0]["dtype"]:  # i64 <-> i32 are both int32 in Core ML
            return mb.identity(x=x[0], name=name)
        return mb.cast(x=x[0], dtype=out_t["dtype"], name=name)
    if kind == "matmul":
        return mb.matmul(x=x[0], y=x[1], name=name)
    if kind.startswith("reduce_"):
        axes = list(range(rank)) if a.get("axes") is None else sorted(ax(v) for v in a["axes"])
        if not axes:
            return mb.identity(x=x[0], name=name)
        return getattr(mb, kind)(x=x[0], axes=axes, keep_dims=bool(a.get("keepdims", False)), name=name)
    if kind == "reshape":
        return mb.reshape(x=x[0], shape=np.array(out_t["shape"], np.int32), name=name)
    if kind == "transpose":
        perm = list(range(rank))[::-1] if a.get("perm") is None else [ax(p) for p in a["perm"]]
        return mb.transpose(x=x[0], perm=perm, name=name)
    if kind == "expand":
        out_shape = out_t["shape"]
        lifted = [1] * (len(out_shape) - rank) + list(shape_in)
        y = x[0] if lifted == shape_in else mb.reshape(x=x[0], shape=np.array(lifted, np.int32))
        reps = [o // i if i else 0 for o, i in zip(out_shape, lifted)]
        return mb.tile(x=y, reps=reps, name=name)
    if kind == "slice":
        begin, end, stride = [0] * rank, list(shape_in), [1] * rank
        end_mask = [False] * rank
        for axis, start, stop, step in a["resolved"]:
            begin[axis], stride[axis] = start, step
            if stop < 0:  # a negative step that runs past index 0: only the mask says "to the front"
                end[axis], end_mask[axis] = 0, True
            else:
                end[axis] = stop
        return mb.slice_by_index(x=x[0], begin=np.array(begin, np.int32), end=np.array(end, np.int32),
                                 stride=np.array(stride, np.int32), end_mask=end_mask, name=name)
    if kind == "concat":
        return mb.concat(values=x, axis=ax(a["axis"], len(out_t["shape"])), name=name)
    if kind == "pad":
        pads = [int(p) for p in a["pads"]]
        r = len(pads) // 2
        flat = [v for i in range(r) for v in (pads[i], pads[r + i])]
        return mb.pad(x=x[0], pad=np.array(flat, np.int32), mode="constant",
                      constant_val=scalar(float(a.get("value", 0.0)), in_t[0]), name=name)
    if kind == "gather":
        return mb.gather(x=x[0], indices=x[1], axis=ax(a.get("axis", 0)), name=name)
    if kind == "cumsum":
        return mb.cumsum(x=x[0], axis=ax(a.get("axis", -1)), exclusive=bool(a.get("exclusive", False)),
                         reverse=bool(a.get("reverse", False)), name=name)
    if kind == "iota":
        shape, axis = out_t["shape"], ax(a.get("axis", 0), len(out_t["shape"]))
        view = [1] * len(shape)
        view[axis] = shape[axis]
        val = np.broadcast_to(np.arange(shape[axis]).reshape(view), shape).astype(_np_dtype(out_t))
        return mb.const(val=np.ascontiguousarray(val), name=name)
    if kind == "conv2d":
        t, left, b, r = (int(v) for v in a.get("pads", (0, 0, 0, 0)))
        return mb.conv(x=x[0], weight=x[1], strides=[int(v) for v in a.get("strides", (1, 1))],
                       pad_type="custom", pad=[t, b, left, r],
                       dilations=[int(v) for v in a.get("dilations", (1, 1))], groups=int(a.get("groups", 1)),
                       name=name)
    if kind == "softmax":
        return mb.softmax(x=x[0], axis=ax(a.get("axis", -1)), name=name)
    if kind == "gelu":
        mode = "TANH_APPROXIMATION" if a.get("approximate", "none") == "tanh" else "EXACT"
        return mb.gelu(x=x[0], mode=mode, name=name)
    if kind == "layer_norm":
        axes = list(range(ax(a.get("axis", -1)), rank))
        eps = float(a.get("eps", 1e-5))
        if is_const[1] and is_const[2]:  # MIL's layer_norm takes gamma and beta as constants only
            return mb.layer_norm(x=x[0], axes=axes, gamma=x[1], beta=x[2], epsilon=eps, name=name)
        mean = mb.reduce_mean(x=x[0], axes=axes, keep_dims=True)
        d = mb.sub(x=x[0], y=mean)
        var = mb.reduce_mean(x=mb.mul(x=d, y=d), axes=axes, keep_dims=True)
        y = mb.mul(x=d, y=mb.rsqrt(x=var, epsilon=eps))
        return mb.add(x=mb.mul(x=y, y=x[1]), y=x[2], name=name)
    if kind == "linear":
        if is_const[1] and is_const[2]:  # MIL's linear takes a constant weight and bias
            return mb.linear(x=x[0], weight=x[1], bias=x[2], name=name)
        return mb.add(x=mb.matmul(x=x[0], y=x[1], transpose_y=True), y=x[2], name=name)
    raise ValueError(f"no MIL translation for {kind!r} (a claim without a translation: a bug in rlx-ane)")


def _validate(ct: Any, path: Path, plan: dict[str, Any]) -> dict[str, Any]:
    from coremltools.converters.mil.frontend.milproto.load import load as load_milproto

    model = ct.models.MLModel(str(path), skip_model_load=True)
    spec = model.get_spec()
    if spec.WhichOneof("Type") != "mlProgram":
        raise ValueError(f"{path} is not an ML Program")
    got_in = [f.name for f in spec.description.input]
    got_out = [f.name for f in spec.description.output]
    want_in = [i["feature"] for i in plan["inputs"]]
    want_out = [o["feature"] for o in plan["outputs"]]
    if got_in != want_in or got_out != want_out:
        raise ValueError(f"features differ from the plan: inputs {got_in} vs {want_in}, "
                         f"outputs {got_out} vs {want_out}")
    # Re-read the MIL proto into a typed program: every op's inputs, types and shapes are checked
    # again by MIL's type inference, from the bytes that were written.
    prog = load_milproto(spec, spec.specificationVersion, model.weights_dir)
    op_types: Counter[str] = Counter()
    for f in prog.functions.values():
        for o in f.operations:
            op_types[o.op_type] += 1
    return {"spec_version": int(spec.specificationVersion), "inputs": got_in, "outputs": got_out,
            "op_types": dict(op_types), "checks": ["ct.convert", "MLModel(skip_model_load=True)",
                                                    "spec features", "milproto reload"]}


def run_job(ct: Any, job: dict[str, Any]) -> dict[str, Any]:
    plan = json.loads(Path(job["plan"]).read_text())
    with np.load(job["consts"], allow_pickle=False) as z:
        consts = {k: z[k] for k in z.files}
    prog = _build(ct, plan, consts, job["precision"])
    precision = ct.precision.FLOAT16 if job["precision"] == "fp16" else ct.precision.FLOAT32
    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS17,
                       compute_precision=precision, skip_model_load=True)
    model.short_description = f"RLX graph {plan['graph']}"
    model.user_defined_metadata["rlx.features"] = json.dumps(
        {"inputs": {i["feature"]: i["rlx"] for i in plan["inputs"]},
         "outputs": {o["feature"]: o["rlx"] for o in plan["outputs"]}})
    model.user_defined_metadata["rlx.int64_as_int32"] = json.dumps(
        [i["feature"] for i in plan["inputs"] + plan["outputs"] if i["rlx_dtype"] == "i64"])
    out = Path(job["out"])
    model.save(str(out))
    return _validate(ct, out, plan)


def main(argv: list[str]) -> int:
    jobs = json.loads(Path(argv[0]).read_text())
    ct = _quiet_import()
    for job in jobs:
        try:
            report: dict[str, Any] = {"ok": True, "coremltools": ct.__version__, **run_job(ct, job)}
        except Exception as e:  # reported per job; the parent raises with the message
            report = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        Path(job["report"]).write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
