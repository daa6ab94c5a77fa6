"""Per-call overhead of small compiled graphs (issue 18): RLX's Executable.run vs ONNX Runtime's
InferenceSession.run vs bare NumPy, in one run: per function the best of 200 bursts of N calls,
the functions' bursts alternating (other load hits each alike).

    python bench/run_overhead.py [--calls 50] [--device cpu] [--graphs add,mlp:1,mlp:8]

Graphs: ``add`` (one add of 4 floats) and ``mlp:B`` (784-512-256-10 with ReLUs and a softmax, the
``rlx bench infer mlp`` shape, symbolic batch, fed B rows; seeded random weights). Columns:

* ``numpy``: the same math as NumPy calls into preallocated buffers (the floor for Python);
* ``run``: ``Executable.run`` (binding and checks, input copy, kernels, output copy);
* ``kernels``: the same program's kernels alone on bound buffers (``buffers().run_bound()``,
  backends with the buffer-binding capability), so ``overhead = run - kernels`` is what a call
  costs besides its kernels;
* ``ort``: ONNX Runtime single-threaded on the same ONNX graph, ``ratio`` = run / ort.

A benchmark, not a test: numbers depend on the machine and its other load. Before/after in one
run: put the old tree first on PYTHONPATH of a second invocation (see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def best_us(fns: dict[str, Callable[[], object]], calls: int, bursts: int = 200) -> dict[str, float]:
    """Per function, the best over ``bursts`` bursts of ``calls`` calls (us per call). The bursts
    of the functions alternate, so load from other processes hits each of them alike."""
    for fn in fns.values():
        for _ in range(min(200, 10 * calls)):
            fn()
    best = dict.fromkeys(fns, float("inf"))
    clock = time.perf_counter
    order = list(fns.items())
    for k in range(bursts):
        # Reversed every other burst: no function always follows the same one (one that just
        # evicted its weights from the caches).
        for name, fn in order if k % 2 else order[::-1]:
            t = clock()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (clock() - t) / calls)
    return {name: us * 1e6 for name, us in best.items()}


def onnx_model(graph: str) -> tuple[Any, dict[str, np.ndarray], Callable[[], object]]:
    """The ONNX model, its feed and the NumPy equivalent (into preallocated buffers)."""
    from onnx import TensorProto, helper, numpy_helper

    if graph == "add":
        x = np.ones(4, np.float32)
        out = np.empty(4, np.float32)
        m = helper.make_model(helper.make_graph(
            [helper.make_node("Add", ["x", "x"], ["y"])], "tiny",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]),
            opset_imports=[helper.make_opsetid("", 17)])
        return m, {"x": x}, lambda: np.add(x, x, out=out)
    batch = int(graph.partition(":")[2] or 1)
    rng = np.random.default_rng(0)
    sizes = (784, 512, 256, 10)
    ws = [(rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32) for i, o in itertools.pairwise(sizes)]
    bs = [rng.standard_normal(o).astype(np.float32) * 0.1 for o in sizes[1:]]
    nodes, inits, prev = [], [], "x"
    for k, (w, b) in enumerate(zip(ws, bs)):
        inits += [numpy_helper.from_array(w, f"w{k}"), numpy_helper.from_array(b, f"b{k}")]
        nodes.append(helper.make_node("Gemm", [prev, f"w{k}", f"b{k}"], [f"h{k}"], transB=1))
        prev = f"h{k}"
        if k < len(ws) - 1:
            nodes.append(helper.make_node("Relu", [prev], [f"r{k}"]))
            prev = f"r{k}"
    nodes.append(helper.make_node("Softmax", [prev], ["y"], axis=-1))
    m = helper.make_model(helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 784])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((batch, 784)).astype(np.float32)
    wts = [np.ascontiguousarray(w.T) for w in ws]
    hs = [np.empty((batch, o), np.float32) for o in sizes[1:]]
    red = np.empty((batch, 1), np.float32)

    def numpy_mlp() -> None:
        h: np.ndarray = x
        for k, (wt, b, o) in enumerate(zip(wts, bs, hs)):
            np.matmul(h, wt, out=o)
            np.add(o, b, out=o)
            if k < len(wts) - 1:
                np.maximum(o, 0, out=o)
            h = o
        np.maximum.reduce(h, axis=-1, keepdims=True, out=red)
        np.subtract(h, red, out=h)
        np.exp(h, out=h)
        np.add.reduce(h, axis=-1, keepdims=True, out=red)
        np.divide(h, red, out=h)
    return m, {"x": x}, numpy_mlp


def measure(graph: str, device: str, calls: int) -> dict[str, float]:
    from rlx_core import Session
    from rlx_core.errors import CapabilityError
    from rlx_core.frontends.onnx import load_onnx

    model, feed, numpy_fn = onnx_model(graph)
    exe: Any = Session(device, use_cache=False).compile(load_onnx(model))
    fns: dict[str, Callable[[], object]] = {"numpy": numpy_fn, "run": lambda: exe.run(feed)}
    want = next(iter(exe.run(feed).values()))
    try:
        bound = exe.buffers({"batch": feed["x"].shape[0]} if graph != "add" else None)
    except CapabilityError:  # a backend without buffer binding: no kernels column
        bound = None
    if bound is not None:  # the program run() uses, driven directly: run() copies the input in
        bound.run_bound()
        np.testing.assert_allclose(bound.buffer(exe.graph.outputs[0]), want, rtol=1e-6)
        fns["kernels"] = bound.run_bound
    try:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(sess.run(None, feed)[0], want, rtol=1e-4, atol=1e-6)
        fns["ort"] = lambda: sess.run(None, feed)
    except ImportError:
        pass
    return best_us(fns, calls if graph == "add" else max(5, calls // 10))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=50, help="calls per burst (MLPs: a tenth)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--graphs", default="add,mlp:1,mlp:8")
    args = ap.parse_args()
    nan = float("nan")
    print(f"{'graph':8s} {'numpy':>8s} {'run':>8s} {'kernels':>8s} {'overhead':>8s} {'ort':>8s} {'ratio':>6s}"
          "   (us per call)")
    for graph in args.graphs.split(","):
        r = measure(graph, args.device, args.calls)
        k, o = r.get("kernels", nan), r.get("ort", nan)
        print(f"{graph:8s} {r['numpy']:8.2f} {r['run']:8.2f} {k:8.2f} {r['run'] - k:8.2f} {o:8.2f} "
              f"{r['run'] / o:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
