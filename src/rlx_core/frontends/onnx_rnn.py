"""ONNX recurrent layers RNN, GRU and LSTM (versions 7 to 22), unrolled into existing RLX IR ops.

The sequence length must be static: each time step becomes a few ``matmul``/elementwise ops, so
every backend runs them (no new IR op, no loop). The input projection of all steps is one
``matmul`` before the loop; only the recurrent ``h @ R^T`` is per step. Directions forward,
reverse and bidirectional, layout 0 and 1, optional B / initial_h / initial_c, GRU's
linear_before_reset and LSTM peepholes are exact. What cannot be translated exactly is refused by
name: a ``sequence_lens`` that is not the full length everywhere (per-batch lengths make the
outputs data-dependent), ``clip``, ``input_forget=1`` and activations other than Sigmoid, Tanh and
Relu (the ones with alpha/beta parameters).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..dtypes import DType
from ..ir.builder import Tensor
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


def _act(imp: _Importer, name: str) -> Callable[[Tensor], Tensor]:
    op = {"sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu"}[name.lower()]
    return lambda x: imp.g.op(op, x)


def _dir_slice(imp: _Importer, w: Tensor, d: int) -> Tensor:
    """``w[d]`` of a ``[num_directions, ...]`` tensor."""
    g = imp.g
    s = g.op("slice", w, starts=(d,), stops=(d + 1,), axes=(0,))
    return g.op("reshape", s, shape=tuple(w.shape[1:]))


def _cols(imp: _Importer, x: Tensor, k: int, h: int) -> Tensor:
    """Gate ``k`` (columns ``k*h : (k+1)*h`` of the last axis)."""
    ax = x.rank - 1
    return imp.g.op("slice", x, starts=(k * h,), stops=((k + 1) * h,), axes=(ax,))


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
    zeros = g.op("expand", g.const(0, x.dtype), shape=(batch, h))

    ys: list[list[Tensor]] = []
    last_h: list[Tensor] = []
    last_c: list[Tensor] = []
    for d in range(n_dir):
        fs = [_act(imp, a) for a in acts[d * per_dir:(d + 1) * per_dir]]
        wt = g.op("transpose", _dir_slice(imp, w, d), perm=(1, 0))  # [input, G*h]
        rt = g.op("transpose", _dir_slice(imp, r, d), perm=(1, 0))  # [h, G*h]
        xp = g.op("matmul", x, wt)  # [seq, batch, G*h]: the input projection of every step at once
        wb = rb = None
        if b is not None:
            bd = _dir_slice(imp, b, d)
            wb = g.op("slice", bd, starts=(0,), stops=(n_gates * h,), axes=(0,))
            rb = g.op("slice", bd, starts=(n_gates * h,), stops=(2 * n_gates * h,), axes=(0,))
            if op != "GRU":
                xp = xp + wb + rb
            else:  # the recurrent bias of the hidden gate is inside r * (...) with linear_before_reset
                xp = xp + wb
        hd = zeros if h0 is None else _dir_slice(imp, h0, d)
        cd = zeros if c0 is None else _dir_slice(imp, c0, d)
        peep = None if p is None else _dir_slice(imp, p, d)
        steps = range(seq - 1, -1, -1) if (direction == "reverse" or d == 1) else range(seq)
        outs: dict[int, Tensor] = {}
        for t in steps:
            xt = g.op("reshape", g.op("slice", xp, starts=(t,), stops=(t + 1,), axes=(0,)),
                      shape=(batch, n_gates * h))
            if op == "RNN":
                hd = fs[0](xt + g.op("matmul", hd, rt))
            elif op == "GRU":
                hd = _gru_step(imp, xt, hd, rt, rb, h, fs, int(attrs.get("linear_before_reset", 0)))
            else:
                hd, cd = _lstm_step(imp, xt + g.op("matmul", hd, rt), cd, peep, h, fs)
            outs[t] = hd
        ys.append([outs[t] for t in range(seq)])
        last_h.append(hd)
        last_c.append(cd)

    def stack(ts: Sequence[Tensor], axis: int, shape: tuple) -> Tensor:
        parts = [g.op("reshape", t, shape=shape) for t in ts]
        return parts[0] if len(parts) == 1 else g.op("concat", *parts, axis=axis)

    wanted = list(node.output) + [""] * (3 - len(node.output))
    y = y_h = y_c = None
    if wanted[0]:
        per = [stack(steps_d, 0, (1, 1, batch, h)) for steps_d in ys]  # [seq, 1, batch, h]
        y = per[0] if n_dir == 1 else g.op("concat", *per, axis=1)
        if layout == 1:
            y = g.op("transpose", y, perm=(2, 0, 1, 3))
    if wanted[1]:
        y_h = stack(last_h, 0, (1, batch, h))
        if layout == 1:
            y_h = g.op("transpose", y_h, perm=(1, 0, 2))
    if op == "LSTM" and wanted[2]:
        y_c = stack(last_c, 0, (1, batch, h))
        if layout == 1:
            y_c = g.op("transpose", y_c, perm=(1, 0, 2))
    return [y, y_h, y_c][:len(node.output)]


def _gru_step(imp: _Importer, xt: Tensor, hp: Tensor, rt: Tensor, rb: Tensor | None, h: int,
              fs: Sequence[Callable[[Tensor], Tensor]], lbr: int) -> Tensor:
    g = imp.g
    f, gfn = fs
    hr = g.op("matmul", hp, _cols(imp, rt, 0, 2 * h) if lbr == 0 else rt)  # [batch, 2h or 3h]
    if rb is not None:
        hr = hr + (_cols(imp, rb, 0, 2 * h) if lbr == 0 else rb)
    z = f(_cols(imp, xt, 0, h) + _cols(imp, hr, 0, h))
    rg = f(_cols(imp, xt, 1, h) + _cols(imp, hr, 1, h))
    if lbr == 0:  # (r * h_prev) @ Rh^T + Rbh
        inner = g.op("matmul", rg * hp, _cols(imp, rt, 2, h))
        if rb is not None:
            inner = inner + _cols(imp, rb, 2, h)
    else:  # r * (h_prev @ Rh^T + Rbh)
        inner = rg * _cols(imp, hr, 2, h)
    cand = gfn(_cols(imp, xt, 2, h) + inner)
    one = g.const(1, xt.dtype)
    return (one - z) * cand + z * hp


def _lstm_step(imp: _Importer, gates: Tensor, cp: Tensor, peep: Tensor | None, h: int,
               fs: Sequence[Callable[[Tensor], Tensor]]) -> tuple[Tensor, Tensor]:
    f, gfn, hfn = fs
    gi, go, gf, gc = (_cols(imp, gates, k, h) for k in range(4))  # ONNX's gate order: i, o, f, c
    if peep is not None:  # P is [3h] in the order i, o, f
        gi = gi + _cols(imp, peep, 0, h) * cp
        gf = gf + _cols(imp, peep, 2, h) * cp
    i, fg = f(gi), f(gf)
    c = fg * cp + i * gfn(gc)
    if peep is not None:
        go = go + _cols(imp, peep, 1, h) * c
    return f(go) * hfn(c), c
