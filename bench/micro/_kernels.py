"""The microbenchmark kernels: each one RLX graph, its float64 NumPy reference, a float32 NumPy peer
and (where ONNX has the op) an ONNX model for ONNX Runtime, all on the same seeded inputs.

Sizes are small on purpose: the software devices (wasm in wasmtime, Vulkan on lavapipe, MSL compiled
for the host, QEMU, Icarus Verilog) must finish a round in milliseconds, and every runtime of a group
gets exactly the same shapes so the ratios mean something.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

Feed = dict[str, np.ndarray]


@dataclass(frozen=True)
class Kernel:
    name: str
    #: what is measured, for the report (shapes and dtypes)
    shape: str
    #: -> (RLX graph, inputs by name, float64/int reference of the single output)
    build: Callable[[], tuple[Any, Feed, np.ndarray]]
    #: inputs and parameters -> a zero-argument callable computing the output with NumPy
    numpy_peer: Callable[[Feed, dict[str, np.ndarray]], Callable[[], np.ndarray]]
    #: -> an onnx.ModelProto with the graph's inputs, or None where ONNX Runtime is not a peer
    onnx_model: Callable[[dict[str, np.ndarray]], Any] | None
    rtol: float = 2e-3
    atol: float = 2e-3
    #: FLOPs of one call (0 when not meaningful), for GFLOP/s in extra_info
    flops: float = 0.0
    #: exact integer kernel: outputs must be bit-identical
    exact: bool = False


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _params(graph: Any) -> dict[str, np.ndarray]:
    """The graph's parameters by name (the peers get the very same weights)."""
    return {name: np.asarray(v) for name, v in graph.weights.items()}


# -- ONNX helpers (imported only when ONNX Runtime is measured) ------------------------------------

def _onnx(nodes: list[Any], inputs: Feed, inits: dict[str, np.ndarray], out: str, out_shape: tuple[int, ...],
          out_dtype: Any = np.float32) -> Any:
    from onnx import helper, numpy_helper

    def vi(name: str, arr_dtype: Any, shape: tuple[int, ...]) -> Any:
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(arr_dtype)),
                                             list(shape))

    g = helper.make_graph(nodes, "micro", [vi(k, v.dtype, v.shape) for k, v in inputs.items()],
                          [vi(out, out_dtype, out_shape)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def _node(op: str, ins: list[str], outs: list[str], **attrs: Any) -> Any:
    from onnx import helper

    return helper.make_node(op, ins, outs, **attrs)


# -- matmul ---------------------------------------------------------------------------------------

M, K, N = 64, 256, 256


def _matmul() -> tuple[Any, Feed, np.ndarray]:
    from rlx_core import GraphBuilder

    rng = _rng()
    g = GraphBuilder("micro_matmul")
    x = g.input("x", "f32", (M, K))
    w = g.param("w", (rng.standard_normal((K, N)) / math.sqrt(K)).astype(np.float32))
    g.output(x @ w, "y")
    graph = g.build()
    feed = {"x": rng.standard_normal((M, K)).astype(np.float32)}
    ref = feed["x"].astype(np.float64) @ _params(graph)["w"].astype(np.float64)
    return graph, feed, ref


def _matmul_np(feed: Feed, p: dict[str, np.ndarray]) -> Callable[[], np.ndarray]:
    x, w = feed["x"], p["w"]
    return lambda: x @ w


def _matmul_onnx(p: dict[str, np.ndarray]) -> Any:
    return _onnx([_node("MatMul", ["x", "w"], ["y"])], {"x": np.zeros((M, K), np.float32)}, p, "y", (M, N))


# -- conv2d ---------------------------------------------------------------------------------------

CB, CI, CO, HW, KS = 1, 16, 32, 32, 3


def _conv() -> tuple[Any, Feed, np.ndarray]:
    from rlx_core import GraphBuilder
    from rlx_core.ir.mir import conv2d_reference

    rng = _rng()
    g = GraphBuilder("micro_conv2d")
    x = g.input("x", "f32", (CB, CI, HW, HW))
    w = g.param("w", (rng.standard_normal((CO, CI, KS, KS)) / math.sqrt(CI * KS * KS)).astype(np.float32))
    g.output(g.op("conv2d", x, w, pads=(1, 1, 1, 1)), "y")
    graph = g.build()
    feed = {"x": rng.standard_normal((CB, CI, HW, HW)).astype(np.float32)}
    attrs = {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "groups": 1}
    ref = conv2d_reference(feed["x"].astype(np.float64), _params(graph)["w"].astype(np.float64), attrs)
    return graph, feed, ref


def _conv_np(feed: Feed, p: dict[str, np.ndarray]) -> Callable[[], np.ndarray]:
    # im2col through a strided view + one GEMM: the usual way to write a convolution in NumPy.
    x, w = feed["x"], p["w"]
    wm = w.reshape(CO, -1)

    def run() -> np.ndarray:
        xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        cols = np.lib.stride_tricks.sliding_window_view(xp, (KS, KS), axis=(2, 3))  # N C H W kh kw
        cols = cols.transpose(0, 2, 3, 1, 4, 5).reshape(CB * HW * HW, CI * KS * KS)
        return (cols @ wm.T).reshape(CB, HW, HW, CO).transpose(0, 3, 1, 2)
    return run


def _conv_onnx(p: dict[str, np.ndarray]) -> Any:
    return _onnx([_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                 {"x": np.zeros((CB, CI, HW, HW), np.float32)}, p, "y", (CB, CO, HW, HW))


# -- row kernels: softmax, layer_norm, reduction, elementwise chain ------------------------------

R, C = 64, 1024


def _rows_input() -> np.ndarray:
    return _rng().standard_normal((R, C)).astype(np.float32)


def _softmax() -> tuple[Any, Feed, np.ndarray]:
    from rlx_core import GraphBuilder

    g = GraphBuilder("micro_softmax")
    g.output(g.softmax(g.input("x", "f32", (R, C))), "y")
    feed = {"x": _rows_input()}
    x = feed["x"].astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return g.build(), feed, e / e.sum(-1, keepdims=True)


def _softmax_np(feed: Feed, p: dict[str, np.ndarray]) -> Callable[[], np.ndarray]:
    x = feed["x"]

    def run() -> np.ndarray:
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return run


def _softmax_onnx(p: dict[str, np.ndarray]) -> Any:
    return _onnx([_node("Softmax", ["x"], ["y"], axis=-1)], {"x": np.zeros((R, C), np.float32)}, p, "y",
                 (R, C))


def _layer_norm() -> tuple[Any, Feed, np.ndarray]:
    from rlx_core import GraphBuilder

    rng = np.random.default_rng(1)
    g = GraphBuilder("micro_layer_norm")
    x = g.input("x", "f32", (R, C))
    gamma = g.param("gamma", (1 + 0.1 * rng.standard_normal(C)).astype(np.float32))
    beta = g.param("beta", (0.1 * rng.standard_normal(C)).astype(np.float32))
    g.output(g.op("layer_norm", x, gamma, beta), "y")
    graph = g.build()
    feed = {"x": _rows_input()}
    p = _params(graph)
    xd = feed["x"].astype(np.float64)
    mu = xd.mean(-1, keepdims=True)
    ref = (xd - mu) / np.sqrt(xd.var(-1, keepdims=True) + 1e-5) * p["gamma"] + p["beta"]
    return graph, feed, ref


def _layer_norm_np(feed: Feed, p: dict[str, np.ndarray]) -> Callable[[], np.ndarray]:
    x, gamma, beta = feed["x"], p["gamma"], p["beta"]

    def run() -> np.ndarray:
        mu = x.mean(-1, keepdims=True)
        d = x - mu
        return d / np.sqrt((d * d).mean(-1, keepdims=True) + np.float32(1e-5)) * gamma + beta
    return run


def _layer_norm_onnx(p: dict[str, np.ndarray]) -> Any:
    return _onnx([_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5)],
                 {"x": np.zeros((R, C), np.float32)}, p, "y", (R, C))


def _reduce() -> tuple[Any, Feed, np.ndarray]:
    from rlx_core import GraphBuilder

    g = GraphBuilder("micro_reduce_sum")
    g.output(g.op("reduce_sum", g.input("x", "f32", (R, C)), axes=(1,)), "y")
    feed = {"x": _rows_input()}
    return g.build(), feed, feed["x"].astype(np.float64).sum(1)


def _reduce_np(feed: Feed, p: dict[str, np.ndarray]) -> Callable[[], np.ndarray]:
    x = feed["x"]
    return lambda: x.sum(1)


def _reduce_onnx(p: dict[str, np.ndarray]) -> Any:
    return _onnx([_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], {"x": np.zeros((R, C), np.float32)},
                 {**p, "axes": np.array([1], np.int64)}, "y", (R,))


GELU_C = math.sqrt(2 / math.pi)


def _chain() -> tuple[Any, Feed, np.ndarray]:
    # x * gelu_tanh(x * 1.5 + 0.25): seven elementwise MIR ops that fusion makes one kernel.
    from rlx_core import GraphBuilder

    g = GraphBuilder("micro_elementwise_chain")
    x = g.input("x", "f32", (R, C))
    g.output(g.op("gelu", x * 1.5 + 0.25, approximate="tanh") * x, "y")
    feed = {"x": _rows_input()}
    xd = feed["x"].astype(np.float64)
    t = xd * 1.5 + 0.25
    return g.build(), feed, 0.5 * t * (1 + np.tanh(GELU_C * (t + 0.044715 * t**3))) * xd


def _chain_np(feed: Feed, p: dict[str, np.ndarray]) -> Callable[[], np.ndarray]:
    x = feed["x"]
    c, k = np.float32(GELU_C), np.float32(0.044715)

    def run() -> np.ndarray:
        t = x * np.float32(1.5) + np.float32(0.25)
        return np.float32(0.5) * t * (1 + np.tanh(c * (t + k * t * t * t))) * x
    return run


def _chain_onnx(p: dict[str, np.ndarray]) -> Any:
    f = np.float32
    consts = {"a": f(1.5), "b": f(0.25), "half": f(0.5), "one": f(1.0), "c": f(GELU_C), "k": f(0.044715)}
    nodes = [_node("Mul", ["x", "a"], ["xa"]), _node("Add", ["xa", "b"], ["t"]),
             _node("Mul", ["t", "t"], ["t2"]), _node("Mul", ["t2", "t"], ["t3"]),
             _node("Mul", ["t3", "k"], ["kt3"]), _node("Add", ["t", "kt3"], ["u"]),
             _node("Mul", ["u", "c"], ["cu"]), _node("Tanh", ["cu"], ["th"]),
             _node("Add", ["th", "one"], ["th1"]), _node("Mul", ["t", "half"], ["ht"]),
             _node("Mul", ["ht", "th1"], ["g"]), _node("Mul", ["g", "x"], ["y"])]
    return _onnx(nodes, {"x": np.zeros((R, C), np.float32)},
                 {k: np.array(v, np.float32) for k, v in consts.items()}, "y", (R, C))


# -- gather (an embedding lookup) -----------------------------------------------------------------

VOCAB, DIM, IDS = 8192, 256, 512


def _gather() -> tuple[Any, Feed, np.ndarray]:
    from rlx_core import GraphBuilder

    rng = _rng()
    g = GraphBuilder("micro_gather")
    table = g.param("table", rng.standard_normal((VOCAB, DIM)).astype(np.float32))
    g.output(g.op("gather", table, g.input("ids", "i64", (IDS,)), axis=0), "y")
    graph = g.build()
    feed = {"ids": rng.integers(0, VOCAB, IDS).astype(np.int64)}
    return graph, feed, _params(graph)["table"][feed["ids"]].astype(np.float64)


def _gather_np(feed: Feed, p: dict[str, np.ndarray]) -> Callable[[], np.ndarray]:
    table, ids = p["table"], feed["ids"]
    return lambda: np.take(table, ids, axis=0)


def _gather_onnx(p: dict[str, np.ndarray]) -> Any:
    return _onnx([_node("Gather", ["table", "ids"], ["y"], axis=0)], {"ids": np.zeros(IDS, np.int64)}, p, "y",
                 (IDS, DIM))


# -- attention --------------------------------------------------------------------------------------

AB, AH, AS, AD = 1, 4, 128, 32


def _attention() -> tuple[Any, Feed, np.ndarray]:
    from rlx_core import GraphBuilder

    rng = _rng()
    g = GraphBuilder("micro_attention")
    q, k, v = (g.input(n, "f32", (AB, AH, AS, AD)) for n in ("q", "k", "v"))
    g.output(g.op("attention", q, k, v), "y")
    feed = {n: rng.standard_normal((AB, AH, AS, AD)).astype(np.float32) for n in ("q", "k", "v")}
    qd, kd, vd = (feed[n].astype(np.float64) for n in ("q", "k", "v"))
    s = qd @ kd.swapaxes(-1, -2) / math.sqrt(AD)
    e = np.exp(s - s.max(-1, keepdims=True))
    return g.build(), feed, (e / e.sum(-1, keepdims=True)) @ vd


def _attention_np(feed: Feed, p: dict[str, np.ndarray]) -> Callable[[], np.ndarray]:
    q, k, v = feed["q"], feed["k"], feed["v"]
    scale = np.float32(1 / math.sqrt(AD))

    def run() -> np.ndarray:
        s = (q @ k.swapaxes(-1, -2)) * scale
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v
    return run


def _attention_onnx(p: dict[str, np.ndarray]) -> Any:
    # Written out as exporters emit it (ONNX Runtime fuses what it recognises).
    z = np.zeros((AB, AH, AS, AD), np.float32)
    nodes = [_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), _node("MatMul", ["q", "kt"], ["s"]),
             _node("Mul", ["s", "scale"], ["ss"]), _node("Softmax", ["ss"], ["pr"], axis=-1),
             _node("MatMul", ["pr", "v"], ["y"])]
    return _onnx(nodes, {"q": z, "k": z, "v": z}, {"scale": np.array(1 / math.sqrt(AD), np.float32)}, "y",
                 (AB, AH, AS, AD))


# -- INT8 matmul + requantize (the op set of the microcontroller and FPGA targets) -----------------

QM, QK, QN = 4, 128, 64


def _matmul_i8() -> tuple[Any, Feed, np.ndarray]:
    import rlx_core.quant  # noqa: F401 - registers the INT8 ops
    from rlx_core import GraphBuilder

    rng = _rng()
    g = GraphBuilder("micro_matmul_i8")
    x = g.input("x", "i8", (QM, QK))
    w = g.param("w", rng.integers(-127, 128, (QN, QK)).astype(np.int8))
    b = g.param("b", rng.integers(-500, 500, (QN,)).astype(np.int32))
    acc = g.op("matmul_i8", x, w, b, x_zero_point=-3)
    y = g.op("requantize", acc, g.param("m", np.full((QN,), 1 << 30, np.int32)),
             g.param("s", np.full((QN,), -7, np.int32)), zero_point=-5)
    g.output(y, "y")
    graph = g.build()
    feed = {"x": rng.integers(-128, 128, (QM, QK)).astype(np.int8)}
    return graph, feed, _requant_np(feed, _params(graph))()


def _requant_np(feed: Feed, p: dict[str, np.ndarray]) -> Callable[[], np.ndarray]:
    # NumPy integer arithmetic: an int32 GEMM (zero point folded into x), then the requantize rule
    # of rlx_core.quant.fixedpoint (the bit-exact reference every INT8 backend is certified against).
    from rlx_core.quant.fixedpoint import requantize_reference

    x, w, b, m, s = feed["x"], p["w"].astype(np.int32), p["b"], p["m"], p["s"]

    def run() -> np.ndarray:
        acc = (x.astype(np.int32) + 3) @ w.T + b
        return requantize_reference(acc, m, s, -5, -128, 127).astype(np.int8)
    return run


KERNELS: dict[str, Kernel] = {k.name: k for k in (
    Kernel("matmul", f"f32 [{M},{K}] @ [{K},{N}]", _matmul, _matmul_np, _matmul_onnx, flops=2.0 * M * K * N),
    Kernel("conv2d", f"f32 x[{CB},{CI},{HW},{HW}] * w[{CO},{CI},{KS},{KS}], pad 1", _conv, _conv_np,
           _conv_onnx, flops=2.0 * CB * CO * HW * HW * CI * KS * KS),
    Kernel("softmax", f"f32 [{R},{C}], last axis", _softmax, _softmax_np, _softmax_onnx,
           rtol=1e-3, atol=1e-6),
    Kernel("layer_norm", f"f32 [{R},{C}], last axis", _layer_norm, _layer_norm_np, _layer_norm_onnx),
    Kernel("elementwise_chain", f"f32 [{R},{C}], x * gelu_tanh(1.5 x + 0.25)", _chain, _chain_np,
           _chain_onnx),
    Kernel("reduce_sum", f"f32 [{R},{C}] -> [{R}]", _reduce, _reduce_np, _reduce_onnx, atol=1e-2),
    Kernel("gather", f"f32 table[{VOCAB},{DIM}], {IDS} i64 ids", _gather, _gather_np, _gather_onnx,
           rtol=0, atol=0),
    Kernel("attention", f"f32 q,k,v [{AB},{AH},{AS},{AD}], no mask", _attention, _attention_np,
           _attention_onnx, flops=4.0 * AB * AH * AS * AS * AD),
    Kernel("matmul_i8", f"i8 [{QM},{QK}] x i8 w[{QN},{QK}] + i32 bias, requantized to i8", _matmul_i8,
           _requant_np, None, flops=2.0 * QM * QK * QN, exact=True),
)}
