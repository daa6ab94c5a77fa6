"""A linear (``o = x @ w.T + b``, then an optional ReLU) as one oneDNN matmul primitive whose
constant weights are packed once, on an OpenMP team of the threads the load leaves.

Why: oneDNN's ``sgemm`` (the dense path's first team form) re-packs the weights at every call;
with few rows that packing costs as much as the arithmetic (MLP 784-512 at batch 8: ~25 us, of
which the multiply-adds are ~10). The matmul primitive takes the weights in the blocked layout it
chose once, adds the bias and applies the ReLU as post-ops while the output tile is in registers.

A primitive's split over threads is fixed when it is made, and for some shapes a different thread
count splits the sum over k (other bits): a team of fewer threads than the full one is used only
after it gave the full team's bits on the same weights and a seeded random input
(:func:`linear_team`); otherwise that load runs the full team.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from rlx_core.plugin import release_file_pages

from . import onednn_conv as oc
from .parallel import PerTeam, RowPool

Run = Callable[[], None]


def _build(api: dict[str, Any], x: np.ndarray, w: np.ndarray, b: np.ndarray | None, o: np.ndarray,
           relu: bool, threads: int) -> Run:
    """The matmul primitive made for ``threads`` OpenMP threads and bound to these buffers."""
    return oc.made_for(api, threads, lambda: steps_for(api, x, w, b, o, relu))


def steps_for(api: dict[str, Any], x: np.ndarray, w: np.ndarray, b: np.ndarray | None, o: np.ndarray,
              relu: bool) -> tuple[list[tuple[Any, Any]], list[Any], str]:
    """The matmul primitive bound to these buffers, made for the current OpenMP thread count:
    (its execute steps, what they point into, its implementation's name)."""
    fns = api["fns"]
    p = oc._Prim(api)
    (m, k), n = x.shape, w.shape[0]
    x_md = p.md_plain((m, k), oc._strides_elems(x))
    ws = oc._strides_elems(w)
    w_user = p.md_plain((k, n), (ws[1], ws[0]))  # w is (n, k): the matmul reads w.T, (k, n)
    b_md = None if b is None else p.md_plain((1, n), (n, 1))
    o_md = p.md_plain((m, n), oc._strides_elems(o))
    pd = oc._VP()
    attr = oc._post_ops(p, False, "relu" if relu else "")
    p.check(fns["dnnl_matmul_primitive_desc_create"](ctypes.byref(pd), api["engine"], x_md, p.md_any((k, n)),
                                                     b_md, o_md, attr), "matmul primitive_desc")
    p.owned.append(("dnnl_primitive_desc_destroy", pd))
    prim = p.primitive(pd)
    w_md = fns["dnnl_primitive_desc_query_md"](pd, oc._QUERY_EXEC_ARG_MD, oc._ARG_WEIGHTS)
    keep: list[Any] = [p, x, w, o, b]
    w_src = p.memory(w_user, w.ctypes.data)
    if fns["dnnl_memory_desc_equal"](w_md, w_user):
        w_mem = w_src
    else:  # packed once: the weights are constants
        wb = oc._aligned(fns["dnnl_memory_desc_get_size"](w_md))
        keep.append(wb)
        w_mem = p.memory(w_md, wb.ctypes.data)
        rprim, rargs = p.reorder(w_user, w_md, w_src, w_mem)
        oc._execute(api, [(rprim, _args(rargs, keep))], 1)
        release_file_pages(w)  # the packed copy is what runs
    pairs = [(oc._ARG_SRC, p.memory(x_md, x.ctypes.data)), (oc._ARG_WEIGHTS, w_mem),
             (oc._ARG_DST, p.memory(o_md, o.ctypes.data))]
    if b is not None and b_md is not None:
        pairs.append((oc._ARG_BIAS, p.memory(b_md, b.ctypes.data)))
    pairs += p.own_scratchpad(pd, keep)
    return [(prim, _args(pairs, keep))], keep, oc.impl_info(api, pd)


def _args(pairs: list[tuple[int, Any]], keep: list[Any]) -> Any:
    arr = (oc._ExecArg * len(pairs))(*(oc._ExecArg(a, mem) for a, mem in pairs))
    keep.append(arr)
    return arr


def _agree(a: np.ndarray, b: np.ndarray) -> bool:
    """Same bits (NaN nowhere: the probe's input is finite)."""
    return bool(np.array_equal(a, b))


def usable(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, o: np.ndarray) -> bool:
    """float32 2-D operands with element strides (what the primitive's plain descriptors take)."""
    ops = [a for a in (x, w, b, o) if a is not None]
    return (all(a.dtype == np.float32 for a in ops) and x.ndim == w.ndim == o.ndim == 2
            and (b is None or (b.ndim == 1 and b.flags.c_contiguous))
            and all(s > 0 and s % 4 == 0 for a in ops for s in a.strides if a.ndim)
            and oc.USE and oc.available())


def linear_team(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, o: np.ndarray, relu: bool,
                pl: RowPool) -> Run | None:
    """``o = x @ w.T (+ b)`` (then ReLU, NaN kept) on the pool's active thread count as an OpenMP
    team (all its threads when the load leaves them), or None where oneDNN cannot (missing,
    refused shape)."""
    if not usable(x, w, b, o):
        return None
    api = oc._api()
    if api is None:
        return None
    full = pl.threads

    def make(n: int) -> Run:
        """The team for ``n`` threads if it gives the full team's bits, else the full team's."""
        if n == full:
            return _build(api, x, w, b, o, relu, full)
        rng = np.random.default_rng(0)
        xr = rng.standard_normal(x.shape, dtype=np.float32)
        got = [np.empty(o.shape, np.float32) for _ in range(2)]
        try:
            for t, g in zip((n, full), got):
                _build(api, xr, w, b, g, relu, t)()
            if _agree(got[0], got[1]):
                return _build(api, x, w, b, o, relu, n)
        except oc.OneDNNError:
            pass
        return teams.full

    try:
        teams = PerTeam(make, pl)
    except oc.OneDNNError:
        return None

    def run() -> None:
        teams.get()()
    run.onednn_impl = teams.full.onednn_impl  # type: ignore[attr-defined]
    run.team = teams  # type: ignore[attr-defined]  # for rlx_cpu.dense.merge_teams
    run.fp_quiet = True  # type: ignore[attr-defined]  # no NumPy arithmetic (rlx_cpu.program)
    return run
