"""ONNX operators outside the default domain's tensor core, as exact RLX decompositions (issue 17).

* ``ai.onnx.preview.training`` optimizers (Adagrad, Adam, Momentum incl. Nesterov): one update step,
  elementwise per the operator's definition. The step count ``T`` is a run-time input, so the
  "first step" cases of the spec (``T == 0``: no bias correction in Adam, ``beta`` replaced by 1 in
  Momentum) are selected with ``where`` on the backend, never specialised at import.
* ``ai.onnx.ml`` Binarizer and ArrayFeatureExtractor (compare/where and a gather on the last axis),
  TreeEnsemble (dense path algebra, see below).
* HannWindow/HammingWindow/BlackmanWindow with a run-time size: staged execution keys the stage on
  the size and feeds it, and the window is computed on the backend (iota, cos) from the fed size.

The handlers register in :mod:`rlx_core.frontends.onnx`'s tables (that module imports this one), the
non-default-domain ones with :func:`~rlx_core.frontends.onnx.register_handler`.
"""

from __future__ import annotations

import math
from typing import Any

from ..dtypes import DType
from ..ir.builder import Tensor
from .onnx import _handler, _Importer, register_handler

_TRAINING = "ai.onnx.preview.training"
_ML = "ai.onnx.ml"
_MALFORMED = "the model is malformed: check it with onnx.checker.check_model"


# ---------------------------------------------------------------------------------------------
# ai.onnx.preview.training: one optimizer step


def _groups(imp: _Importer, node: Any, ins: list, per: int) -> tuple[Tensor, Tensor, list[list[Tensor]]]:
    """``R``, ``T`` and the ``per`` tensor lists (X, G, then the optimizer's state) of ``n`` params."""
    op = node.op_type
    n, rest = divmod(len(ins) - 2, per)
    if len(ins) < 2 + per or rest or any(v is None for v in ins):
        raise imp.unsupported(f"{op} takes R, T and {per} groups of one tensor per optimized parameter; "
                              f"got {len(ins)} inputs", fix=_MALFORMED)
    r, t = imp.t(ins[0]), imp.t(ins[1])
    xs = [imp.t(v) for v in ins[2:]]
    dt = xs[0].dtype
    if not dt.is_float or any(x.dtype != dt for x in xs) or not r.dtype.is_float:
        raise imp.unsupported(f"{op} needs float tensors of one dtype for R and the parameters, got "
                              f"{sorted({str(x.dtype) for x in [r, *xs]})}", fix=_MALFORMED)
    if t.dtype is not DType.I64 or r.rank or t.rank:
        raise imp.unsupported(f"{op} needs R a float scalar and T an int64 scalar, got R {r.type}, "
                              f"T {t.type}", fix=_MALFORMED)
    if r.dtype != dt:
        r = imp.g.op("cast", r, to=dt)
    return r, t, [xs[k * n:(k + 1) * n] for k in range(per)]


def _attr_f(imp: _Importer, node: Any, attrs: dict, name: str, default: float | None) -> float:
    v = attrs.get(name, default)
    if v is None:
        raise imp.unsupported(f"{node.op_type} needs the attribute {name!r}", fix=_MALFORMED)
    return float(v)


def _adagrad(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    r, t, (xs, gs, hs) = _groups(imp, node, ins, 3)
    g = imp.g
    dt = r.dtype
    decay = _attr_f(imp, node, attrs, "decay_factor", 0.0)
    eps = _attr_f(imp, node, attrs, "epsilon", 0.0)
    lam = _attr_f(imp, node, attrs, "norm_coefficient", 0.0)
    tf = g.op("cast", t, to=dt)
    r_t = r / (tf * decay + 1.0)  # the learning rate decayed by the step count
    new_x, new_h = [], []
    for x, grad, h in zip(xs, gs, hs):
        gr = x * lam + grad  # gradient of the L2 regularization added
        h2 = h + gr * gr
        new_x.append(x - r_t * gr / (g.op("sqrt", h2) + eps))
        new_h.append(h2)
    return new_x + new_h


def _adam(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    r, t, (xs, gs, vs, hs) = _groups(imp, node, ins, 4)
    g = imp.g
    dt = r.dtype
    alpha = _attr_f(imp, node, attrs, "alpha", 0.9)
    beta = _attr_f(imp, node, attrs, "beta", 0.999)
    eps = _attr_f(imp, node, attrs, "epsilon", 1e-6)
    lam = _attr_f(imp, node, attrs, "norm_coefficient", 0.0)
    lam_post = _attr_f(imp, node, attrs, "norm_coefficient_post", 0.0)
    tf = g.op("cast", t, to=dt)
    # Bias correction from the first step on (T > 0); at T == 0 the rate is used as it is. The
    # unselected branch may divide by zero (1 - alpha**0): where() discards it.
    powers = [g.op("pow", g.const(c, dt), tf) for c in (beta, alpha)]
    bias = g.op("sqrt", 1.0 - powers[0]) / (1.0 - powers[1])
    r_t = g.op("where", g.op("greater", t, g.const(0, DType.I64)), r * bias, r)
    new_x, new_v, new_h = [], [], []
    for x, grad, v, h in zip(xs, gs, vs, hs):
        gr = x * lam + grad
        v2 = v * alpha + gr * (1.0 - alpha)
        h2 = h * beta + gr * gr * (1.0 - beta)
        x2 = x - r_t * (v2 / (g.op("sqrt", h2) + eps))
        new_x.append(x2 * (1.0 - lam_post))
        new_v.append(v2)
        new_h.append(h2)
    return new_x + new_v + new_h


def _momentum(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    r, t, (xs, gs, vs) = _groups(imp, node, ins, 3)
    g = imp.g
    dt = r.dtype
    alpha = _attr_f(imp, node, attrs, "alpha", None)
    beta = _attr_f(imp, node, attrs, "beta", None)
    lam = _attr_f(imp, node, attrs, "norm_coefficient", None)
    mode = str(attrs.get("mode", ""))
    if mode not in ("standard", "nesterov"):
        raise imp.unsupported(f"Momentum mode={mode!r} is not defined",
                              fix="use mode 'standard' or 'nesterov'")
    # The gradient's coefficient is 1 on the first step (T == 0), beta afterwards.
    b_t = g.op("where", g.op("greater", t, g.const(0, DType.I64)), g.const(beta, dt), g.const(1.0, dt))
    new_x, new_v = [], []
    for x, grad, v in zip(xs, gs, vs):
        gr = x * lam + grad
        v2 = v * alpha + b_t * gr
        step = v2 if mode == "standard" else gr + v2 * alpha
        new_x.append(x - r * step)
        new_v.append(v2)
    return new_x + new_v


register_handler("Adagrad", _adagrad, domain=_TRAINING)
register_handler("Adam", _adam, domain=_TRAINING)
register_handler("Momentum", _momentum, domain=_TRAINING)


# ---------------------------------------------------------------------------------------------
# ai.onnx.ml


def _binarizer(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    x = imp.t(ins[0])
    if not (x.dtype.is_float or x.dtype.is_int):
        raise imp.unsupported(f"Binarizer on {x.dtype} is not defined", fix=_MALFORMED)
    above = imp.g.op("greater", x, imp.g.const(float(attrs.get("threshold", 0.0)), x.dtype))
    return [imp.g.op("cast", above, to=x.dtype)]  # NaN compares false: 0, as the definition's x > t


def _array_feature_extractor(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    g = imp.g
    x, idx = imp.t(ins[0]), imp.t(ins[1])
    if idx.dtype not in (DType.I32, DType.I64):
        raise imp.unsupported(f"ArrayFeatureExtractor indices must be int64, got {idx.dtype}", fix=_MALFORMED)
    # Every index picks along the last axis; the indices count as one flat list whatever their shape
    # (ONNX Runtime's reading, which onnx's reference follows): a 1-D input gives a (1, n) result.
    n = 1
    for d in idx.shape:
        if isinstance(d, str):
            raise imp.symbolic(f"ArrayFeatureExtractor indices need a static shape, got {idx.shape}", [d])
        n *= int(d)
    flat = idx if idx.rank == 1 else g.op("reshape", idx, shape=(n,))
    out = g.op("gather", x, flat, axis=x.rank - 1)
    if x.rank == 1:
        out = g.op("reshape", out, shape=(1, n))
    return [out]


register_handler("Binarizer", _binarizer, domain=_ML)
register_handler("ArrayFeatureExtractor", _array_feature_extractor, domain=_ML)


# TreeEnsemble (ai.onnx.ml 5) as dense algebra over the root-to-leaf paths, enumerated at import:
# every branch node's comparison is one column of a 0/1 matrix C (N x nodes); a path is taken when
# all its conditions hold, i.e. when C @ P_true + (1 - C) @ P_false (a count of small integers, exact
# in floating point) equals its length; the aggregated leaf weights are then one matmul (SUM,
# AVERAGE) or a masked reduce_min/max (MIN, MAX).
_TREE_MAX_PATHS = 1 << 16


def _tensor_attr(attrs: dict, name: str) -> Any:
    from onnx import numpy_helper

    v = attrs.get(name)
    return None if v is None else numpy_helper.to_array(v)


def _tree_paths(imp: _Importer, attrs: dict) -> list[tuple[int, list[tuple[int, bool]]]]:
    """(leaf index, [(branch node, condition must be true)...]) for every root-to-leaf path."""
    t_ids, f_ids = list(attrs["nodes_truenodeids"]), list(attrs["nodes_falsenodeids"])
    t_leaf, f_leaf = list(attrs["nodes_trueleafs"]), list(attrs["nodes_falseleafs"])
    n = len(t_ids)
    if not (len(f_ids) == len(t_leaf) == len(f_leaf) == n):
        raise imp.unsupported("TreeEnsemble's nodes_* attributes have different lengths", fix=_MALFORMED)
    paths: list[tuple[int, list[tuple[int, bool]]]] = []
    for root in attrs["tree_roots"]:
        root = int(root)
        if not 0 <= root < n:
            raise imp.unsupported(f"TreeEnsemble tree root {root} is not a node index", fix=_MALFORMED)
        if t_leaf[root] and f_leaf[root] and t_ids[root] == f_ids[root]:
            paths.append((int(t_ids[root]), []))  # a tree that is one leaf
            continue
        stack: list[tuple[int, list[tuple[int, bool]]]] = [(root, [])]
        while stack:
            i, cond = stack.pop()
            if len(cond) > n:
                raise imp.unsupported("TreeEnsemble's nodes form a cycle", fix=_MALFORMED)
            for to, is_leaf, side in ((t_ids[i], t_leaf[i], True), (f_ids[i], f_leaf[i], False)):
                here = [*cond, (i, side)]
                if is_leaf:
                    paths.append((int(to), here))
                elif not 0 <= int(to) < n:
                    raise imp.unsupported(f"TreeEnsemble node {i} branches to {to}, not a node index",
                                          fix=_MALFORMED)
                else:
                    stack.append((int(to), here))
            if len(paths) + len(stack) > _TREE_MAX_PATHS:
                raise imp.unsupported(f"TreeEnsemble has more than {_TREE_MAX_PATHS} root-to-leaf paths",
                                      fix="run the tree ensemble in ONNX Runtime")
    return paths


def _tree_ensemble(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    import numpy as np

    g = imp.g
    x = imp.t(ins[0])
    if x.rank != 2 or not x.dtype.is_float:
        raise imp.unsupported(f"TreeEnsemble needs a 2-D float input, got {x.type}", fix=_MALFORMED)
    post = int(attrs.get("post_transform", 0))
    if post != 0:
        names = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")
        raise imp.unsupported(f"TreeEnsemble post_transform={names[post] if 0 <= post < 5 else post} is not "
                              f"translated (NONE only)", fix="apply the transform after the ensemble in "
                                                             "the model, or run it in ONNX Runtime")
    agg = int(attrs.get("aggregate_function", 1))
    if agg not in (0, 1, 2, 3):
        raise imp.unsupported(f"TreeEnsemble aggregate_function={agg} is not defined", fix=_MALFORMED)
    np_dt = x.dtype.np
    weights = np.asarray(_tensor_attr(attrs, "leaf_weights")).reshape(-1)
    targets = [int(t) for t in attrs["leaf_targetids"]]
    modes = np.asarray(_tensor_attr(attrs, "nodes_modes")).reshape(-1).astype(np.int64)
    splits = _tensor_attr(attrs, "nodes_splits")
    splits = np.asarray(splits).reshape(-1) if splits is not None else np.zeros(len(modes))
    feats = [int(f) for f in attrs["nodes_featureids"]]
    tracks = [int(v) for v in attrs.get("nodes_missing_value_tracks_true") or [0] * len(modes)]
    n_targets = int(attrs.get("n_targets", max(targets, default=-1) + 1))
    same_len = len(splits) == len(feats) == len(modes) == len(tracks)
    if len(weights) != len(targets) or any(not 0 <= t < n_targets for t in targets) or \
            any(not 0 <= m < 7 for m in modes) or not same_len:
        raise imp.unsupported("TreeEnsemble's leaf_*/nodes_* attributes are inconsistent", fix=_MALFORMED)
    # The sets of BRANCH_MEMBER nodes, in node order, NaN-delimited (the operator's definition).
    members: dict[int, list[float]] = {}
    mv = _tensor_attr(attrs, "membership_values")
    if (modes == 6).any():
        if mv is None:
            raise imp.unsupported("TreeEnsemble has BRANCH_MEMBER nodes but no membership_values",
                                  fix=_MALFORMED)
        sets: list[list[float]] = [[]]
        for v in np.asarray(mv, np.float64).reshape(-1):
            if np.isnan(v):
                sets.append([])
            else:
                sets[-1].append(float(v))
        member_nodes = [i for i, m in enumerate(modes) if m == 6]
        if len(sets) < len(member_nodes):
            raise imp.unsupported("TreeEnsemble membership_values has fewer sets than BRANCH_MEMBER nodes",
                                  fix=_MALFORMED)
        members = dict(zip(member_nodes, sets))
    if not len(attrs["tree_roots"]):
        raise imp.unsupported("TreeEnsemble has no trees (tree_roots is empty)", fix=_MALFORMED)
    paths = _tree_paths(imp, attrs)
    if any(not 0 <= leaf < len(weights) for leaf, _ in paths):
        raise imp.unsupported("TreeEnsemble branches to a leaf index outside leaf_weights", fix=_MALFORMED)
    used = sorted({i for _, cond in paths for i, _ in cond})
    col = {i: k for k, i in enumerate(used)}
    n_x = x.shape[1]
    if any(not 0 <= feats[i] < n_x for i in used if isinstance(n_x, int)):
        raise imp.unsupported(f"TreeEnsemble reads a feature index outside the input's {n_x} columns",
                              fix=_MALFORMED)
    n_paths = len(paths)
    count_dt = x.dtype if x.dtype in (DType.F32, DType.F64) else DType.F32
    if used:
        xf = g.op("gather", x, g.const(np.asarray([feats[i] for i in used], np.int64), DType.I64), axis=1)
        s = g.const(np.asarray([splits[i] for i in used], np_dt), x.dtype)
        cmp = {0: "less_equal", 1: "less", 2: "greater_equal", 3: "greater", 4: "equal", 5: "not_equal"}
        c: Tensor | None = None
        for m in sorted({int(modes[i]) for i in used}):
            mask = np.asarray([int(modes[i]) == m for i in used])
            if m == 6:
                k = max(len(members[i]) for i in used if modes[i] == 6) or 1
                table = np.full((len(used), k), np.nan)
                for i in used:
                    if modes[i] == 6:
                        table[col[i], :len(members[i])] = members[i]
                eq = g.op("equal", g.op("reshape", xf, shape=(*xf.shape, 1)),
                          g.const(table.astype(np_dt), x.dtype))
                hit = g.op("reduce_max", g.op("cast", eq, to=DType.I32), axes=(2,), keepdims=False)
                r = g.op("not_equal", hit, g.const(0, DType.I32))
            else:
                r = g.op(cmp[m], xf, s)
            c = r if c is None else g.op("where", g.const(mask, DType.BOOL), r, c)
        assert c is not None
        if any(tracks[i] for i in used):
            nan = g.op("logical_and", g.op("not_equal", xf, xf),
                       g.const(np.asarray([bool(tracks[i]) for i in used]), DType.BOOL))
            c = g.op("logical_or", c, nan)
        cf = g.op("cast", c, to=count_dt)
        p_true = np.zeros((len(used), n_paths), count_dt.np)
        p_false = np.zeros((len(used), n_paths), count_dt.np)
        for p, (_, cond) in enumerate(paths):
            for i, side in cond:
                (p_true if side else p_false)[col[i], p] += 1
        score = g.op("matmul", cf, g.const(p_true, count_dt)) + \
            g.op("matmul", 1.0 - cf, g.const(p_false, count_dt))
        depth = np.asarray([len(cond) for _, cond in paths], count_dt.np)
        active = g.op("equal", score, g.const(depth, count_dt))
    else:  # every tree is a single leaf: every path is taken
        zero = g.op("reduce_sum", g.op("cast", x, to=count_dt), axes=(1,), keepdims=True) * 0.0
        active = g.op("equal", g.op("expand", zero, shape=(x.shape[0], n_paths)), g.const(0.0, count_dt))
    n_trees = len(attrs["tree_roots"])
    if agg in (0, 1):
        w = np.zeros((n_paths, n_targets), np.float64)
        for p, (leaf, _) in enumerate(paths):
            w[p, targets[leaf]] = weights[leaf] / n_trees if agg == 0 else weights[leaf]
        return [g.op("matmul", g.op("cast", active, to=x.dtype), g.const(w.astype(np_dt), x.dtype))]
    big = np.finfo(np_dt).max if agg == 2 else np.finfo(np_dt).min  # the definition's start value
    w = np.full((n_paths, n_targets), big, np_dt)
    hits = np.zeros((n_paths, n_targets), bool)
    for p, (leaf, _) in enumerate(paths):
        w[p, targets[leaf]] = weights[leaf]
        hits[p, targets[leaf]] = True
    sel = g.op("logical_and", g.op("reshape", active, shape=(x.shape[0], n_paths, 1)),
               g.const(hits, DType.BOOL))
    vals = g.op("where", sel, g.const(w, x.dtype), g.const(big, x.dtype))
    return [g.op("reduce_min" if agg == 2 else "reduce_max", vals, axes=(1,), keepdims=False)]


register_handler("TreeEnsemble", _tree_ensemble, domain=_ML)


# ---------------------------------------------------------------------------------------------
# Window functions with a run-time size

#: a0 - a1 cos(x) + a2 cos(2x), x = 2 pi n / N (N = size when periodic, else size - 1), as in the
#: operators' function bodies (HammingWindow's a0 is 25/46, its a1 21/46).
_WINDOWS = {"HannWindow": (0.5, 0.5, 0.0), "HammingWindow": (25.0 / 46.0, 21.0 / 46.0, 0.0),
            "BlackmanWindow": (0.42, 0.5, 0.08)}


def _window(imp: _Importer, node: Any, ins: list, attrs: dict) -> list:
    """A window whose size is a run-time input: staged execution keys the stage on the size (the
    output's length) and feeds it too, so the angles and cosines are computed on the backend from
    the fed size (a constant size is folded at import before this handler is reached)."""
    from .onnx import _ONNX_TO_DTYPE, _Const, _Live

    op = node.op_type
    size = ins[0]
    if isinstance(size, Tensor):
        raise imp.needs_values([size], f"{op} size is computed at run time from tensor data, so the result's "
                                       f"shape is data-dependent")
    if not isinstance(size, _Const) or size.array.size != 1 or size.array.dtype.kind not in "iu":
        raise imp.unsupported(f"{op} size must be an integer scalar", fix=_MALFORMED)
    n = int(size.array.reshape(-1)[0])
    dt = _ONNX_TO_DTYPE.get(int(attrs.get("output_datatype", 1)))
    if dt is None or not dt.is_float:
        raise imp.unsupported(f"{op} output_datatype {attrs.get('output_datatype')} (a non-float window: "
                              f"the float values truncated) is not translated with a run-time size",
                              fix="use a float output_datatype and Cast afterwards, or a constant size")
    if n < 0:
        raise imp.unsupported(f"{op} size {n} is negative", fix=_MALFORMED)
    g = imp.g
    periodic = int(attrs.get("periodic", 1)) == 1
    a0, a1, a2 = _WINDOWS[op]
    # The size as the backend sees it (fed), never the folded key, when it is live.
    n_t = g.op("cast", size.live if isinstance(size, _Live) else imp.t(size), to=dt)
    if n_t.rank:
        n_t = g.op("reshape", n_t, shape=())
    denom = n_t if periodic else n_t - 1.0
    ang = g.op("iota", shape=(n,), axis=0, dtype=dt) * (g.const(2.0 * math.pi, dt) / denom)
    w = g.const(a0, dt) - g.op("cos", ang) * a1
    if a2:
        w = w + g.op("cos", ang * 2.0) * a2
    return [w]


for _op in _WINDOWS:
    _handler(_op)(_window)
