"""The CUDA executable: one device arena, a view per planned value, a bound kernel per step.

* **Memory**: one allocation of ``plan.arena_bytes`` from CuPy's memory pool; every value is a view
  at its planned offset (values with disjoint lifetimes share bytes, in-place steps alias). Weights
  are uploaded once, here; attention steps share one scratch workspace.
* **Reshape copies**: a reshape's copy is dropped when the step before can write, or the step
  after can read, the other buffer directly (:meth:`CudaProgram._elide_reshape_copies`).
* **Weight-only steps**: elementwise steps that read only weights (e.g. scalar constants cast
  f16 -> f32) run once when the program is built, not on every run
  (:meth:`CudaProgram._fold_weight_steps`, ``RLX_CUDA_FOLD_WEIGHTS``).
* **Head transposes**: where the fused f16/bf16 attention reads q/k/v, the head split's
  transpose is dropped and the attention reads (B, S, H, D) in place (:mod:`rlx_cuda.heads`).
* **Transfers**: the LIR's ``Transfer`` steps: inputs are uploaded and outputs downloaded per run.
* **CUDA graphs**: the first run is eager (it also warms NVRTC and cuBLAS); the second captures the
  kernel sequence on the program's stream into a CUDA graph, and every run from then on replays it
  (shapes are static per compiled program). Temporaries CuPy allocates while capturing come from a
  private pool kept alive with the graph. ``RLX_CUDA_GRAPHS=0`` keeps every run eager; a capture
  that fails falls back to eager runs and records why in ``graph_error``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import cupy as cp
import numpy as np

from rlx_core.plugin import DType, Program, Step, Transfer

from . import kernels as kern

#: Largest result of a step folded at bind time (:meth:`CudaProgram._fold_weight_steps`).
FOLD_MAX_BYTES = 1 << 20


def graphs_enabled() -> bool:
    from .settings import GRAPHS

    return bool(GRAPHS.get())


class CudaProgram:
    def __init__(self, program: Program, device_index: int) -> None:
        self.program = program
        self.device = cp.cuda.Device(device_index)
        g = program.graph
        plan = program.plan
        with self.device:
            self.stream = cp.cuda.Stream(non_blocking=True)
            self.sm_count = int(self.device.attributes["MultiProcessorCount"])
            self.arena = cp.cuda.alloc(max(plan.arena_bytes, 1))
            views: dict[str, Any] = {}
            for name, off in plan.offsets.items():
                t = g.types[name]
                views[name] = cp.ndarray(tuple(t.shape), kern.storage_dtype(t.dtype), memptr=self.arena + off)
            for p in g.params:  # weights: uploaded once
                views[p.name] = cp.asarray(_to_storage(np.asarray(g.weights[p.name]), p.type.dtype))
            self.views = views
            ws = max((kern.workspace_bytes(s.op, [g.types[i] for i in s.inputs], s.attrs)
                      for s in program.kernels), default=0)
            self.workspace = cp.cuda.alloc(ws) if ws else None
            self.uploads = [(t.value, views[t.value], g.types[t.value].dtype) for t in program.steps
                            if isinstance(t, Transfer) and t.src == "host"]
            self.downloads = [(t.value, views[t.value], g.types[t.value].dtype) for t in program.steps
                              if isinstance(t, Transfer) and t.dst == "host"]
            factories = kern.factories()
            steps = program.kernels
            ins = [[views[i] for i in st.inputs] for st in steps]
            outs = [[views[o] for o in st.outputs] for st in steps]
            self.elided = self._elide_reshape_copies(steps, ins, outs)
            self.dropped, layouts = self._absorb_head_transposes(steps, ins, outs)
            with self.stream:
                self.folded = self._fold_weight_steps(steps, ins, outs, factories)
                self.fused_adds, add_ln = self._fuse_add_layer_norm(steps, ins, outs)
                skip = self.elided | self.dropped | self.folded | self.fused_adds
                self.runs = tuple(kern._noop if k in skip else
                                  add_ln[k] if k in add_ln else
                                  self._bind(st, ins[k], outs[k], factories, layouts.get(k))
                                  for k, st in enumerate(steps))
            self.stream.synchronize()
        self.kernel_names = tuple(s.kernel for s in program.kernels)
        # A run that synchronises with the host (linalg solvers: convergence tests) cannot be captured.
        self.use_graph = graphs_enabled() and not any(getattr(r, "host_sync", False) for r in self.runs)
        self.graph: Any = None
        self.graph_error = ""
        self._graph_pool: Any = None
        self._eager_runs = 0

    def cublas_workspace(self) -> Any:
        """This program's cuBLAS workspace (allocated on the first GEMM bound)."""
        if getattr(self, "_cublas_ws", None) is None:
            self._cublas_ws = cp.cuda.alloc(kern.CUBLAS_WORKSPACE)
        return self._cublas_ws

    def _bind(self, s: Step, ins: list[Any], outs: list[Any], factories: Mapping[str, Any],
              layout: dict[str, tuple[Any, int, int, int]] | None = None) -> Any:
        g = self.program.graph
        b = kern.Bound(ins, outs, [g.types[i] for i in s.inputs], [g.types[o] for o in s.outputs], s.attrs,
                       self, layout)
        return factories[s.kernel](b)

    def _fold_weight_steps(self, steps: tuple[Step, ...], ins: list[list[Any]], outs: list[list[Any]],
                           factories: Mapping[str, Any]) -> set[int]:
        """Run once, here, the elementwise steps whose inputs are all weights (or folded values).

        Weights are uploaded once and no step writes them, so such a step gives the same bytes on
        every run: in MiniLM f16 these are the scalar constants each GELU casts f16 -> f32 (18 of
        its 25 cast launches per run). The result moves to a buffer of its own (its arena bytes
        are shared over time with other values) that the later readers take instead. Only small
        results (:data:`FOLD_MAX_BYTES`: a folded value costs memory for the program's life), one
        output, not downloaded, and read only by steps that keep their planned input view (not a
        reshape, not an elided or dropped step). ``RLX_CUDA_FOLD_WEIGHTS=0`` keeps them per run.
        Returns the folded steps (their runs become no-ops)."""
        from .plugin import ELEMENTWISE
        from .settings import FOLD_WEIGHTS

        if not FOLD_WEIGHTS.get():
            return set()
        g = self.program.graph
        const = {p.name for p in g.params}
        ew = {f"cuda.{op}" for op in ELEMENTWISE} | {"cuda.fused_elementwise"}
        keep = {v for _, v in self.program.outputs} | {name for name, _, _ in self.downloads}
        readers: dict[str, list[tuple[int, int]]] = {}
        for j, st in enumerate(steps):
            for i, v in enumerate(st.inputs):
                readers.setdefault(v, []).append((j, i))
        skip = self.elided | self.dropped
        folded: set[int] = set()
        for k, st in enumerate(steps):
            if (st.kernel not in ew or k in skip or not st.inputs or len(st.outputs) != 1
                    or not all(v in const for v in st.inputs)):
                continue
            out = st.outputs[0]
            view = self.views.get(out)
            rd = readers.get(out, [])
            if (out in keep or out in const or view is None or outs[k][0] is not view
                    or int(view.nbytes) > FOLD_MAX_BYTES
                    or any(steps[j].kernel == "cuda.reshape" or j in skip or j <= k or ins[j][i] is not view
                           for j, i in rd)):
                continue
            if not folded:  # weights were uploaded on another stream: let those copies land first
                cp.cuda.runtime.deviceSynchronize()
            buf = cp.empty(view.shape, view.dtype)
            self._bind(st, ins[k], [buf], factories)()  # on self.stream, once
            for j, i in rd:
                ins[j][i] = buf
            outs[k][0] = buf
            const.add(out)
            folded.add(k)
        return folded

    def _fuse_add_layer_norm(self, steps: tuple[Step, ...], ins: list[list[Any]], outs: list[list[Any]]
                             ) -> tuple[set[int], dict[int, Any]]:
        """Fold a residual add into the layer_norm right after it: ``layer_norm(a + b)`` as one
        kernel that rounds the sum in registers (:func:`kernels.add_layer_norm`), so the sum is
        never written and read back (BERT: 12 adds of (B, S, hidden) per run).

        Only when the add (:func:`kernels.is_plain_add`) is the step just before, its sum has no
        other reader and is not downloaded, neither step was elided/dropped/folded or had its views
        redirected, and the layer_norm's output does not partly overlap ``a`` or ``b`` (it now
        reads them while writing: the same bytes row for row are fine, a warp holds its row in
        registers before storing it, a shifted overlap is not). ``RLX_CUDA_FUSE_ADD_LN=0`` keeps
        both steps. Returns (the add steps, now no-ops; {layer_norm step: its run})."""
        from .settings import FUSE_ADD_LN

        if not FUSE_ADD_LN.get():
            return set(), {}
        g = self.program.graph
        uses = Counter(v for st in steps for v in st.inputs)
        uses.update(v for _, v in self.program.outputs)
        uses.update(name for name, _, _ in self.downloads)
        skip = self.elided | self.dropped | self.folded

        def span(v: Any) -> tuple[int, int]:
            p = int(v.data.ptr)
            return p, p + max(int(v.nbytes), 1)

        def safe(y: Any, x: Any) -> bool:  # disjoint, or exactly the same bytes
            (y0, y1), (x0, x1) = span(y), span(x)
            return y1 <= x0 or x1 <= y0 or (y0 == x0 and y1 == x1)

        adds: set[int] = set()
        runs: dict[int, Any] = {}
        for k in range(1, len(steps)):
            st, pre = steps[k], steps[k - 1]
            if st.kernel != "cuda.layer_norm" or k in skip or k - 1 in skip or k - 1 in adds:
                continue
            s = pre.outputs[0] if len(pre.outputs) == 1 else None
            if s is None or st.inputs[0] != s or uses[s] != 1 or ins[k][0] is not self.views.get(s) \
                    or outs[k - 1][0] is not self.views.get(s):
                continue
            if not kern.is_plain_add(pre.kernel, pre.attrs, [g.types[i] for i in pre.inputs], g.types[s]):
                continue
            a, a2 = ins[k - 1]
            y = outs[k][0]
            if not (a.flags.c_contiguous and a2.flags.c_contiguous and safe(y, a) and safe(y, a2)):
                continue
            b = kern.Bound(ins[k], outs[k], [g.types[i] for i in st.inputs], [g.types[o] for o in st.outputs],
                           st.attrs, self)
            run = kern.add_layer_norm(b, a, a2)
            if run is not None:
                adds.add(k - 1)
                runs[k] = run
        return adds, runs

    def _absorb_head_transposes(self, steps: tuple[Step, ...], ins: list[list[Any]], outs: list[list[Any]]
                                ) -> tuple[set[int], dict[int, dict[str, tuple[Any, int, int, int]]]]:
        """:func:`rlx_cuda.heads.absorb_head_transposes` on this program's views."""
        from .heads import absorb_head_transposes

        return absorb_head_transposes(self.program, steps, ins, outs, self.elided,
                                      [name for name, _, _ in self.downloads],
                                      int(self.device.compute_capability))

    def _elide_reshape_copies(self, steps: tuple[Step, ...], ins: list[list[Any]], outs: list[list[Any]]
                              ) -> set[int]:
        """Drop the copy of a reshape by letting its neighbour step use the other buffer.

        The planner aliases a reshape only when its input dies there; where it did not (the input
        lives on, or the buffers could not be shared), a reshape is one extra full copy. For a
        reshape ``x -> y`` at step k:

        1. the step before, when it alone makes ``x`` and ``x`` has no other reader, writes ``y``
           (viewed in ``x``'s shape) directly; or else
        2. the step after, when it is ``y``'s only reader, reads ``x`` (viewed in ``y``'s shape).

        The reshape's run becomes a no-op. Only the buffer that takes over may hold bytes the
        planner gave to something else at that moment: in 1, ``y``'s bytes are free from step k on,
        so only the step's own inputs (dying there) may share them; in 2, ``x`` is dead after step
        k, so only the reader's outputs may. That is checked on the device pointers, and a reshape
        that fails it keeps its copy. Returns the no-op steps.
        """
        uses = Counter(v for st in steps for v in st.inputs)
        uses.update(v for _, v in self.program.outputs)
        uses.update(name for name, _, _ in self.downloads)

        def overlap(a: Any, b: Any) -> bool:
            pa, pb = int(a.data.ptr), int(b.data.ptr)
            return pa < pb + max(int(b.nbytes), 1) and pb < pa + max(int(a.nbytes), 1)

        elided: set[int] = set()
        for k, st in enumerate(steps):
            if st.kernel != "cuda.reshape":
                continue
            x, y = ins[k][0], outs[k][0]
            if x.data.ptr == y.data.ptr or y.nbytes == 0:
                continue  # already free
            if k > 0 and k - 1 not in elided and uses[st.inputs[0]] == 1 \
                    and st.inputs[0] in steps[k - 1].outputs:
                j = steps[k - 1].outputs.index(st.inputs[0])
                others = [v for n, v in enumerate(outs[k - 1]) if n != j]
                if not any(overlap(y, v) for v in [*ins[k - 1], *others]):
                    outs[k - 1][j] = y.reshape(x.shape)
                    elided.add(k)
                    continue
            if k + 1 < len(steps) and uses[st.outputs[0]] == 1 and st.outputs[0] in steps[k + 1].inputs \
                    and not any(overlap(x, v) for v in outs[k + 1]):
                j = steps[k + 1].inputs.index(st.outputs[0])
                ins[k + 1][j] = x.reshape(y.shape)
                elided.add(k)
        return elided

    # -- running ----------------------------------------------------------------------------------
    def upload(self, inputs: Mapping[str, np.ndarray]) -> None:
        for name, view, dt in self.uploads:
            if view.size:
                view.set(_to_storage(inputs[name], dt), stream=self.stream)

    def download(self) -> dict[str, np.ndarray]:
        out = {}
        for name, view, dt in self.downloads:
            h = view.get(stream=self.stream)
            out[name] = h.view(dt.np) if dt is DType.BF16 else h
        return out

    def launch(self) -> None:
        """Enqueue the kernels once: replay the CUDA graph (captured on the second launch), or,
        with ``use_graph`` off, launch every kernel eagerly."""
        if self.use_graph:
            if self.graph is None and self._eager_runs >= 1 and not self.graph_error:
                self._capture()
            if self.graph is not None:
                self.graph.launch(self.stream)
                return
        for r in self.runs:
            r()
        self._eager_runs += 1

    def _capture(self) -> None:
        pool = cp.cuda.MemoryPool()
        graph = None
        try:
            with cp.cuda.using_allocator(pool.malloc):
                self.stream.begin_capture()
                try:
                    for r in self.runs:
                        r()
                finally:
                    graph = self.stream.end_capture()
        except Exception as e:  # not capturable: stay eager (and say why)
            self.graph_error = f"{type(e).__name__}: {e}"
            return
        self.graph, self._graph_pool = graph, pool

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self.device, self.stream:
            self.upload(inputs)
            self.launch()
            return self.download()

    def profile(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Counter[str]]:
        """Like ``run`` but eager, counting kernel calls by claim name."""
        counts: Counter[str] = Counter()
        with self.device, self.stream:
            self.upload(inputs)
            for name, r in zip(self.kernel_names, self.runs):
                r()
                counts[name] += 1
            return self.download(), counts

    def synchronize(self) -> None:
        self.stream.synchronize()


def _to_storage(a: np.ndarray, dt: DType) -> np.ndarray:
    a = np.asarray(a)
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)  # (never 0-d here: a 0-d array is contiguous)
    if dt is DType.BF16:
        return a.view(np.uint16)
    return a
