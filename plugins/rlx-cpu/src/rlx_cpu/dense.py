"""Dense programs (MLPs: linears, ReLUs, a softmax) bound without Numba.

Why a path of their own: the general kernels load Numba (softmax rows, and oneDNN's sgemm through
a Numba trampoline for the GEMM row pieces), and Numba brings LLVM and SciPy: the MLP
784-512-256-10 peaked at 187 MB RSS at batch 1 and 212 MB at 256, against ONNX Runtime's 70 and
71 MB (all without PyTorch), ~125 MB of it those libraries. A program made only of the kernels
below needs none of them:

* a linear of at least :data:`TEAM_MIN_MACS` multiply-adds is one oneDNN matmul primitive with
  its weights packed once, bias and ReLU fused (:mod:`rlx_cpu.onednn_linear`) on an OpenMP team
  of the threads the load leaves (``RLX_CPU_DENSE_OPENMP``; the team's threads wait for the next
  linear spinning, so the MLP's linears hand over without a kernel wake-up);
  a smaller one of one or two rows is one ``np.matmul`` (OpenBLAS's GEMV-like path), with more
  rows the general path's row pieces on the row pool, each oneDNN's sgemm called through ctypes
  and the piece's bias added while its rows are in cache;
* a ReLU right after a linear is done in place on the GEMM's output (one run, no extra pass);
* a softmax is one oneDNN softmax primitive where the program's linears loaded oneDNN
  (:mod:`rlx_cpu.onednn_softmax`), else five ufunc calls (the general kernel's NumPy form).

Then a program loads NumPy's OpenBLAS and oneDNN (~15 MB more), never Numba or LLVM (with
``RLX_CPU_DENSE_OPENMP=0`` batch 1 loads no oneDNN either).
Anything else in the program (an attention, a layer norm, a convolution) sends it down the
general path unchanged, so transformer and convolution programs are not affected.
``RLX_CPU_DENSE=0`` turns this off.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlx_core.plugin import normalize_axis

from . import settings

Run = Callable[[], None]

#: Kernels a dense program may consist of; every one is bound below or by a NumPy-only factory.
KERNELS = frozenset({"cpu.linear", "cpu.maximum", "cpu.softmax", "cpu.log_softmax", "cpu.reshape"})
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def eligible(program: Any, views: Mapping[str, np.ndarray]) -> bool:
    """Is ``program`` a dense inference program: only :data:`KERNELS`, at least one linear, every
    linear on a constant (read-only) 2-D float weight with a 1-D bias of its dtype?"""
    if not settings.DENSE.get():
        return False
    steps = program.kernels
    if not steps or any(s.kernel not in KERNELS for s in steps):
        return False
    linears = [s for s in steps if s.kernel == "cpu.linear"]
    if not linears:
        return False
    for s in linears:
        if len(s.inputs) != 3 or len(s.outputs) != 1:
            return False
        x, w, b = (views[v] for v in s.inputs)
        o = views[s.outputs[0]]
        if (w.flags.writeable or w.ndim != 2 or b.ndim != 1 or x.ndim < 2 or o.dtype not in _FLOATS
                or not x.dtype == w.dtype == b.dtype == o.dtype):
            return False
    return True


def _zero(g: Any, name: str) -> bool:
    """Is ``name`` a constant whose every element is 0 (a ReLU's floor)?"""
    if name not in g.weights:
        return False
    a = np.asarray(g.weights[name])
    return a.size >= 1 and a.ndim <= 1 and bool(np.all(a == 0))


def bind(program: Any, views: Mapping[str, np.ndarray], factories: Mapping[str, Any]
         ) -> tuple[tuple[Run, ...], tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """(runs, their kernel names, for each run the claims whose work it does) of an
    :func:`eligible` program."""
    steps = program.kernels
    g = program.graph
    outs = {v for _, v in program.outputs}
    readers: dict[str, int] = {}
    for s in steps:
        for v in dict.fromkeys(s.inputs):
            readers[v] = readers.get(v, 0) + 1
    runs: list[Run] = []
    names: list[str] = []
    claims: list[tuple[str, ...]] = []
    i = 0
    while i < len(steps):
        s = steps[i]
        ins = [views[v] for v in s.inputs]
        o = views[s.outputs[0]]
        if s.kernel == "cpu.linear":
            relu = _relu_after(steps, i, g, outs, readers)
            if relu is not None:
                nxt = steps[i + 1]
                r = views[nxt.outputs[0]]
                zero = views[relu]
                first = nxt.inputs[0] == s.outputs[0]
                runs.append(_linear(ins[0], ins[1], ins[2], o, (r, zero, first)))
                names.append("cpu.dense_linear_relu")
                claims.append(("cpu.linear", "cpu.maximum"))
                i += 2
                continue
            head = _head(steps, i, views, outs, readers, runs)
            if head is not None:
                runs.append(head)
                kind = steps[i + 1].kernel
                names.append("cpu.dense_linear_" + kind.removeprefix("cpu."))
                claims.append(("cpu.linear", kind))
                i += 2
                continue
            runs.append(_linear(ins[0], ins[1], ins[2], o, None))
        elif s.kernel in ("cpu.softmax", "cpu.log_softmax"):
            # oneDNN's primitive where the program's linears loaded it already (else NumPy: a
            # program without team linears keeps its smaller footprint)
            onednn = any(hasattr(r, "onednn_impl") for r in runs)
            runs.append(_softmax(ins[0], o, s.attrs["axis"], s.kernel == "cpu.log_softmax", onednn))
        else:
            with np.errstate(all="ignore"):
                runs.append(factories[s.kernel](ins, [views[v] for v in s.outputs], s.attrs))
        names.append(s.kernel)
        claims.append((s.kernel,))
        i += 1
    return merge_teams(runs, names, claims)


def merge_teams(runs: Sequence[Run], names: Sequence[str], claims: Sequence[tuple[str, ...]]
                ) -> tuple[tuple[Run, ...], tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """Consecutive runs on the oneDNN team (each carrying its ``team``) as one run: one Python
    call for all their primitives (:func:`rlx_cpu.onednn_conv.sequence`). Python between the
    primitives runs with the caches the weights just went through (the MLP 784-512-256-10 reads
    2.1 MB a call, more than one core's L2), so each closure, team lookup and thread-count call
    costs several times its warm figure. A run with an ``after`` (the softmax's NaN-row pass)
    ends its group, since a later primitive may read what that pass writes. Names join with
    ``+`` and claims concatenate, as row chains do."""
    out: list[Run] = []
    out_names: list[str] = []
    out_claims: list[tuple[str, ...]] = []
    i = 0
    while i < len(runs):
        j = i
        while j < len(runs) and hasattr(runs[j], "team"):
            j += 1
            if hasattr(runs[j - 1], "after"):
                break
        if j - i < 2:
            out.append(runs[i])
            out_names.append(names[i])
            out_claims.append(claims[i])
            i += 1
            continue
        out.append(_merged(runs[i:j]))
        out_names.append("+".join(names[i:j]))
        out_claims.append(tuple(k for c in claims[i:j] for k in c))
        i = j
    return tuple(out), tuple(out_names), tuple(out_claims)


def _merged(span: Sequence[Any]) -> Run:
    """One run of the ``span``'s team primitives, per team size, then the last one's ``after``."""
    from . import onednn_conv as oc
    from .parallel import PerTeam

    api = oc._api()
    assert api is not None  # the span's runs were made on it
    teams = PerTeam(lambda n: oc.sequence(api, [r.team.variant(n) for r in span]), span[0].team.pool)
    get = teams.get
    after = getattr(span[-1], "after", None)
    if after is None:
        def run() -> None:
            get()()
    else:
        def run() -> None:
            get()()
            after()
    run.onednn_impl = [r.onednn_impl for r in span]  # type: ignore[attr-defined]
    run.teams = teams  # type: ignore[attr-defined]
    run.span = span  # type: ignore[attr-defined]
    run.tail = after  # type: ignore[attr-defined]
    run.fp_quiet = all(getattr(r, "fp_quiet", False) for r in span)  # type: ignore[attr-defined]
    return run


IOCall = Callable[[Mapping[str, Any]], dict[str, np.ndarray] | None]


def io_call(runs: Sequence[Any], inputs: Sequence[tuple[str, np.ndarray]],
            outs: Sequence[tuple[str, np.ndarray]]) -> IOCall | None:
    """A program's whole run as one call of the compiled loop (``rlx_cpu._dispatch.run_io``: the
    input copied in, the merged team run, the output copied out), for a program of one input, one
    output and one merged team run (an MLP); None for any other, or without the extension. The
    call returns None for an input it does not take as is (another dtype or shape, not
    C-contiguous): the program's general run copies that one. Why: at batch 1 the MLP's Python
    around its kernels ran cache-cold, the input's NumPy assignment and the output's copy alone
    several microseconds (``bench/run_path.py``)."""
    if len(runs) != 1 or len(inputs) != 1 or len(outs) != 1:
        return None
    merged = runs[0]
    span = getattr(merged, "span", None)
    (name, into), (oname, frm) = inputs[0], outs[0]
    if (span is None or not getattr(merged, "fp_quiet", False) or not into.flags.c_contiguous
            or not frm.flags.c_contiguous or np.shares_memory(into, frm)):
        return None
    from . import native

    if native.why_not() is not None:
        return None
    from . import onednn_conv as oc
    from ._dispatch import run_io
    from .parallel import PerTeam, poll

    api = oc._api()
    assert api is not None  # the span's runs were made on it
    tail = merged.tail  # the softmax head's NaN-row pass: run only where the C scan found a NaN
    plans = PerTeam(lambda n: oc.sequence_plan(api, [r.team.variant(n) for r in span], (into, frm),
                                               tail is not None), span[0].team.pool)
    get, stream = plans.get, oc._stream_address
    dt, shape, out_dt, out_shape = into.dtype, into.shape, frm.dtype, frm.shape

    def call(feed: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
        a = feed[name]
        if type(a) is not np.ndarray or a.dtype is not dt or a.shape != shape:
            return None
        out = np.empty(out_shape, out_dt)
        poll()
        try:
            st = run_io(get(), stream(api), a, out)
        except (BufferError, ValueError):  # not C-contiguous (NumPy's buffer export raises ValueError;
            return None  # dtype and shape matched, so the byte counts did)
        if st != 0:
            if st != -1:
                oc._failed(st)
            tail(out)
        return {oname: out}
    return call


def _head(steps: Sequence[Any], i: int, views: Mapping[str, np.ndarray], outs: set[str],
          readers: Mapping[str, int], runs: Sequence[Run]) -> Run | None:
    """The linear at step ``i`` and the softmax (or log-softmax) over the last axis that alone reads
    it as one call of two oneDNN primitives (:func:`rlx_cpu.onednn_softmax.head_run`), where the
    program's linears loaded oneDNN already; else None."""
    s = steps[i]
    if (i + 1 >= len(steps) or steps[i + 1].kernel not in ("cpu.softmax", "cpu.log_softmax")
            or steps[i + 1].inputs[0] != s.outputs[0] or readers.get(s.outputs[0]) != 1
            or s.outputs[0] in outs or not any(hasattr(r, "onednn_impl") for r in runs)):
        return None
    x, w, b = (views[v] for v in s.inputs)
    t, o = views[s.outputs[0]], views[steps[i + 1].outputs[0]]
    if x.ndim != 2 or t.ndim != 2 or normalize_axis(steps[i + 1].attrs["axis"], 2) != 1:
        return None
    from .onednn_softmax import head_run

    return head_run(x, w, b, t, o, 1, steps[i + 1].kernel == "cpu.log_softmax")


def _relu_after(steps: Sequence[Any], i: int, g: Any, outs: set[str], readers: Mapping[str, int]
                ) -> str | None:
    """The zero constant of a ``maximum(linear_out, 0)`` (either operand order) right after the
    linear at step ``i``, when nothing else reads the linear's output; else None."""
    if i + 1 >= len(steps):
        return None
    lo = steps[i].outputs[0]
    nxt = steps[i + 1]
    if nxt.kernel != "cpu.maximum" or len(nxt.inputs) != 2 or lo in outs or readers.get(lo) != 1:
        return None
    a, b = nxt.inputs
    other = b if a == lo else a if b == lo else None
    return other if other is not None and other != lo and _zero(g, other) else None


#: Rows up to which a linear is one ``np.matmul`` (OpenBLAS's GEMV-like path, as fast as
#: oneDNN there): the general path's threshold (``rlx_cpu.hir_kernels.GEMV_ROWS``).
GEMV_ROWS = 2


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray, o: np.ndarray,
            relu: tuple[np.ndarray, np.ndarray, bool] | None) -> Run:
    """``o = x @ w.T + b`` (then ``r = maximum(o, 0)`` when ``relu = (r, zero, o_first)``)."""
    # The constant weight re-laid out once as (in, out), as the general kernel does: OpenBLAS runs
    # x @ W faster than x @ W.T with W row-major (GEMV 784x512: ~20 against ~22 us).
    wt = np.ascontiguousarray(w.T)
    wt.flags.writeable = False
    if x.ndim > 2 and x.flags.c_contiguous and o.flags.c_contiguous:
        x, o = x.reshape(-1, x.shape[-1]), o.reshape(-1, o.shape[-1])  # one GEMM, not one a row
    # Where the GEMM writes: straight into the ReLU's buffer when it can (bias and ReLU then in
    # place while the rows are in cache), else the linear's own.
    t, post = o, None
    if relu is not None:
        r, zero, o_first = relu
        r2 = r.reshape(o.shape) if r.shape != o.shape and r.size == o.size and r.flags.c_contiguous else r
        if (r2.shape == o.shape and r2.dtype == o.dtype and r2.flags.c_contiguous and o.ndim == 2
                and not np.may_share_memory(r2, x)):
            t = r2
        post = (r2 if t is r2 else r, zero, o_first)
    if (o.ndim == 2 and x.ndim == 2 and x.shape[0] * wt.size >= TEAM_MIN_MACS
            and (post is None or post[0] is t) and settings.DENSE_OPENMP.get()):
        team = _team(x, w, b, t, post)
        if team is not None:
            return team
    if o.ndim == 2 and x.ndim == 2 and o.shape[0] > GEMV_ROWS:
        rows = _row_pieces(x, wt, b, t, post)
        if rows is not None:
            return rows
    return _whole(x, wt, b, t, o, post)


#: Multiply-adds from which a linear runs on an OpenMP team (``RLX_CPU_DENSE_OPENMP``).
#: Per linear of the MLP 784-512-256-10, 2-core EPYC, 2026-12-02 (best / median us; np.matmul,
#: oneDNN's sgemm on one thread, sgemm on a team of two; the matmul primitive on a team is 20-35%
#: faster again): b1 784x512 20.3/23.9, 22.8/24.1, 11.4/13.2; 512x256 6.5/7.2, 6.8/7.4, 6.2/6.7;
#: 256x10 1.5/1.6, 3.7/3.8, 3.1/3.2. b8 784x512 61.3/68.7, 37.7/39.5,
#: 21.5/24.2. b256 784x512 976/1050, 1007/1043, 536/565 (the row pool's two pieces: ~570 in the
#: program). A team's threads wait for the next call spinning, so consecutive linears hand over
#: without a kernel wake-up; below this size the call costs more than the split gains.
TEAM_MIN_MACS = 131072


def _team(x: np.ndarray, w: np.ndarray, b: np.ndarray, t: np.ndarray,
          post: tuple[np.ndarray, np.ndarray, bool] | None) -> Run | None:
    """The linear as oneDNN's matmul primitive (:mod:`rlx_cpu.onednn_linear`: weights packed once,
    bias and ReLU fused) on as many OpenMP threads as the row pool has active (fewer while other
    processes keep a core busy, where that gives the same bits); None without oneDNN, a second
    core, or where the primitive refuses the operands (the row pieces or ``np.matmul`` then)."""
    from .onednn_linear import linear_team
    from .parallel import pool

    p = pool()
    if p.threads < 2:
        return None
    return linear_team(x, w, b, t, post is not None, p)


def _whole(x: np.ndarray, wt: np.ndarray, b: np.ndarray, t: np.ndarray, o: np.ndarray,
           post: tuple[np.ndarray, np.ndarray, bool] | None) -> Run:
    """The linear as one ``np.dot`` (else ``np.matmul``) into ``t``, the bias and ReLU (``post``)
    after it."""
    from .blas import numpy_gemm

    add, maximum = np.add, np.maximum
    matmul = numpy_gemm(x, wt, o if post is not None and t is not post[0] else t)
    if post is None:
        def run() -> None:
            matmul(x, wt, out=t)
            add(t, b, out=t)
        return run
    r, zero, o_first = post
    if t is r:
        if o_first:
            def run_in_place() -> None:
                matmul(x, wt, out=t)
                add(t, b, out=t)
                maximum(t, zero, out=t)
        else:
            def run_in_place() -> None:
                matmul(x, wt, out=t)
                add(t, b, out=t)
                maximum(zero, t, out=t)
        return run_in_place
    a_, b_ = (o, zero) if o_first else (zero, o)

    def run_two() -> None:
        matmul(x, wt, out=o)
        add(o, b, out=o)
        maximum(a_, b_, out=r)
    return run_two


#: Multiply-adds below which a linear of more than two rows that runs as one piece is one
#: ``np.matmul`` instead: 8x256 @ 256x10 took 8.8 us as a row piece (oneDNN through ctypes,
#: bias after) and 2.6 us as ``np.matmul`` (2026-12-02, 2-core EPYC).
SMALL_MACS = 262144


def _row_pieces(x: np.ndarray, wt: np.ndarray, b: np.ndarray, t: np.ndarray,
                post: tuple[np.ndarray, np.ndarray, bool] | None) -> Run | None:
    """The linear in row pieces on the row pool: each a single-threaded GEMM (oneDNN through
    ctypes for float32, the private OpenBLAS otherwise), then its rows' bias and ReLU while they
    are in cache; None where rlx-cpu's BLAS is not there (then NumPy's threaded one does all)."""
    from . import blas
    from .parallel import RowRun, pool

    if post is not None and post[0] is not t:
        return None  # the ReLU reads another buffer: the whole-tensor form
    gemm = blas.dnnl_gemm_fn(x, wt, t) or blas.gemm_fn(x, wt, t)
    if gemm is None:
        return None
    m, k, n = t.shape[0], x.shape[1], t.shape[1]
    threads = pool().threads
    # The general linear's split rule (rlx_cpu.hir_kernels.SPLIT_MIN_MACS): a hand-off costs
    # ~20 us at the median, 4M multiply-adds ~70 us on one core.
    parts = threads if m * n * k >= 4_000_000 and m >= 2 * threads else 1
    if parts == 1 and m * n * k < SMALL_MACS:
        return None  # one np.matmul (OpenBLAS, one thread at this size) costs less than a piece
    cpt = max(1, min(4, m // (512 * threads)))
    add, maximum = np.add, np.maximum
    zero, o_first = (post[1], post[2]) if post is not None else (None, True)

    def rows(lo: int, hi: int) -> None:
        gemm(lo, hi)
        piece = t[lo:hi]
        add(piece, b, out=piece)
        if zero is not None:
            if o_first:
                maximum(piece, zero, out=piece)
            else:
                maximum(zero, piece, out=piece)
    return RowRun(rows, m, (), m * n * k // 64, chunks_per_thread=cpt, parts=parts)


def _softmax(x: np.ndarray, o: np.ndarray, axis: Any, log: bool, onednn: bool) -> Run:
    """(log-)softmax along ``axis`` in five ufunc calls into buffers made once (the reductions'
    arguments positional: their keywords cost ~0.1 us each)."""
    if x.size == 0:
        return lambda: None  # an empty output: nothing to compute
    ax = normalize_axis(axis, x.ndim)
    if onednn:
        from .onednn_softmax import softmax_run

        prim = softmax_run(x, o, ax, log)
        if prim is not None:
            return prim
    red = tuple(1 if k == ax else d for k, d in enumerate(x.shape))
    m, s = np.empty(red, x.dtype), np.empty(red, x.dtype)
    vmax: Any = np.maximum.reduce  # positional (axis, dtype, out, keepdims): no stub matches
    vsum: Any = np.add.reduce
    sub, exp = np.subtract, np.exp
    if log:
        e = np.empty(o.shape, o.dtype)
        lg = np.log

        def run_log() -> None:
            vmax(x, ax, None, m, True)
            sub(x, m, out=o)
            exp(o, out=e)
            vsum(e, ax, None, s, True)
            lg(s, out=s)
            sub(o, s, out=o)
        return run_log
    div = np.divide

    def run() -> None:
        vmax(x, ax, None, m, True)
        sub(x, m, out=o)
        exp(o, out=o)
        vsum(o, ax, None, s, True)
        div(o, s, out=o)
    return run
