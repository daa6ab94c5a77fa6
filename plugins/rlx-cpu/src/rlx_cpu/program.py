"""The CPU executable: one 64-byte-aligned arena, a view per planned value, a bound kernel per step."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from rlx_core.plugin import InputError, Program, Step

from .parallel import poll

try:  # What np.errstate(all="ignore") sets, made once: the context manager costs 1-5 us a run
    # (a third of a small MLP's dispatch), setting its context variable directly ~0.7 us.
    from numpy._core import _ufunc_config, umath

    _ERR_VAR: Any = getattr(_ufunc_config, "_extobj_contextvar")  # noqa: B009  (private: no stubs)
    _IGNORE: Any = getattr(umath, "_make_extobj")(all="ignore")  # noqa: B009
except (ImportError, AttributeError, TypeError):  # another NumPy: the public context manager
    _ERR_VAR = None


def _aligned_arena(nbytes: int, align: int = 64) -> np.ndarray:
    raw = np.empty(nbytes + align, np.uint8)
    shift = (-raw.ctypes.data) % align
    return raw[shift:shift + nbytes]


Spans = tuple[list[tuple[int, int]], list[tuple[int, int]]]


def _spans(s: Step, base: int) -> Spans:
    """The arena bytes step ``s`` reads and writes (addresses from ``base``), from the LIR's
    read/write sets. Weights are left out: read-only constants outside the arena, which no step
    writes, so they never order two steps."""
    return ([(base + a.offset, base + a.end) for a in s.reads if a.space == "arena"],
            [(base + a.offset, base + a.end) for a in s.writes if a.space == "arena"])


def _pointer_spans(s: Step, views: Mapping[str, np.ndarray]) -> Spans:
    """The same from the bound views' pointers: for a program whose steps carry no sets."""
    from numpy.lib.array_utils import byte_bounds

    def span(x: np.ndarray) -> tuple[int, int]:
        lo, hi = byte_bounds(x)
        return int(lo), int(hi)
    return [span(views[i]) for i in s.inputs], [span(views[o]) for o in s.outputs]


class CpuProgram:
    """A compiled rlx-cpu program. Besides ``run`` it has the buffer-binding capability
    (:class:`rlx_core.plugin.BufferBinding`: ``buffer``, ``bind_input``, ``run_bound``), so state
    can stay in its arena between runs (resident training)."""

    def __init__(self, program: Program, factories: Mapping[str, Any]) -> None:
        self.program = program
        g = program.graph
        plan = program.plan
        self.arena = _aligned_arena(max(plan.arena_bytes, 1))
        views: dict[str, np.ndarray] = {}
        for name, off in plan.offsets.items():
            t = g.types[name]
            n = t.nbytes()
            views[name] = self.arena[off:off + n].view(t.dtype.np).reshape(t.shape)
        from .train_fuse import transposed_layout

        for name in transposed_layout(program):  # weights and their kin kept column-major
            t = g.types[name]
            off = plan.offsets[name]
            views[name] = self.arena[off:off + t.nbytes()].view(t.dtype.np).reshape(t.shape[::-1]).T
        for p in g.params:
            # Read-only: kernels may treat a read-only input as a constant of the program (and,
            # for example, re-lay it out once at bind time); no kernel may write into weights.
            w = np.asarray(g.weights[p.name]).view()
            w.flags.writeable = False
            views[p.name] = w
        self.views = views
        self.inputs = [(v.name, views[v.name]) for v in program.inputs]
        self.outputs = list(dict.fromkeys(v for _, v in program.outputs))
        self._outs = tuple((o, views[o]) for o in self.outputs)
        self._bound: set[str] = set()
        #: the whole run as one compiled call, for the inputs it takes (rlx_cpu.dense.io_call)
        self._io: Any = None
        from . import dense

        if dense.eligible(program, views):
            # An MLP: bound without Numba (rlx_cpu.dense); its row-split linears are not row
            # kernels another could chain with, so there is nothing to chain.
            self.runs, self.kernel_names, self.run_kernels = dense.bind(program, views, factories)
            self._slots: dict[str, list[tuple[list[int], int]]] = {}
            # Runs that call no NumPy ufunc (oneDNN through ctypes) need no floating-point error
            # state: setting and resetting it cost ~3 us a run once the weights left the caches (the MLP
            # at batch 1 before this: bench/run_path.py, "runs, warnings off" minus "runs alone").
            self._quiet = all(getattr(r, "fp_quiet", False) for r in self.runs)
            self._io = dense.io_call(self.runs, self.inputs, self._outs)
            return
        self._quiet = False
        runs = []
        for s in program.kernels:
            runs.append(self._bind(s, factories))
        from .train_fuse import fuse

        skipped = self._fuse_attention(runs)
        # Bind-time fusion (GEMMs on transposed views, momentum in the GEMM, in-place AXPY updates):
        # fewer runs over the same planned buffers; kernel_names follows the runs.
        self.runs, self.kernel_names, self._slots, self.run_kernels = fuse(program, views, runs)
        if skipped:
            self._drop_skipped()
        if not self._slots:  # inputs re-pointed at bind_input keep their own runs
            from .parallel import chain

            access = None
            # One run a step (bind-time fusion changed nothing): the steps' buffers are known.
            # Fused runs no longer match a step, so then no plain run is moved.
            if len(self.runs) == len(program.kernels):
                base = self.arena.ctypes.data
                lowered = all(s.writes or not s.outputs for s in program.kernels)
                access = [_spans(s, base) if lowered else _pointer_spans(s, views)
                          for s in program.kernels]
            runs, groups = chain(self.runs, list(range(len(self.runs))), access)
            idx = [g if isinstance(g, tuple) else (g,) for g in groups]
            self.kernel_names = tuple("+".join(self.kernel_names[i] for i in g) for g in idx)
            self.run_kernels = tuple(tuple(k for i in g for k in self.run_kernels[i]) for g in idx)
            self.runs = tuple(runs)

    def _fuse_attention(self, runs: list[Any]) -> bool:
        """Masked attention as exporters write it (see :func:`guarded_attention_chains`) becomes
        one run in place of the chain's last step; the other steps' runs become ``_skip``, dropped
        after bind-time fusion, their claims counted with the fused run (``profile``)."""
        found = guarded_attention_chains(self.program, self.views)
        self._guarded: set[int] = set()  # ids of the fused runs, which _drop_skipped names
        if not found:
            return False
        from .hir_kernels import bind_guarded_attention

        for chain_steps, last, operands, perms in found:
            one = np.ones((), self.views[operands[0]].dtype)
            runs[last] = bind_guarded_attention(*[
                one if not v else self.views[v] if perm is None else self.views[v].transpose(perm)
                for v, perm in zip(operands, perms)])
            self._guarded.add(id(runs[last]))
            for i in chain_steps:
                if i != last:
                    runs[i] = _skip
        return True

    def _drop_skipped(self) -> None:
        runs, names, kernels = [], [], []
        pending: list[str] = []
        for r, n, k in zip(self.runs, self.kernel_names, self.run_kernels):
            if r is _skip:
                pending.extend(k)
                continue
            runs.append(r)
            # A skipped step's claims count with the next run (a chain's transposes may come
            # before other steps: counts stay whole, the name comes from the fused run itself).
            names.append("cpu.attention_guarded" if id(r) in self._guarded else n)
            kernels.append((*pending, *k))
            pending = []
        self.runs, self.kernel_names, self.run_kernels = tuple(runs), tuple(names), tuple(kernels)

    def _bind(self, s: Step, factories: Mapping[str, Any]) -> Any:
        ins = [self.views[i] for i in s.inputs]
        outs = [self.views[o] for o in s.outputs]
        with np.errstate(all="ignore"):
            return factories[s.kernel](ins, outs, s.attrs)

    def buffer(self, name: str) -> np.ndarray:
        """The planned view of value ``name`` (weights: their read-only array)."""
        try:
            return self.views[name]
        except KeyError:
            raise InputError(f"this program has no value {name!r}", where="rlx-cpu program",
                             fix="name a graph input, output or intermediate") from None

    def run_bound(self) -> None:
        """Run the kernels on the buffers as they are (inputs set by ``bind_input``/``buffer``)."""
        poll()
        self._run_all()

    def _run_all(self) -> None:
        """Every run in order, floating-point warnings off (kernels compute inf/nan as IEEE says)."""
        if self._quiet:
            for r in self.runs:
                r()
            return
        if _ERR_VAR is None:
            with np.errstate(all="ignore"):
                for r in self.runs:
                    r()
            return
        token = _ERR_VAR.set(_IGNORE)
        try:
            for r in self.runs:
                r()
        finally:
            _ERR_VAR.reset(token)

    def bind_input(self, name: str, array: np.ndarray) -> bool:
        """Give input ``name`` its value for the next runs. When every kernel reads it through a
        BLAS pointer and ``array`` has the planned view's dtype, shape and strides, the kernels are
        pointed at ``array`` itself (no copy: the caller keeps it alive and unchanged until the run
        is over) and True is returned; otherwise it is copied into the planned buffer."""
        view = self.views[name]
        slots = self._slots.get(name)
        if (slots is not None and type(array) is np.ndarray and array.dtype == view.dtype
                and array.shape == view.shape and array.strides == view.strides):
            p = array.ctypes.data
            for ptrs, i in slots:
                ptrs[i] = p
            self._bound.add(name)
            return True
        np.copyto(view, array, casting="same_kind")
        if name in self._bound:
            self._unbind(name)
        return False

    def _unbind(self, name: str) -> None:
        p = self.views[name].ctypes.data
        for ptrs, i in self._slots[name]:
            ptrs[i] = p
        self._bound.discard(name)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._io is not None:  # dense programs only: nothing is ever bound there
            got = self._io(inputs)
            if got is not None:
                return got
        if self._bound:
            for name in list(self._bound):
                self._unbind(name)
        for name, view in self.inputs:
            a = inputs[name]
            if type(a) is np.ndarray and a.dtype is view.dtype and a.shape == view.shape:
                view[...] = a  # what np.copyto does here, without its ~0.4 us of dispatch
            else:
                np.copyto(view, a)
        poll()
        self._run_all()
        # Outputs are copied out: the arena is reused by the next run.
        if len(self._outs) == 1:  # a dict display: a comprehension costs ~0.3 us more (its frame)
            o, view = self._outs[0]
            return {o: view.copy()}
        return {o: view.copy() for o, view in self._outs}

    def profile(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Counter[str]]:
        """Like ``run``, counting kernel calls by claim name (a separate loop keeps ``run`` lean). A
        fused call counts once for every claim whose work it does (``run_kernels``)."""
        counts: Counter[str] = Counter()
        for name in list(self._bound):
            self._unbind(name)
        for name, view in self.inputs:
            np.copyto(view, inputs[name])
        with np.errstate(all="ignore"):
            for knames, r in zip(self.run_kernels, self.runs):
                r()
                counts.update(knames)
        return {o: self.views[o].copy() for o in self.outputs}, counts


def _skip() -> None:
    """A step whose work a fused run does (dropped before the program runs)."""


#: The NaN guard torch's exporter puts between softmax and the value matmul: where(isnan(p), 0, p).
_GUARD: list[tuple[str, list[str], dict[str, Any]]] = [
    ("not_equal", ["i0", "i0"], {}), ("where", ["t0", "i1", "i0"], {})]


Perm = tuple[int, ...] | None


def guarded_attention_chains(program: Program, views: Mapping[str, np.ndarray]
                             ) -> list[tuple[tuple[int, ...], int, tuple[str, ...], tuple[Perm, ...]]]:
    """``(chain step indices, index of its last step, (q, kt, v, bias, c1, c2, out), perms)`` (c1,
    c2: "" for an unscaled side; ``perms[i]``: operand i is read as ``transpose(operand, perm)``,
    the transposes that made q, kt or v from another step's value being part of the chain, so the
    kernel reads the head split as a strided view instead of a copy) for every [``mul(q, c1)``],
    [``mul(kt, c2)``], ``matmul``,
    ``add(bias)``, ``softmax(-1)``, NaN guard, ``matmul(p, v)`` chain of rank-4 f32/f64 values
    whose intermediates nothing else reads, where
    the fused kernel may run at the last step: no step in between writes the bytes of q, kt, v
    or bias (the planner may reuse a buffer once its last reader, now skipped, has run) and the
    output shares no bytes with them. Exporters spell torch's masked scaled_dot_product_attention
    so; the HIR attention op gives a fully masked row uniform weights where this gives 0."""
    from rlx_core.plugin import decode_fused

    from .hir_kernels import runs_across

    steps = program.kernels
    g = program.graph
    producer = {o: i for i, s in enumerate(steps) for o in s.outputs}
    # Reshapes the planner made aliases (no step of their own): made by their root's producer.
    for a, root in program.plan.aliases.items():
        if a not in producer and root in producer:
            producer[a] = producer[root]
    readers: dict[str, list[int]] = {}
    for i, s in enumerate(steps):
        for v in dict.fromkeys(s.inputs):
            readers.setdefault(v, []).append(i)
    outs = {v for _, v in program.outputs}

    def sole(v: str, i: int) -> int | None:
        """The producing step of ``v`` when step ``i`` is its only reader."""
        j = producer.get(v)
        return j if j is not None and v not in outs and readers.get(v) == [i] else None

    def scalar(name: str) -> float | None:
        if name not in g.weights:
            return None
        a = np.asarray(g.weights[name])
        return float(a.reshape(())) if a.size == 1 else None

    def scaled(j: int | None) -> tuple[str, str] | None:
        """(x, c) of a ``mul(x, c)`` step with a scalar constant c."""
        if j is None or steps[j].op != "mul":
            return None
        a, b = steps[j].inputs
        if scalar(b) is not None:
            return a, b
        return (b, a) if scalar(a) is not None else None

    def untransposed(x: str, reader: int) -> tuple[str, Perm, list[int]]:
        """``(src, perm, steps)``: x is ``transpose(src, perm)`` made by ``steps``, transposes of
        values of the program only ``reader`` (through them) reads; ``(x, None, [])`` if none."""
        perm: Perm = None
        made: list[int] = []
        while (j := sole(x, reader)) is not None and steps[j].op == "transpose":
            src = steps[j].inputs[0]
            p = tuple(int(a) for a in cast("Sequence[int]", steps[j].attrs["perm"]))
            if src not in producer or src in g.weights or len(p) != 4:
                break
            perm = p if perm is None else tuple(p[a] for a in perm)
            made.append(j)
            x, reader = src, j
        return x, perm, made

    found: list[tuple[tuple[int, ...], int, tuple[str, ...], tuple[Perm, ...]]] = []
    for last, pv in enumerate(steps):
        if pv.op != "matmul" or len(pv.inputs) != 2:
            continue
        p, v = pv.inputs
        gi = sole(p, last)
        if gi is None or steps[gi].op != "fused_elementwise":
            continue
        try:
            ops, res = decode_fused(str(steps[gi].attrs["program"]))
        except Exception:
            continue
        if [(n, a, dict(at)) for n, a, at in ops] != _GUARD or res != "t1" or len(steps[gi].inputs) != 2:
            continue
        sm_out, zero = steps[gi].inputs
        if scalar(zero) != 0.0:
            continue
        si = sole(sm_out, gi)
        if si is None or steps[si].op != "softmax":
            continue
        rank = g.types[sm_out].rank
        axis = steps[si].attrs["axis"]
        if not isinstance(axis, int) or axis % max(rank, 1) != rank - 1:
            continue
        ai = sole(steps[si].inputs[0], si)
        if ai is None or steps[ai].op != "add":
            continue
        a0, a1 = steps[ai].inputs
        qi = sole(a0, ai)
        bias = a1
        if qi is None or steps[qi].op != "matmul":
            qi, bias = sole(a1, ai), a0
        if qi is None or steps[qi].op != "matmul":
            continue
        qs, ks = steps[qi].inputs
        if qs == ks:
            continue
        # Either side may be unscaled (LLaMA's keys: the scale went into the RoPE fused step).
        mq, mk = sole(qs, qi), sole(ks, qi)
        sq_, sk_ = scaled(mq), scaled(mk)
        (q, c1), mq = (sq_, mq) if sq_ is not None else ((qs, ""), None)
        (kt, c2), mk = (sk_, mk) if sk_ is not None else ((ks, ""), None)
        out = pv.outputs[0]
        tq, tk, tv, to = g.types[q], g.types[kt], g.types[v], g.types[out]
        dt = tq.dtype
        if (dt.value not in ("f32", "f64") or any(t.dtype != dt for t in (tk, tv, to, g.types[bias]))
                or not tq.rank == tk.rank == tv.rank == to.rank == 4 or g.types[bias].rank > 4):
            continue
        if not all(isinstance(x, int) for t in (tq, tk, tv, to, g.types[bias]) for x in t.shape):
            continue  # static shapes only (a specialised program has them)
        b, h, n_q, d = tq.shape
        if (tk.shape[:3] != (b, h, d) or tv.shape[:3] != (b, h, tk.shape[3]) or d == 0
                or tk.shape[3] == 0 or to.shape != (b, h, n_q, tv.shape[3])):
            continue
        try:
            np.broadcast_shapes(g.types[bias].shape, (b, h, n_q, tk.shape[3]))  # type: ignore[arg-type]
        except ValueError:
            continue
        core = (mq, mk, qi, ai, si, gi, last)
        plain: list[tuple[str, Perm, list[int]]] = [(q, None, []), (kt, None, []), (v, None, [])]
        tries = [plain]
        # Through the transposes that made q, kt and v where their sources live long enough, for
        # the kernel that gathers its items anyway (guarded_across: 32 heads of 8x8 18 against 27
        # us with the copies); the per-item kernel reads strided operands slower than it saves
        # (12 heads of 128x64: 5.2 against 2.4 ms).
        dims = [int(x) for x in (b, h, n_q, tk.shape[3], d, tv.shape[3])]  # static (checked above)
        if runs_across(dims[0] * dims[1], *dims[2:]):
            tries.insert(0, [untransposed(q, qi if mq is None else mq),
                             untransposed(kt, qi if mk is None else mk), untransposed(v, last)])
        for read_as in tries:
            (q_, pq, tq_), (kt_, pk, tk_), (v_, pv_, tv_) = read_as
            chain = tuple(i for i in (*core, *tq_, *tk_, *tv_) if i is not None)
            first = min(chain)
            if any(np.may_share_memory(views[out], views[x]) for x in (q_, kt_, v_, bias)):
                continue
            # Each operand must hold its value from when it is made (or the chain starts) to the end.
            if any(np.may_share_memory(views[o], views[x]) for x in (q_, kt_, v_, bias)
                   for i in range(max(first, producer.get(x, -1) + 1), last) if i not in chain
                   for o in steps[i].outputs):
                continue
            found.append((tuple(sorted(chain)), last, (q_, kt_, v_, bias, c1, c2, out),
                          (pq, pk, pv_, None, None, None, None)))
            break
    return found
