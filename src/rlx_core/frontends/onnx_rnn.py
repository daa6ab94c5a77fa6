"""ONNX recurrent layers RNN, GRU and LSTM (versions 7 to 22) in RLX IR.

The sequence length must be static. The input projection of all steps and directions is one
``linear`` (x @ W.T plus every bias that adds to a gate) before the recurrence. An LSTM or GRU
layer in f32/f64 with ONNX's default activations is then one ``lstm_scan``/``gru_scan`` node
(:mod:`rlx_core.ir.ops.recurrent`), whose outputs are ONNX's Y, Y_h (and Y_c): a backend that
claims it runs the recurrence in one kernel, the others decompose it into the per-step ops.
Everything else (RNN, other activations, half types) is unrolled here with the same per-step code
(:func:`rlx_core.ir.ops.recurrent.unroll`): each time step becomes a ``matmul`` and a few
elementwise ops. Directions forward, reverse and bidirectional, layout 0 and 1, optional B /
initial_h / initial_c, GRU's linear_before_reset and LSTM peepholes are exact. What cannot be
translated exactly is refused by name: a ``sequence_lens`` that is not the full length everywhere
(per-batch lengths make the outputs data-dependent), ``clip``, ``input_forget=1`` and activations
other than Sigmoid, Tanh and Relu (the ones with alpha/beta parameters).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..dtypes import DType
from ..ir.builder import Tensor
from ..ir.ops.recurrent import DEFAULT_ACTS, SCAN_DTYPES, unroll
from . import onnx as _onnx
from .onnx import Refusal, _Const, _handler, _Importer

_FLOATS = (DType.F16, DType.BF16, DType.F32, DType.F64)

# Versions 1 (RNN/LSTM) and 1/3 (GRU) have other attributes (output_sequence); 14 adds layout,
# 22 only bfloat16.
_onnx._OP_SINCE.update({"RNN": 7, "GRU": 7, "LSTM": 7})

#: Per op: the gate count and the default activations of one direction.
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}
_ACTS = ("Sigmoid", "Tanh", "Relu")
#: Emit ``lstm_scan``/``gru_scan`` (one node a layer) where they define the layer; False unrolls
#: every layer step by step, the form before those ops (A/B comparisons).
SCAN_OPS = True


def _acts(attrs: Mapping[str, Any]) -> list[str]:
    return [a.decode("utf-8", "replace") if isinstance(a, bytes) else str(a)
            for a in attrs.get("activations", ())]


def _rules(attrs: Mapping[str, Any], opset: int, node: Any) -> Refusal:
    """What the handler does not translate (also reported by the coverage check, before import)."""
    op = node.op_type
    if "clip" in attrs:
        return f"attribute clip={attrs['clip']} (cell-input clipping) is not translated", \
            "export the layer without clip"
    if op == "LSTM" and int(attrs.get("input_forget", 0)) != 0:
        return "attribute input_forget=1 (coupled input/forget gates) is not translated", \
            "export the layer with input_forget=0 (the default)"
    bad = [a for a in _acts(attrs) if a.lower() not in (b.lower() for b in _ACTS)]
    if bad:
        return (f"activation(s) {', '.join(map(repr, bad))} (attribute activations) are not translated "
                f"(only {', '.join(_ACTS)})", "export the layer with its default activations")
    if attrs.get("activation_alpha") or attrs.get("activation_beta"):
        return ("attributes activation_alpha/activation_beta are not translated",
                "export the layer with Sigmoid/Tanh/Relu activations (no parameters)")
    return None


for _op in _GATES:
    _onnx._ATTR_RULES[_op] = [_rules]


def _dir_slice(imp: _Importer, w: Tensor, d: int) -> Tensor:
    """``w[d]`` of a ``[num_directions, ...]`` tensor."""
    g = imp.g
    s = g.op("slice", w, starts=(d,), stops=(d + 1,), axes=(0,))
    return g.op("reshape", s, shape=tuple(w.shape[1:]))


@_handler("RNN", "GRU", "LSTM")
def _recurrent(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    g = imp.g
    op = node.op_type
    n_gates = _GATES[op]

    def arg(i: int) -> Any:
        return ins[i] if len(ins) > i else None

    x = imp.t(ins[0])
    if x.dtype not in _FLOATS:
        raise imp.unsupported(f"{op} on a {x.dtype.value} input X is not supported",
                              fix="cast X to float32 in the model before this node")
    direction = str(attrs.get("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise imp.unsupported(f"{op} direction={direction!r} is not defined",
                              fix="use 'forward', 'reverse' or 'bidirectional'")
    n_dir = 2 if direction == "bidirectional" else 1
    layout = int(attrs.get("layout", 0))
    if layout not in (0, 1):
        raise imp.unsupported(f"{op} layout={layout} is not defined", fix="use layout 0 or 1")
    # clip, input_forget and the activations' names are checked by _rules (before this runs)
    acts = _acts(attrs) or list(_DEFAULT_ACTS[op]) * n_dir
    per_dir = len(_DEFAULT_ACTS[op])
    if len(acts) != per_dir * n_dir:
        raise imp.unsupported(f"{op} has {len(acts)} activations, {direction} needs {per_dir * n_dir}",
                              fix="the node is malformed; export it again")

    if layout == 1:
        x = g.op("transpose", x, perm=(1, 0, 2))
    if x.rank != 3:
        raise imp.unsupported(f"{op} input X has rank {x.rank}", fix="X is [seq, batch, input] (layout 0)")
    seq, batch = x.shape[0], x.shape[1]
    if not isinstance(seq, int):
        raise imp.symbolic(f"{op} over the symbolic sequence length {seq!r} (the layer is unrolled over "
                           f"a static number of time steps)", [seq])
    lens = arg(4)
    if lens is not None:
        if not isinstance(lens, _Const):
            raise imp.unsupported(f"{op} sequence_lens computed at run time is not translated (the layer is "
                                  f"unrolled over the full sequence length {seq})",
                                  fix="drop sequence_lens (or make it a constant equal to the sequence "
                                      "length): pad the batch and mask the outputs instead")
        if not np.all(lens.array.reshape(-1) == seq):
            got = lens.array.reshape(-1).tolist()
            raise imp.unsupported(f"{op} sequence_lens {got} differ from the full sequence length {seq} "
                                  f"(per-batch lengths are not translated)",
                                  fix="drop sequence_lens (or make every entry the sequence length): pad "
                                      "the batch and mask the outputs instead")

    w = imp.t(arg(1), x.dtype)
    r = imp.t(arg(2), x.dtype)
    hid = attrs.get("hidden_size")
    h = int(hid) if hid is not None else r.shape[-1]
    if not isinstance(h, int) or w.shape[0] != n_dir or tuple(r.shape[1:]) != (n_gates * h, h) \
            or w.shape[1] != n_gates * h:
        raise imp.unsupported(f"{op} weights W {w.shape} / R {r.shape} do not match {n_dir} direction(s), "
                              f"{n_gates} gate(s) and hidden_size {hid}", fix="the node is malformed")
    b = imp.t(arg(3), x.dtype) if arg(3) is not None else None
    h0 = imp.t(arg(5), x.dtype) if arg(5) is not None else None
    c0 = imp.t(arg(6), x.dtype) if op == "LSTM" and arg(6) is not None else None
    p = imp.t(arg(7), x.dtype) if op == "LSTM" and arg(7) is not None else None
    if layout == 1:
        h0 = None if h0 is None else g.op("transpose", h0, perm=(1, 0, 2))
        c0 = None if c0 is None else g.op("transpose", c0, perm=(1, 0, 2))
    lbr = bool(int(attrs.get("linear_before_reset", 0)))
    # One fused node where the recurrent ops define the layer (f32/f64, ONNX's default activations);
    # else the same recurrence unrolled step by step (their decomposition).
    fused = SCAN_OPS and op != "RNN" and x.dtype in SCAN_DTYPES and \
        [a.lower() for a in acts] == list(DEFAULT_ACTS[op.lower()]) * n_dir

    # One input projection for every step and direction: x @ W.T plus every bias that adds to a
    # gate's pre-activation (all of them but a GRU's recurrent candidate bias with
    # linear_before_reset, which is inside r * (...)).
    gh = n_gates * h
    wall = g.op("reshape", w, shape=(n_dir * gh, w.shape[2]))  # [D*G*h, input]
    rb = None
    if b is None:
        xp = g.op("matmul", x, g.op("transpose", wall, perm=(1, 0)))
    else:
        wb = g.op("slice", b, starts=(0,), stops=(gh,), axes=(1,))
        rbs = g.op("slice", b, starts=(gh,), stops=(2 * gh,), axes=(1,))  # [D, G*h]
        if op == "GRU" and lbr:
            rb = g.op("slice", rbs, starts=(2 * h,), stops=(3 * h,), axes=(1,))  # [D, h]
            rbs = g.op("concat", g.op("slice", rbs, starts=(0,), stops=(2 * h,), axes=(1,)),
                       g.op("expand", g.const(0, x.dtype), shape=(n_dir, h)), axis=1)
        xp = g.op("linear", x, wall, g.op("reshape", wb + rbs, shape=(n_dir * gh,)))  # [seq, batch, D*G*h]
    state = g.op("expand", g.const(0, x.dtype), shape=(n_dir, batch, h))
    h0 = state if h0 is None else h0
    c0 = state if c0 is None else c0

    if fused and op == "LSTM":
        y_all, y_h_all, y_c_all = g.op("lstm_scan", xp, r, h0, c0, *([p] if p is not None else []),
                                       direction=direction)
    elif fused:
        y_all, y_h_all = g.op("gru_scan", xp, r, h0, *([rb] if rb is not None else []),
                              linear_before_reset=lbr, direction=direction)
    else:
        ys: list[Tensor] = []
        last_h: list[Tensor] = []
        last_c: list[Tensor] = []
        for d in range(n_dir):
            xd = g.op("slice", xp, starts=(d * gh,), stops=((d + 1) * gh,), axes=(2,)) if n_dir > 1 else xp
            yd, hd, cd = unroll(g, op.lower(), xd, _dir_slice(imp, r, d), _dir_slice(imp, h0, d),
                                _dir_slice(imp, c0, d) if op == "LSTM" else None,
                                p=None if p is None else _dir_slice(imp, p, d),
                                rb=None if rb is None else _dir_slice(imp, rb, d), lbr=lbr,
                                reverse=direction == "reverse" or d == 1,
                                acts=[a.lower() for a in acts[d * per_dir:(d + 1) * per_dir]])
            ys.append(yd)
            last_h.append(hd)
            last_c.append(cd)

        def stack(ts: Sequence[Tensor], axis: int, shape: tuple) -> Tensor:
            parts = [g.op("reshape", t, shape=shape) for t in ts]
            return parts[0] if len(parts) == 1 else g.op("concat", *parts, axis=axis)

        y_all = stack(ys, 1, (seq, 1, batch, h))  # [seq, num_directions, batch, h]
        y_h_all = stack(last_h, 0, (1, batch, h))
        y_c_all = stack(last_c, 0, (1, batch, h)) if op == "LSTM" else None

    wanted = list(node.output) + [""] * (3 - len(node.output))
    y = y_h = y_c = None
    if wanted[0]:
        y = g.op("transpose", y_all, perm=(2, 0, 1, 3)) if layout == 1 else y_all
    if wanted[1]:
        y_h = g.op("transpose", y_h_all, perm=(1, 0, 2)) if layout == 1 else y_h_all
    if op == "LSTM" and wanted[2]:
        y_c = g.op("transpose", y_c_all, perm=(1, 0, 2)) if layout == 1 else y_c_all
    return [y, y_h, y_c][:len(node.output)]
