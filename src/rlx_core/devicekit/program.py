"""The generic executable of a code-generating device backend: the LIR walked once, driven by the
backend's allocator, lowering and runtime.

At compile time :class:`KitProgram` allocates the arena the buffer plan laid out
(``plan.arena_bytes``: every value at its planned offset, reuse and in-place aliasing included),
uploads the constants once into one constants buffer (64-byte aligned each), asks the backend to
lower every LIR step into :class:`Launch` es (kernel source + bound values + integer parameters +
grid), has the :class:`Runtime` load every distinct source (through the backend's
:class:`~rlx_core.devicekit.Compiler`) and bind the launch sequence into one callable. Per run it
copies the inputs in (the LIR's host->device transfers), calls that, and copies the outputs out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..dtypes import DType
from ..errors import PluginError
from ..lir import Program, Step

ALIGN = 64
#: the slots :meth:`KitProgram.locate` names
ARENA, CONSTANTS = 0, 1


@dataclass
class Launch:
    """One kernel launch of one LIR step (a step may lower to several: a concat copies each input)."""

    #: the claim name of the step (profile counts)
    kernel: str
    #: the kernel source in the backend's dialect (equal sources are compiled once)
    source: str
    #: the values bound to the kernel's buffer parameters, in order
    bufs: tuple[str, ...] = ()
    #: integer launch parameters (shapes, strides, offsets): one compiled kernel serves every shape
    params: Sequence[int] | np.ndarray = ()
    #: the work size (threads or groups, as the runtime defines it); 0 anywhere: nothing to run
    grid: tuple[int, int, int] = (1, 1, 1)

    @property
    def empty(self) -> bool:
        return 0 in self.grid


class Allocator(Protocol):
    """Device memory: whole buffers, written and read at byte offsets."""

    def alloc(self, nbytes: int) -> Any: ...

    def copyin(self, buf: Any, offset: int, data: np.ndarray) -> None: ...

    def copyout(self, buf: Any, offset: int, nbytes: int) -> np.ndarray: ...


class HostAllocator:
    """Device memory that is host memory (kernels run on the CPU, or unified memory): 64-byte
    aligned NumPy byte arrays; :meth:`address` is the raw pointer a ctypes launch passes."""

    def alloc(self, nbytes: int) -> np.ndarray:
        raw = np.zeros(max(int(nbytes), 1) + ALIGN, np.uint8)
        shift = (-raw.ctypes.data) % ALIGN
        return raw[shift:shift + max(int(nbytes), 1)]  # the slice keeps ``raw`` alive

    def copyin(self, buf: np.ndarray, offset: int, data: np.ndarray) -> None:
        b = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        buf[offset:offset + b.size] = b

    def copyout(self, buf: np.ndarray, offset: int, nbytes: int) -> np.ndarray:
        return buf[offset:offset + nbytes].copy()

    def address(self, buf: np.ndarray, offset: int) -> int:
        return int(buf.ctypes.data) + int(offset)


class Runtime(Protocol):
    """Loads compiled kernels and binds a program's launches."""

    def load(self, sources: Sequence[str]) -> Mapping[str, Any]:
        """A launchable per distinct source (compiled through the backend's Compiler)."""
        ...

    def bind(self, program: KitProgram) -> Callable[[], None]:
        """One callable running every launch of ``program`` in order (eager calls, or a replay)."""
        ...


Lower = Callable[[Step, "KitProgram"], Sequence[Launch]]


class CtypesRuntime:
    """Kernels that run on the host (a C-family dialect compiled for the CPU): each source a shared
    library from ``load`` (typically a :class:`~rlx_core.devicekit.Compiler`'s ``load_all``) whose
    ``entry(void** buffers, const int* params)`` is called through ctypes with the buffers' raw
    pointers (arena or constants) and the launch's parameters as int32."""

    def __init__(self, load: Callable[[Sequence[str]], Mapping[str, Any]], entry: str) -> None:
        self.allocator = HostAllocator()
        self._load = load
        self.entry = entry

    def load(self, sources: Sequence[str]) -> Mapping[str, Any]:
        return self._load(sources)

    def bind(self, program: KitProgram) -> Callable[[], None]:
        import ctypes

        calls: list[tuple[Any, int, int]] = []
        keep: list[Any] = []  # the pointer and parameter arrays the calls point into
        for ln in program.all_launches():
            addresses = [self.allocator.address(*program.buffer(v)) for v in ln.bufs]
            ptrs = (ctypes.c_void_p * max(len(addresses), 1))(*addresses)
            params = np.ascontiguousarray(ln.params, np.int32)
            keep += [ptrs, params]
            fn = getattr(program.functions[ln.source], self.entry)
            calls.append((fn, ctypes.addressof(ptrs), params.ctypes.data))

        def run() -> None:
            for fn, bufs, params in calls:
                fn(bufs, params)

        run.keep = keep  # type: ignore[attr-defined]
        return run


class Replay:
    """Record once, replay per run: the capability of APIs with command lists (CUDA graphs, Vulkan
    command buffers, Metal indirect command buffers).

    ``eager()`` runs the launches one by one; ``capture()`` records them and returns the replay
    callable, or raises: the runs then stay eager and :attr:`error` says why (with no eager path the
    error propagates). Capture happens after ``warmup`` eager runs (CUDA: the first run warms the
    libraries that allocate), or now with :meth:`capture_now` (Vulkan: recorded at bind time).
    """

    def __init__(self, eager: Callable[[], None] | None, capture: Callable[[], Callable[[], None]], *,
                 warmup: int = 1, enabled: bool = True) -> None:
        self.eager, self.capture = eager, capture
        self.warmup, self.enabled = warmup, enabled
        self.replay: Callable[[], None] | None = None
        self.error = ""
        self.eager_runs = 0

    def capture_now(self) -> None:
        try:
            self.replay = self.capture()
        except Exception as e:
            if self.eager is None:
                raise
            self.error = f"{type(e).__name__}: {e}"

    def __call__(self) -> None:
        if self.enabled or self.eager is None:
            if self.replay is None and self.eager_runs >= self.warmup and not self.error:
                self.capture_now()
            if self.replay is not None:
                self.replay()
                return
        assert self.eager is not None
        self.eager()
        self.eager_runs += 1


def storage(a: Any, dt: DType) -> np.ndarray:
    """A host array as the contiguous bytes a device buffer holds for ``dt``."""
    return np.ascontiguousarray(np.asarray(a, dtype=dt.np))


class KitProgram:
    """The compiled program (what ``rlx_compile`` returns): ``run(inputs)`` and ``profile(inputs)``.

    Subclasses may override :meth:`constants` (e.g. add constants derived at compile time, such as a
    pre-transposed weight). ``lower(step, self)`` may read :meth:`locate`, :meth:`shape`,
    :attr:`types` and :attr:`constant_values`.
    """

    def __init__(self, program: Program, allocator: Allocator, runtime: Runtime, lower: Lower) -> None:
        self.program = program
        self.types = program.graph.types
        self.allocator = allocator
        self.runtime = runtime
        plan = program.plan
        self.arena = allocator.alloc(max(plan.arena_bytes, 1))
        #: every constant the kernels read (the graph's weights, plus what ``constants`` derives)
        self.constant_values: dict[str, np.ndarray] = self.constants()
        self.constant_offsets: dict[str, int] = {}
        total = 0
        for name, arr in self.constant_values.items():
            self.constant_offsets[name] = total
            total += (arr.nbytes + ALIGN - 1) // ALIGN * ALIGN
        self.constant_bytes = total
        self.constant_buf = allocator.alloc(max(total, 16))
        for name, arr in self.constant_values.items():
            if arr.nbytes:
                allocator.copyin(self.constant_buf, self.constant_offsets[name], arr)
        self.launches: list[tuple[Step, list[Launch]]] = [(s, list(lower(s, self))) for s in program.kernels]
        self.kernel_names = tuple(s.kernel for s in program.kernels)
        self.functions = runtime.load([ln.source for _, lns in self.launches for ln in lns if not ln.empty])
        self.uploads = [v.name for v in program.inputs if v.name in plan.offsets]
        self.downloads = [value for _, value in program.outputs]
        self._launch = runtime.bind(self)

    # -- for lowering and binding -----------------------------------------------------------------
    def constants(self) -> dict[str, np.ndarray]:
        g = self.program.graph
        return {p.name: storage(g.weights[p.name], p.type.dtype) for p in g.params}

    def locate(self, value: str) -> tuple[int, int]:
        """``(slot, byte offset)`` of a value: :data:`CONSTANTS` or :data:`ARENA`."""
        if value in self.constant_offsets:
            return CONSTANTS, self.constant_offsets[value]
        try:
            return ARENA, int(self.program.plan.offsets[value])
        except KeyError:
            raise PluginError(f"value {value!r} has no buffer (neither planned nor a constant)",
                              where=f"{self.program.backend} program {self.program.graph.name!r}",
                              fix="report this bug: the backend's lowering names a value the LIR lacks",
                              kind="runtime") from None

    def buffer(self, value: str) -> tuple[Any, int]:
        """``(device buffer, byte offset)`` of a value."""
        slot, off = self.locate(value)
        return (self.constant_buf if slot == CONSTANTS else self.arena), off

    def shape(self, value: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self.types[value].shape)

    def all_launches(self) -> list[Launch]:
        return [ln for _, lns in self.launches for ln in lns if not ln.empty]

    # -- running ----------------------------------------------------------------------------------
    def copy_in(self, inputs: Mapping[str, np.ndarray]) -> None:
        offsets = self.program.plan.offsets
        for name in self.uploads:
            t = self.types[name]
            if t.nbytes():
                self.allocator.copyin(self.arena, offsets[name], storage(inputs[name], t.dtype))

    def copy_out(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for value in self.downloads:
            t = self.types[value]
            shape = self.shape(value)
            if value in self.program.graph.weights:
                out[value] = storage(self.program.graph.weights[value], t.dtype).reshape(shape).copy()
            elif value in self.program.plan.offsets:
                raw = self.allocator.copyout(self.arena, self.program.plan.offsets[value], t.nbytes())
                out[value] = raw.view(t.dtype.np).reshape(shape)
            else:
                out[value] = np.array(inputs[value], copy=True)
        return out

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.copy_in(inputs)
        self._launch()
        return self.copy_out(inputs)

    def profile(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Counter[str]]:
        """Like ``run``; counts kernel calls per claim name, one per LIR step (a step may launch
        several kernels, or none for an empty tensor)."""
        out = self.run(inputs)
        return out, Counter(self.kernel_names)
