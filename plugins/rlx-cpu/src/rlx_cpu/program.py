"""The CPU executable: one 64-byte-aligned arena, a view per planned value, a bound kernel per step."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

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
        runs = []
        for s in program.kernels:
            runs.append(self._bind(s, factories))
        from .train_fuse import fuse

        # Bind-time fusion (GEMMs on transposed views, momentum in the GEMM, in-place AXPY updates):
        # fewer runs over the same planned buffers; kernel_names follows the runs.
        self.runs, self.kernel_names, self._slots, self.run_kernels = fuse(program, views, runs)
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
        self._bound: set[str] = set()

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
