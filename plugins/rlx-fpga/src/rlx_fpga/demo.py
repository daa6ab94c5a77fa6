"""Demonstration: the PTQ-quantized digits MLP and CNN (rlx_core.quant.examples) on the generated RTL.

:func:`int8_core` cuts an INT8 graph from :func:`rlx_core.quant.quantize_graph` into its integer
core (the longest run of nodes rlx-fpga implements: ``matmul_i8``, ``conv2d_i8``, the int8 pools,
``requantize``, ``maximum``, ``reshape``) with an int8 input and an int8 output; the float ends
(``quantize`` before, and ``softmax_i8`` / ``reshape`` / ``dequantize`` after) run on the host with the
ops' exact references.
A ReLU fused into ``requantize`` (``act_min == zero_point``) is also emitted as an explicit
``maximum(h, zero_point)`` when ``explicit_relu`` (bit-identical, and it exercises the ReLU unit).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_core.plugin import DispatchError, GraphBuilder

CORE_OPS = {"matmul_i8", "requantize", "maximum", "reshape", "conv2d_i8", "max_pool2d_i8", "avg_pool2d_i8"}


def int8_core(q: Any, *, explicit_relu: bool = True) -> tuple[Any, list[Any], list[Any]]:
    """``(core_graph, host_before, host_after)``: node lists of the float ends and the integer core
    as a graph with input ``xq`` (int8) and output ``logits_q`` (int8)."""
    nodes = list(q.nodes)
    best: tuple[int, int] = (0, 0)
    i = 0
    while i < len(nodes):
        j = i
        while j < len(nodes) and nodes[j].op in CORE_OPS:
            j += 1
        if j - i > best[1] - best[0]:
            best = (i, j)
        i = j + 1
    a, b = best
    core = nodes[a:b]
    params = {p.name for p in q.params}
    produced = {o for n in core for o in n.outputs}
    ext = [v for n in core for v in n.inputs if v not in params and v not in produced]
    integer = any(n.op not in {"maximum", "reshape"} for n in core)  # a core needs an integer op
    if len(set(ext)) != 1 or not integer:
        span = f"nodes {core[0].name}..{core[-1].name}" if core else "no nodes"
        raise DispatchError(
            f"rlx-fpga found no integer core with one activation input in graph {q.name!r} "
            f"(the longest run of {sorted(CORE_OPS)} nodes reads {sorted(set(ext)) or 'no input'})",
            where=f"graph {q.name!r}, {span}",
            fix="quantize the model first (rlx quantize MODEL --calib ... -o MODEL_int8.rlx); the FPGA "
                "target runs INT8 graphs only")
    g = GraphBuilder(f"{q.name}_int8_core")
    t = {ext[0]: g.input("xq", "i8", tuple(q.types[ext[0]].shape))}
    for n in core:
        ins = []
        for v in n.inputs:
            if v not in t:
                t[v] = g.param(v, np.asarray(q.weights[v]))
            ins.append(t[v])
        out = g.op(n.op, *ins, **dict(n.attrs))
        if (explicit_relu and n.op == "requantize" and int(n.attrs["act_min"]) == int(n.attrs["zero_point"])
                and n is not core[-1]):
            out = g.op("maximum", out, g.const(int(n.attrs["zero_point"]), "i8"))
        t[n.outputs[0]] = out
    g.output(t[core[-1].outputs[0]], "logits_q")
    return g.build(), nodes[:a], nodes[b:]


def run_host(nodes: list[Any], q: Any, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``nodes`` of ``q`` with the ops' exact references (the float ends of an INT8 graph)."""
    from rlx_core.plugin import REGISTRY

    env = dict(values)
    for n in nodes:
        schema = REGISTRY.get(n.op)
        ins = [np.asarray(env[v]) if v in env else np.asarray(q.weights[v]) for v in n.inputs]
        outs = schema.reference(ins, n.attrs)
        for name, o in zip(n.outputs, outs):
            env[name] = np.asarray(o).astype(q.types[name].dtype.np)
    return env


def digits_mlp(n_test: int = 10, *, parallel: int = 4, seed: int = 0) -> dict[str, Any]:
    """Train the digits MLP (scikit-learn's load_digits), quantize it (PTQ), simulate ``n_test``
    held-out images on the generated RTL and compare with the INT8 reference on rlx-cpu."""
    return _digits("mlp", n_test, parallel=parallel, seed=seed)


def digits_cnn(n_test: int = 8, *, parallel: int = 4, seed: int = 0) -> dict[str, Any]:
    """The digits CNN (conv 3x3 -> max pool -> conv 3x3 -> avg pool -> dense, PTQ-quantized) on the
    generated RTL (``conv2d_i8`` / ``max_pool2d_i8`` / ``avg_pool2d_i8`` window units), ``n_test``
    held-out images, compared with the INT8 reference on rlx-cpu."""
    return _digits("cnn", n_test, parallel=parallel, seed=seed)


def _digits(model: str, n_test: int, *, parallel: int, seed: int) -> dict[str, Any]:
    from sklearn.datasets import load_digits

    from rlx_core import Session
    from rlx_core.plugin import quantize_graph, split_digits, train_cnn, train_mlp

    from .export import lower_graph
    from .program import FPGAProgram

    d = load_digits()
    s = split_digits(d.images, d.target, seed=seed)
    if model == "cnn":
        graph = train_cnn(s["x_train"].reshape(-1, 1, 8, 8), s["y_train"], seed=seed)
        q = quantize_graph(graph, {"x": s["x_train"][:400].reshape(-1, 1, 8, 8)})
        x = s["x_test"][:n_test].reshape(-1, 1, 8, 8)
    else:
        graph = train_mlp(s["x_train"], s["y_train"], seed=seed)
        q = quantize_graph(graph, {"x": s["x_train"][:400]})
        x = s["x_test"][:n_test]
    y = s["y_test"][:n_test]
    want = Session("cpu", use_cache=False).compile(q).run(x=x)["probs"]  # the INT8 reference
    core, before, after = int8_core(q)
    env = run_host(before, q, {"x": x.astype(np.float32)})
    xq = env[before[-1].outputs[0]]
    ref_logits = Session("cpu", use_cache=False).compile(core).run(xq=xq)["logits_q"]
    program = lower_graph(core, bindings={"batch": n_test})
    fp = FPGAProgram(program, parallel=parallel)
    out_value = program.outputs[0][1]
    got_logits = fp.run({"xq": xq})[out_value]
    post = run_host(after, q, {next(iter(after[0].inputs)): got_logits}) if after else {}
    probs = post.get(q.outputs[0].name if hasattr(q.outputs[0], "name") else "probs", None)
    if probs is None:
        probs = post[after[-1].outputs[0]]
    float_probs = Session("cpu", use_cache=False).compile(graph).run(x=x)["probs"]
    return {"q": q, "core": core, "program": fp, "x": x, "y": y, "xq": xq,
            "ref_logits": ref_logits, "logits": got_logits, "probs": np.asarray(probs, np.float32),
            "ref_probs": want, "float_probs": float_probs, "run": fp.last_run,
            "acc_int8": float((np.asarray(probs).argmax(1) == y).mean()),
            "acc_float": float((float_probs.argmax(1) == y).mean())}
