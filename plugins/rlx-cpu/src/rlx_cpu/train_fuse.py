"""Bind-time kernel fusion for rlx-cpu programs: the patterns a training step is made of.

After :class:`~rlx_cpu.program.CpuProgram` has bound one run per LIR step, :func:`fuse` replaces a
few step patterns by fewer, cheaper runs over the same planned buffers:

* ``matmul(transpose(X), B)`` (2-D, the transpose read only by matmuls): the GEMM reads ``X`` through
  BLAS's transpose flag and the transpose is not materialised (backward's ``dW = dZ^T @ A``);
* ``add(mul(M, c), matmul(A, B))`` (``c`` a scalar constant): one GEMM with ``beta = c`` writing
  ``c * M + A @ B`` straight into the output (momentum ``m = mu * m + g`` in the GEMM that makes
  ``g``: no gradient buffer, no extra passes), and ``add(mul(M, c), reduce_sum(G, axis 0))`` the
  same as a GEMM against a row of ones (the bias gradient);
* ``sub(P, mul(c, N))``: one in-place AXPY ``P += (-c) * N`` (the parameter update).

Every pattern needs its intermediates to be read only inside the pattern and not to be program
outputs. The fused run executes at the position of the pattern's last step, so operands are read
later than before: the fusion is made only when no step in between writes memory that may overlap
them (``np.may_share_memory`` on the planned views). Outputs are written where they always were.
``RLX_CPU_FUSE_BIND=0`` turns it off.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from . import settings, train_blas

Run = Callable[[], Any]
#: at most this many elements, a row-wise op runs as one Numba call (its NumPy passes cost overhead)
SMALL_ROWS = 16384


def pair_min_flops() -> int:
    """Two adjacent independent GEMMs of at least this many flops each run at once, a core each
    (``RLX_CPU_PAIR_MIN_FLOPS``). Off unless set: on the shared 2-core machine it was measured it
    has not helped (the two single-threaded GEMMs did not overlap)."""
    flops: int = settings.PAIR_MIN_FLOPS.get()
    return flops


def enabled() -> bool:
    return bool(settings.FUSE_BIND.get())


class _Fuser:
    def __init__(self, program: Any, views: Mapping[str, np.ndarray], runs: Sequence[Run]) -> None:
        self.steps = list(program.kernels)
        self.views = dict(views)
        self.runs: list[Run | None] = list(runs)
        self.names = [s.kernel for s in self.steps]
        self.keep = {v for _, v in program.outputs}
        g = program.graph
        self.consts: dict[str, float] = {}
        for p in g.params:
            w = np.asarray(g.weights[p.name])
            if w.size == 1 and w.dtype.kind == "f":
                self.consts[p.name] = float(w.reshape(()))
        self.types = g.types
        self.graph_params = list(g.params)
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = defaultdict(list)
        for i, s in enumerate(self.steps):
            for x in s.inputs:
                self.consumers[x].append(i)
            for o in s.outputs:
                self.producer[o] = i
        self.dropped: set[int] = set()
        self.input_names = [v.name for v in program.inputs]
        #: replaced run -> the program values it reads, each with the pointer slots that hold its
        #: address (a BLAS run whose operand may be re-pointed) or None (bound to the planned view)
        self.reads: dict[int, dict[str, list[tuple[list[int], int]] | None]] = {}
        self.writes: dict[int, list[str]] = {}
        #: dropped step -> the step whose run now does its work
        self.owner: dict[int, int] = {}
        #: matmul step -> its operands as BLAS will read them (a transposed view where one was skipped)
        self.operands: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    # -- helpers ------------------------------------------------------------------------------------
    def only_for(self, value: str, users: set[int]) -> bool:
        """``value`` is an intermediate read only by the steps ``users``."""
        return value not in self.keep and value in self.producer and set(self.consumers[value]) <= users

    def clean(self, lo: int, hi: int, arrays: Sequence[np.ndarray], group: set[int]) -> bool:
        """No live step strictly between ``lo`` and ``hi`` outside ``group`` writes over ``arrays``."""
        for k in range(lo + 1, hi):
            if k in group or k in self.dropped:
                continue
            for o in self.steps[k].outputs:
                w = self.views[o]
                if any(np.may_share_memory(w, a) for a in arrays):
                    return False
        return True

    def untouched(self, lo: int, hi: int, arrays: Sequence[np.ndarray], group: set[int]) -> bool:
        """No live step strictly between ``lo`` and ``hi`` outside ``group`` reads or writes memory
        that may overlap ``arrays`` (so they may be written at ``lo`` instead of ``hi``)."""
        for k in range(lo + 1, hi):
            if k in group or k in self.dropped:
                continue
            st = self.steps[k]
            names = list(self.reads[k]) if k in self.reads else list(st.inputs)
            for v in (*names, *st.outputs):
                w = self.views[v]
                if any(np.may_share_memory(w, a) for a in arrays):
                    return False
        return True

    def scalar_mul(self, i: int) -> tuple[str, float] | None:
        """``(tensor input, constant)`` of a ``mul`` by a scalar constant at step ``i``."""
        s = self.steps[i]
        if s.kernel != "cpu.mul" or len(s.inputs) != 2:
            return None
        a, b = s.inputs
        if a in self.consts and b not in self.consts:
            a, b = b, a
        elif not (b in self.consts and a not in self.consts):
            return None
        if self.types[a].shape != self.types[s.outputs[0]].shape:
            return None
        return a, self.consts[b]

    def matmul_operands(self, i: int) -> tuple[np.ndarray, np.ndarray] | None:
        s = self.steps[i]
        if s.kernel != "cpu.matmul":
            return None
        if i in self.operands:
            return self.operands[i]
        a, b = (self.views[x] for x in s.inputs)
        if a.ndim != 2 or b.ndim != 2:
            return None
        return a, b

    def replace(self, at: int, run: Run, name: str, drop: Sequence[int],
                slots: Mapping[str, list[tuple[list[int], int]]] | None = None) -> None:
        group = {at, *drop}
        made = {o for k in group for o in self.steps[k].outputs}
        reads: dict[str, list[tuple[list[int], int]] | None] = {}
        for k in sorted(group):
            for src in self.reads.get(k, {x: None for x in self.steps[k].inputs}):
                if src not in made:
                    reads[src] = None
        for src, sl in (slots or {}).items():
            if src in reads:
                reads[src] = list(sl)
        self.reads[at] = reads
        self.writes[at] = [o for k in group for o in self.steps[k].outputs
                           if o in self.keep or not set(self.consumers[o]) <= group]
        self.runs[at] = run
        self.names[at] = name
        for d in drop:
            self.dropped.add(d)
            self.owner[d] = at
            self.runs[d] = None

    def gemm_slots(self, run: Run, a: np.ndarray, b: np.ndarray) -> dict[str, list[tuple[list[int], int]]]:
        """Program inputs that BLAS run ``run`` reads as operand ``a``/``b`` through its pointers."""
        out: dict[str, list[tuple[list[int], int]]] = {}
        ptrs = getattr(run, "ptrs", None)
        if ptrs is None:
            return out
        for arr in (a, b):
            for name in self.input_names:
                v = self.views[name]
                same = arr.shape == v.shape and arr.strides == v.strides
                flipped = arr.shape == v.shape[::-1] and arr.strides == v.strides[::-1]
                if v.ndim == 2 and arr.ctypes.data == v.ctypes.data and (same or flipped):
                    for idx in (0, 1):  # the run may have swapped the operands (a column-major output)
                        if ptrs[idx] == v.ctypes.data and (ptrs, idx) not in out.get(name, []):
                            out.setdefault(name, []).append((ptrs, idx))
        return out

    def patchable(self) -> dict[str, list[tuple[list[int], int]]]:
        """Inputs read only through BLAS pointers: they can be bound to caller arrays, no copy."""
        out: dict[str, list[tuple[list[int], int]]] = {}
        for name in self.input_names:
            slots: list[tuple[list[int], int]] = []
            ok = True
            for k in range(len(self.steps)):
                if k in self.dropped:
                    continue
                reads = self.reads.get(k)
                if reads is None:
                    ok = name not in self.steps[k].inputs
                elif name in reads:
                    sl = reads[name]
                    ok = sl is not None
                    slots += sl or []
                if not ok:
                    break
            if ok and slots:
                out[name] = slots
        return out

    # -- patterns -----------------------------------------------------------------------------------
    def transposes(self) -> None:
        for t, s in enumerate(self.steps):
            if s.kernel != "cpu.transpose" or self.views[s.inputs[0]].ndim != 2:
                continue
            perm = s.attrs["perm"]
            if perm is not None and tuple(perm) != (1, 0):  # type: ignore[arg-type]
                continue
            out = s.outputs[0]
            users = self.consumers[out]
            if out in self.keep or not users:
                continue
            x = self.views[s.inputs[0]]
            if any(self.steps[j].kernel != "cpu.matmul" or self.matmul_operands(j) is None for j in users):
                continue
            if not all(self.clean(t, j, [x], {t, j}) for j in users):
                continue
            if any(np.may_share_memory(self.views[self.steps[j].outputs[0]], x) for j in users):
                continue  # the GEMM would read X while writing over it
            for j in set(users):
                st = self.steps[j]
                # Both operands may be transposes: keep what an earlier pass put in place.
                cur = self.matmul_operands(j)
                assert cur is not None
                a, b = (x.T if v == out else c for v, c in zip(st.inputs, cur))
                o = self.views[st.outputs[0]]
                self.operands[j] = (a, b)
                before = self.reads.get(j, {v: None for v in st.inputs})
                self.reads[j] = {v: None for v in before if v != out} | {s.inputs[0]: None}
                self.runs[j] = (lambda a=a, b=b, o=o: np.matmul(a, b, out=o))
                self.names[j] = "cpu.matmul_t"
            self.dropped.add(t)
            self.owner[t] = min(users)
            self.runs[t] = None

    def _accumulator(self, i: int, at: int) -> tuple[np.ndarray, np.ndarray, float, list[int]] | None:
        """For the input produced at step ``i``: GEMM operands ``(a, b)``, alpha, and the steps the
        value needs, when it is a 2-D matmul or a column sum of a 2-D tensor."""
        ops = self.matmul_operands(i)
        if ops is not None:
            return ops[0], ops[1], 1.0, [i]
        s = self.steps[i]
        if s.kernel == "cpu.reduce_sum" and len(s.inputs) == 1:
            g = self.views[s.inputs[0]]
            axes = s.attrs["axes"]
            if g.ndim == 2 and axes is not None and tuple(axes) in ((0,), (-2,)) \
                    and not s.attrs["keepdims"]:  # type: ignore[arg-type]
                ones = np.ones((1, g.shape[0]), g.dtype)
                return ones, g, 1.0, [i]
        return None

    def gemm_accumulate(self) -> None:
        for i, s in enumerate(self.steps):
            if s.kernel != "cpu.add" or len(s.inputs) != 2 or i in self.dropped:
                continue
            u, v = s.inputs
            if u == v or u not in self.producer or v not in self.producer:
                continue
            o = self.views[s.outputs[0]]
            if o.ndim not in (1, 2) or not (self.types[u].shape == self.types[v].shape == o.shape):
                continue
            for acc_v, mul_v in ((u, v), (v, u)):
                pa, pm = self.producer[acc_v], self.producer[mul_v]
                if pa in self.dropped or pm in self.dropped:
                    continue
                sm = self.scalar_mul(pm)
                acc = self._accumulator(pa, i)
                if sm is None or acc is None:
                    continue
                if not (self.only_for(acc_v, {i}) and self.only_for(mul_v, {i})):
                    continue
                m_name, beta = sm
                a, b, alpha, acc_steps = acc
                m = self.views[m_name]
                group = {i, pm, *acc_steps}
                at = i  # run where the add was: operands read later than before
                if not (self.clean(pa, i, [a, b], group) and self.clean(pm, i, [m], group)):
                    # or where the product was: the output written earlier, M read elsewhere
                    pmm = self.producer.get(m_name, -1)
                    if pmm >= pa or pmm in self.dropped or not self.untouched(pa, i, [o], group):
                        continue
                    if not self.clean(min(pa, pm), max(pa, pm), [m], group):
                        continue
                    at = pa
                o2 = o.reshape(1, -1) if o.ndim == 1 else o
                if a.shape[0] != o2.shape[0] or b.shape[1] != o2.shape[1]:
                    continue
                gemm = train_blas.gemm_call(a, b, o2, alpha, beta)
                if gemm is None:
                    continue
                same = m.ctypes.data == o.ctypes.data and m.strides == o.strides and m.shape == o.shape
                if same:
                    run = gemm
                elif not np.may_share_memory(m, o) and m.shape == o.shape:
                    def run(m: np.ndarray = m, o: np.ndarray = o, gemm: Run = gemm) -> None:
                        np.copyto(o, m)
                        gemm()
                else:
                    continue
                drop = [k for k in group if k != at]
                self.replace(at, run, "cpu.gemm_accumulate", drop, self.gemm_slots(gemm, a, b))
                break

    def axpy_updates(self) -> None:
        for i, s in enumerate(self.steps):
            if s.kernel != "cpu.sub" or len(s.inputs) != 2 or i in self.dropped:
                continue
            p_name, q = s.inputs
            if q not in self.producer or p_name == q:
                continue
            pm = self.producer[q]
            if pm in self.dropped:
                continue
            sm = self.scalar_mul(pm)
            if sm is None or not self.only_for(q, {i}):
                continue
            n_name, c = sm
            p, n, o = self.views[p_name], self.views[n_name], self.views[s.outputs[0]]
            if not (p.shape == n.shape == o.shape) or np.may_share_memory(n, o):
                continue
            if not self.clean(pm, i, [n], {i, pm}):
                continue
            axpy = train_blas.axpy_call(n, o, -c)
            if axpy is None:
                continue
            if p.ctypes.data == o.ctypes.data and p.strides == o.strides:
                run = axpy
            elif not np.may_share_memory(p, o):
                def run(p: np.ndarray = p, o: np.ndarray = o, axpy: Run = axpy) -> None:
                    np.copyto(o, p)
                    axpy()
            else:
                continue
            self.replace(i, run, "cpu.axpy", [pm])

    def blas_linears(self) -> None:
        """``linear(X, W, b)`` on a 2-D program input ``X`` with a weight that is not a constant,
        or with a column-major weight (a training step, whose other GEMMs run here too): the bias
        copied into the output and one GEMM with ``beta = 1`` on ``W``'s transposed view. ``X`` is
        then read only through a BLAS pointer (and can be bound to the caller's array), and every
        GEMM of the step runs on the same BLAS threads: a second set of threads splitting the other
        linears would fight them for cores."""
        for i, s in enumerate(self.steps):
            if s.kernel != "cpu.linear" or i in self.dropped:
                continue
            x, w, b = (self.views[v] for v in s.inputs)
            # A constant (read-only) weight is an inference program's: its linear stays on the row
            # pool with rlx-cpu's single-threaded GEMMs, since NumPy's BLAS threads would then
            # fight the pool's for the cores (MLP at batch 256 with a busy core: 50 vs 8 ms).
            if not ((s.inputs[0] in self.input_names and w.flags.writeable)
                    or (w.ndim == 2 and w.flags.f_contiguous and not w.flags.c_contiguous)):
                continue
            o = self.views[s.outputs[0]]
            if x.ndim != 2 or w.ndim != 2 or b.shape != (o.shape[-1],) or np.may_share_memory(o, b):
                continue
            gemm = train_blas.gemm_call(x, w.T, o, 1.0, 1.0)
            if gemm is None:
                continue

            def run(o: np.ndarray = o, b: np.ndarray = b, gemm: Run = gemm) -> None:
                np.copyto(o, b)
                gemm()
            self.replace(i, run, "cpu.linear_blas", [], self.gemm_slots(gemm, x, w.T))

    def linear_relus(self, rows: object) -> None:
        """``maximum(linear(X, W, b), 0)`` after :meth:`blas_linears`, the linear read by nothing
        else: one GEMM, then bias and ReLU in one Numba pass over the output (instead of a bias
        copy, the GEMM and a maximum pass)."""
        for i, s in enumerate(self.steps):
            if s.kernel != "cpu.maximum" or i in self.dropped or len(s.inputs) != 2:
                continue
            l_name, z = s.inputs
            if self.consts.get(z, 1.0) != 0.0:
                l_name, z = z, l_name
            if self.consts.get(z, 1.0) != 0.0:
                continue
            pl = self.producer.get(l_name)
            if pl is None or pl in self.dropped or self.names[pl] != "cpu.linear_blas" \
                    or not self.only_for(l_name, {i}):
                continue
            x, w, b = (self.views[v] for v in self.steps[pl].inputs)
            o = self.views[s.outputs[0]]
            if o.dtype not in _NB_FLOATS or not o.flags.c_contiguous or b.shape != (o.shape[1],) \
                    or np.may_share_memory(o, b):
                continue
            if not self.clean(pl, i, [x, w, b], {pl, i}):
                continue
            gemm = train_blas.gemm_call(x, w.T, o, 1.0, 0.0)
            if gemm is None:
                continue
            k = rows.bias_relu  # type: ignore[attr-defined]

            def run(gemm: Run = gemm, k: Any = k, o: np.ndarray = o, b: np.ndarray = b) -> None:
                gemm()
                k(o, b)
            self.replace(i, run, "cpu.linear_relu", [pl], self.gemm_slots(gemm, x, w.T))

    # -- small chains as one Numba call ------------------------------------------------------------
    def _same(self, a: np.ndarray, b: np.ndarray) -> bool:
        return a.ctypes.data == b.ctypes.data and a.strides == b.strides and a.shape == b.shape

    def _out_ok(self, o: np.ndarray, ins: Sequence[np.ndarray]) -> bool:
        """``o`` is C-contiguous and each input is either exactly ``o`` or apart from it."""
        return o.flags.c_contiguous and all(self._same(o, x) or not np.may_share_memory(o, x) for x in ins)

    def _last_axis(self, i: int, keepdims: bool) -> np.ndarray | None:
        """The 2-D input of a ``reduce_sum`` over its last axis at step ``i``."""
        s = self.steps[i]
        if s.kernel != "cpu.reduce_sum" or bool(s.attrs["keepdims"]) != keepdims:
            return None
        x = self.views[s.inputs[0]]
        axes = s.attrs["axes"]
        if x.ndim != 2 or axes is None or tuple(a % 2 for a in axes) != (1,):  # type: ignore[union-attr]
            return None
        return x

    def log_softmax_backward(self, rows: object) -> None:
        """``sub(G, mul(exp(Y), reduce_sum(G, last axis, keepdims)))``: log_softmax's VJP."""
        for i, s in enumerate(self.steps):
            if s.kernel != "cpu.sub" or i in self.dropped:
                continue
            g_name, p_name = s.inputs
            pm = self.producer.get(p_name)
            if pm is None or pm in self.dropped or self.steps[pm].kernel != "cpu.mul":
                continue
            if not self.only_for(p_name, {i}):
                continue
            e_name, r_name = self.steps[pm].inputs
            pe, pr = self.producer.get(e_name), self.producer.get(r_name)
            if pe is None or pr is None:
                continue
            if self.steps[pe].kernel != "cpu.exp":
                pe, pr, e_name, r_name = pr, pe, r_name, e_name
            if self.steps[pe].kernel != "cpu.exp" or pe in self.dropped or pr in self.dropped:
                continue
            gx = self._last_axis(pr, True)
            if gx is None or self.steps[pr].inputs[0] != g_name:
                continue
            if not (self.only_for(e_name, {pm}) and self.only_for(r_name, {pm})):
                continue
            y, g, o = self.views[self.steps[pe].inputs[0]], self.views[g_name], self.views[s.outputs[0]]
            if not (y.shape == g.shape == o.shape) or o.dtype not in (np.float32, np.float64) \
                    or y.dtype != o.dtype or g.dtype != o.dtype:
                continue
            if not self._out_ok(o, [y, g]):
                continue
            group = {i, pm, pe, pr}
            if not (self.clean(pe, i, [y], group) and self.clean(pr, i, [g], group)):
                continue
            k = rows.log_softmax_backward  # type: ignore[attr-defined]
            self.replace(i, (lambda k=k, g=g, y=y, o=o: k(g, y, o)), "cpu.log_softmax_backward",
                         [pm, pe, pr])

    def neg_mean_rowdot(self, rows: object) -> None:
        """``reduce_mean(neg(reduce_sum(mul(A, B), last axis)))`` to a scalar: a cross-entropy."""
        for i, s in enumerate(self.steps):
            if s.kernel != "cpu.reduce_mean" or i in self.dropped:
                continue
            o = self.views[s.outputs[0]]
            if o.size != 1 or not o.flags.c_contiguous:
                continue
            pn = self.producer.get(s.inputs[0])
            if pn is None or self.steps[pn].kernel != "cpu.neg" or not self.only_for(s.inputs[0], {i}):
                continue
            r_name = self.steps[pn].inputs[0]
            pr = self.producer.get(r_name)
            if pr is None or self._last_axis(pr, False) is None or not self.only_for(r_name, {pn}):
                continue
            m_name = self.steps[pr].inputs[0]
            pm = self.producer.get(m_name)
            if pm is None or self.steps[pm].kernel != "cpu.mul" or not self.only_for(m_name, {pr}):
                continue
            if len({pn, pr, pm} & self.dropped):
                continue
            a, b = (self.views[x] for x in self.steps[pm].inputs)
            if a.shape != b.shape or a.ndim != 2 or a.dtype != b.dtype \
                    or a.dtype not in (np.float32, np.float64):
                continue
            group = {i, pn, pr, pm}
            if not self.clean(pm, i, [a, b], group):
                continue
            k = rows.neg_mean_rowdot  # type: ignore[attr-defined]
            flat = o.reshape(1)
            self.replace(i, (lambda k=k, a=a, b=b, flat=flat: k(a, b, flat)), "cpu.neg_mean_rowdot",
                         [pn, pr, pm])

    def one_hot(self, rows: object) -> None:
        """``cast(equal(L, iota))`` with ``L`` (B, 1) integers and ``iota`` (1, C) along axis 1."""
        for i, s in enumerate(self.steps):
            if s.kernel != "cpu.cast" or i in self.dropped:
                continue
            o = self.views[s.outputs[0]]
            pq = self.producer.get(s.inputs[0])
            if pq is None or pq in self.dropped or self.steps[pq].kernel != "cpu.equal" or o.ndim != 2 \
                    or not self.only_for(s.inputs[0], {i}) or not o.flags.c_contiguous:
                continue
            if o.dtype not in (np.float32, np.float64) and o.dtype.kind not in "iu":
                continue  # Numba has no float16/bfloat16
            lab_name, io_name = self.steps[pq].inputs
            pl = self.producer.get(lab_name)
            if pl is not None and self.steps[pl].kernel == "cpu.iota":
                lab_name, io_name = io_name, lab_name
            pi = self.producer.get(io_name)
            if pi is None or pi in self.dropped or self.steps[pi].kernel != "cpu.iota" \
                    or not self.only_for(io_name, {pq}):
                continue
            lab, io = self.views[lab_name], self.views[io_name]
            b, c = o.shape
            if lab.shape != (b, 1) or io.shape != (1, c) or lab.dtype.kind not in "iu":
                continue
            run_iota = self.runs[pi]
            if run_iota is None:
                continue
            run_iota()  # no inputs: check what it computes once, here
            if not np.array_equal(io.reshape(-1), np.arange(c)):
                continue
            if not self.clean(pq, i, [lab], {i, pq, pi}):
                continue
            k = rows.one_hot  # type: ignore[attr-defined]
            flat = lab.reshape(b)
            if np.may_share_memory(flat, o):  # the output is planned over the labels: read them first
                scratch = np.empty(b, flat.dtype)

                def run(k: Any = k, flat: np.ndarray = flat, scratch: np.ndarray = scratch,
                        o: np.ndarray = o) -> None:
                    np.copyto(scratch, flat)
                    k(scratch, o)
            else:
                def run(k: Any = k, flat: np.ndarray = flat, o: np.ndarray = o) -> None:
                    k(flat, o)
            self.replace(i, run, "cpu.one_hot", [pq, pi])

    def small_log_softmax(self, rows: object) -> None:
        """A log_softmax over the last axis of a small 2-D tensor (a classifier's logits): one Numba
        call instead of six NumPy calls whose cost is their overhead."""
        for i, s in enumerate(self.steps):
            if s.kernel != "cpu.log_softmax" or i in self.dropped:
                continue
            x, o = self.views[s.inputs[0]], self.views[s.outputs[0]]
            ax = int(s.attrs["axis"])  # type: ignore[arg-type]
            if x.ndim != 2 or ax % 2 != 1 or x.size > SMALL_ROWS or x.shape != o.shape \
                    or x.dtype not in (np.float32, np.float64) or o.dtype != x.dtype:
                continue
            if not self._out_ok(o, [x]):
                continue
            k = rows.log_softmax  # type: ignore[attr-defined]
            self.runs[i] = (lambda k=k, x=x, o=o: k(x, o))
            self.names[i] = "cpu.log_softmax_rows"

    def relu_backward(self, rows: object) -> None:
        """``where(greater(X, 0), V, 0)`` (ReLU's VJP) in one pass."""
        for i, s in enumerate(self.steps):
            if s.kernel != "cpu.where" or i in self.dropped:
                continue
            c_name, v_name, z_name = s.inputs
            if self.consts.get(z_name, 1.0) != 0.0:
                continue
            pg = self.producer.get(c_name)
            if pg is None or pg in self.dropped or self.steps[pg].kernel != "cpu.greater" \
                    or not self.only_for(c_name, {i}):
                continue
            x_name, zero = self.steps[pg].inputs
            if self.consts.get(zero, 1.0) != 0.0:
                continue
            x, v, o = self.views[x_name], self.views[v_name], self.views[s.outputs[0]]
            if not (x.shape == v.shape == o.shape) or o.dtype != v.dtype or o.dtype not in _NB_FLOATS \
                    or x.dtype not in _NB_FLOATS or not (x.flags.c_contiguous and v.flags.c_contiguous):
                continue
            if not self._out_ok(o, [x, v]) or not self.clean(pg, i, [x], {i, pg}):
                continue
            k = rows.relu_backward  # type: ignore[attr-defined]
            xf, vf, of = x.reshape(-1), v.reshape(-1), o.reshape(-1)
            self.replace(i, (lambda k=k, xf=xf, vf=vf, of=of: k(xf, vf, of)), "cpu.relu_backward", [pg])

    def _flops(self, k: int) -> int:
        run, s = self.runs[k], self.steps[k]
        if self.names[k] in ("cpu.gemm_accumulate", "cpu.linear_blas"):
            return int(getattr(run, "flops", 0))
        if self.names[k] in ("cpu.matmul", "cpu.matmul_t"):
            a, b = (self.types[x].shape for x in s.inputs)
            if len(a) == 2 and len(b) == 2:
                return 2 * int(a[0]) * int(a[1]) * int(b[1])
        return 0

    def pairs(self) -> None:
        """Two adjacent, independent GEMMs of at least :func:`pair_min_flops` each (a layer's dX and dW)
        run at once, one BLAS thread each (:func:`rlx_cpu.train_blas.pair_call`)."""
        live = [k for k in range(len(self.steps)) if k not in self.dropped]
        least = pair_min_flops()
        k = 0
        while k + 1 < len(live):
            a, b = live[k], live[k + 1]
            if min(self._flops(a), self._flops(b)) < least or not self._independent(a, b):
                k += 1
                continue
            run = train_blas.pair_call(self.runs[a], self.runs[b])
            if run is None:
                return
            reads: dict[str, list[tuple[list[int], int]] | None] = {}
            for k2 in (a, b):
                for x, sl in (self.reads.get(k2) or {x: None for x in self.steps[k2].inputs}).items():
                    if sl is None or (x in reads and reads[x] is None):
                        reads[x] = None
                    else:
                        reads[x] = [*(reads.get(x) or []), *sl]
            self.reads[a] = reads
            self.writes[a] = self.writes.get(a, list(self.steps[a].outputs)) + self.writes.get(
                b, list(self.steps[b].outputs))
            self.runs[a] = run
            self.names[a] = "cpu.gemm_pair"
            self.dropped.add(b)
            self.owner[b] = a
            self.runs[b] = None
            k += 2

    def _independent(self, a: int, b: int) -> bool:
        ra = list(self.reads[a]) if a in self.reads else list(self.steps[a].inputs)
        rb = list(self.reads[b]) if b in self.reads else list(self.steps[b].inputs)
        wa = self.writes.get(a, list(self.steps[a].outputs))
        wb = self.writes.get(b, list(self.steps[b].outputs))
        for w in wa:
            if any(np.may_share_memory(self.views[w], self.views[x]) for x in (*rb, *wb)):
                return False
        for w in wb:
            if any(np.may_share_memory(self.views[w], self.views[x]) for x in ra):
                return False
        return True

    def result(self) -> tuple[tuple[Run, ...], tuple[str, ...], tuple[tuple[str, ...], ...]]:
        """Live runs, their names, and for each the kernel claims of the LIR steps whose work it
        does (its own, those fused into it, and no-op steps before it)."""
        for k, s in enumerate(self.steps):  # a reshape planned in place moves nothing: no call at all
            if s.kernel == "cpu.reshape" and k not in self.dropped and k not in self.reads:
                x, o = self.views[s.inputs[0]], self.views[s.outputs[0]]
                if x.ctypes.data == o.ctypes.data and x.size == o.size and (
                        (x.flags.c_contiguous and o.flags.c_contiguous)
                        or (x.shape == o.shape and x.strides == o.strides)):
                    self.dropped.add(k)
        keep = [k for k in range(len(self.steps)) if k not in self.dropped]
        if not keep and self.steps:
            # Only no-op steps (a lone reshape of an input, planned in place): one empty call, so that
            # profile() still counts their kernels as the dispatch report says they ran.
            return (lambda: None,), (self.names[0],), (tuple(s.kernel for s in self.steps),)
        covers: dict[int, list[str]] = {k: [] for k in keep}
        for k, s in enumerate(self.steps):
            j = k
            while j in self.owner:
                j = self.owner[j]
            if j not in covers:  # a no-op: counted with the next call
                j = next((q for q in keep if q > k), keep[-1] if keep else -1)
            if j in covers:
                covers[j].append(s.kernel)
        return (tuple(self.runs[k] for k in keep), tuple(self.names[k] for k in keep),  # type: ignore[misc]
                tuple(tuple(covers[k]) for k in keep))


#: kernels that compute the same values whatever the (2-D) strides of their operands
_LAYOUT_FREE = frozenset({"cpu.add", "cpu.sub", "cpu.mul", "cpu.neg", "cpu.reshape", "cpu.matmul",
                          "cpu.linear", "cpu.transpose"})
_ELEMENTWISE = frozenset({"cpu.add", "cpu.sub", "cpu.mul", "cpu.neg", "cpu.reshape"})


def transposed_layout(program: Any) -> set[str]:
    """Values to store column-major (their planned bytes hold the transpose; the view is an
    F-ordered ``(out, in)`` array, so callers see the usual shape and values).

    A linear's weight ``W`` (out, in) read row-major makes every forward GEMM ``x @ W^T`` a
    transposed-B product, which OpenBLAS runs ~10% slower here than ``x @ Wt`` with ``Wt``
    contiguous, and its gradient ``dZ^T @ X`` lands in the slower of the two output layouts.
    Stored column-major, both GEMMs take the fast form and nothing is ever transposed: the choice
    spreads to every same-shape value joined to a weight program input by elementwise ops (its
    gradient, momentum, updates), and is made only when every kernel touching those values
    computes by index whatever the strides (``_LAYOUT_FREE``). ``RLX_CPU_WEIGHT_LAYOUT=0`` keeps
    everything row-major."""
    if not settings.WEIGHT_LAYOUT.get():
        return set()
    g = program.graph
    steps = list(program.kernels)
    inputs = {v.name for v in program.inputs}
    seeds = {s.inputs[1] for s in steps if s.kernel == "cpu.linear" and len(s.inputs) >= 2
             and s.inputs[1] in inputs and len(g.types[s.inputs[1]].shape) == 2}
    if not seeds:
        return set()
    parent: dict[str, str] = {}

    def find(v: str) -> str:
        while parent.get(v, v) != v:
            v = parent[v]
        return v

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb

    for s in steps:
        if s.kernel not in _ELEMENTWISE or len(s.outputs) != 1:
            continue
        shape = g.types[s.outputs[0]].shape
        if len(shape) != 2:
            continue
        for x in s.inputs:
            if g.types[x].shape == shape:
                union(x, s.outputs[0])
    comps: dict[str, set[str]] = {}
    for v in g.types:
        if len(g.types[v].shape) == 2:
            comps.setdefault(find(v), set()).add(v)
    out: set[str] = set()
    for root in {find(w) for w in seeds}:
        comp = comps.get(root, set())
        shape = g.types[root].shape
        if any(g.types[v].shape != shape or not g.types[v].dtype.is_float for v in comp) \
                or shape[0] == shape[1] == 1:
            continue
        ok = True
        for s in steps:
            touched = [v for v in (*s.inputs, *s.outputs) if v in comp]
            if not touched:
                continue
            if s.kernel not in _LAYOUT_FREE or (s.kernel == "cpu.linear" and (
                    s.inputs[0] in comp or (s.inputs[2:3] and s.inputs[2] in comp) or s.outputs[0] in comp)):
                ok = False
                break
            if s.kernel == "cpu.reshape" and g.types[s.inputs[0]].shape != g.types[s.outputs[0]].shape:
                ok = False
                break
        if ok:
            out |= comp
    return out


def fuse(program: Any, views: Mapping[str, np.ndarray], runs: Sequence[Run]
         ) -> tuple[tuple[Run, ...], tuple[str, ...], dict[str, list[tuple[list[int], int]]],
                    tuple[tuple[str, ...], ...]]:
    """The runs (and their kernel names) of ``program`` after bind-time fusion, the inputs that are
    read only through re-pointable BLAS operands (input -> pointer slots), and for each run the
    kernel claims whose work it does (what ``profile`` counts). Steps computing from constants only
    are not here: the core folds them before dispatch (:mod:`rlx_core.fold`)."""
    f = _Fuser(program, views, runs)
    if not enabled() or not any(s.kernel in _STARTS for s in f.steps):
        r, n, c = f.result()
        return r, n, {}, c
    f.transposes()
    if train_blas.available():
        f.gemm_accumulate()
        f.axpy_updates()
        f.blas_linears()
    rows = _LazyRows()
    if train_blas.available():
        f.linear_relus(rows)
    f.log_softmax_backward(rows)
    f.neg_mean_rowdot(rows)
    f.one_hot(rows)
    f.relu_backward(rows)
    f.small_log_softmax(rows)
    slots = f.patchable()  # before pairing: a paired run keeps its parts' pointer slots
    f.pairs()
    r, n, c = f.result()
    return r, n, slots, c


class _LazyRows:
    """:mod:`rlx_cpu.train_rows` (and so Numba) imported only when a pattern matched."""

    def __getattr__(self, name: str) -> Any:
        from . import train_rows

        return getattr(train_rows, name)


_NB_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

#: kernels that end some pattern: without one, there is nothing to fuse
_STARTS = frozenset({"cpu.transpose", "cpu.add", "cpu.sub", "cpu.reduce_mean", "cpu.where", "cpu.cast",
                     "cpu.log_softmax", "cpu.linear"})


__all__ = ["enabled", "fuse"]
