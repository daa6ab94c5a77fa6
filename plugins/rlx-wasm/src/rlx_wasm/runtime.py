"""Running a generated module in wasmtime, with NumPy views straight into its linear memory."""

from __future__ import annotations

import hashlib
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx_core.plugin import Compiler

from .codegen import Artifact
from .options import simd_enabled

__all__ = ["WasmProgram", "engine", "module", "simd_enabled"]

_LOCK = threading.Lock()
_ENGINES: dict[bool, Any] = {}
_MODULES: OrderedDict[tuple[str, bool], Any] = OrderedDict()
MODULE_CACHE_SIZE = 256


def engine(simd: bool) -> Any:
    """One wasmtime engine per SIMD setting; without SIMD the proposal is disabled outright, so a
    scalar module that used a vector instruction would fail validation instead of running."""
    import wasmtime

    with _LOCK:
        eng = _ENGINES.get(simd)
        if eng is None:
            cfg = wasmtime.Config()
            cfg.wasm_relaxed_simd = False
            cfg.wasm_simd = simd
            cfg.wasm_bulk_memory = True
            cfg.cranelift_opt_level = "speed"
            eng = wasmtime.Engine(cfg)
            _ENGINES[simd] = eng
        return eng


class ModuleCompiler(Compiler):
    """The device kit's compiler for wasm: a module's machine code (wasmtime's Cranelift output),
    cached on disk as an authenticated entry. Only RLX's own entries are ever deserialized:
    wasmtime trusts serialized code completely, so an unauthenticated file must never reach it."""

    dialect = "wasm"
    cache_name = "wasm-modules"
    about = "rlx-wasm: modules compiled by wasmtime (Cranelift), authenticated"
    suffix = ".cwasm"
    label = "wasmtime"

    def __init__(self, simd: bool) -> None:
        super().__init__()
        self.simd = simd

    def identity(self) -> str:
        from importlib.metadata import version

        return f"wasmtime {version('wasmtime')} simd={self.simd} relaxed=0 bulk=1 opt=speed"

    def build(self, source: str, out: Path) -> None:
        import wasmtime

        out.write_bytes(wasmtime.Module(engine(self.simd), bytes.fromhex(source)).serialize())


_COMPILERS = {simd: ModuleCompiler(simd) for simd in (False, True)}


def module(wasm: bytes, simd: bool) -> Any:
    """The compiled module for ``wasm``: in-process by content hash, else the kit's disk cache."""
    import wasmtime

    key = (hashlib.sha256(wasm).hexdigest(), simd)
    with _LOCK:
        hit = _MODULES.get(key)
        if hit is not None:
            _MODULES.move_to_end(key)
            return hit
    # The key of the disk entry is the module's bytes (hex: the kit keys text sources).
    code = _COMPILERS[simd].compile(wasm.hex())
    mod = wasmtime.Module.deserialize(engine(simd), code)
    with _LOCK:
        _MODULES[key] = mod
        while len(_MODULES) > MODULE_CACHE_SIZE:
            _MODULES.popitem(last=False)
    return mod


def _call(fn: Any, store: Any) -> None:
    """Run an entry point; the trap of an out-of-range index (:func:`kernels.bounded_index`, the
    module's only ``unreachable``) becomes the user's InputError, any other trap stays a bug."""
    import wasmtime

    try:
        fn(store)
    except wasmtime.Trap as e:
        if e.trap_code is not wasmtime.TrapCode.UNREACHABLE:
            raise
        from rlx_core.plugin import InputError

        raise InputError("gather/scatter_add: an index computed on the device is out of range (the "
                         "wasm kernel stopped before reading or writing outside its tensor)",
                         fix="indices must be in [-n, n-1] for an axis of size n (ONNX: a negative "
                             "index counts once from the end); they come from an earlier node of the "
                             "graph") from None


class WasmProgram:
    """An instantiated module: weights written once, inputs/outputs as views of linear memory."""

    def __init__(self, artifact: Artifact) -> None:
        import wasmtime

        self.artifact = artifact
        mod = module(artifact.wasm, artifact.simd)
        self.store = wasmtime.Store(engine(artifact.simd))
        inst = wasmtime.Instance(self.store, mod, [])
        ex = inst.exports(self.store)
        memory = ex["memory"]
        if not isinstance(memory, wasmtime.Memory):
            raise TypeError(f"the module's export 'memory' is a {type(memory).__name__}, not a memory")
        self.memory = memory
        self._run = ex["run"]
        self._profile = ex["run_profile"]
        self._raw = self.memory.get_buffer_ptr(self.store)  # keeps the ctypes array alive
        #: all of linear memory as bytes (zero-copy; the memory never grows)
        # ctypes arrays export the buffer protocol; numpy's stubs do not list them
        self.buffer = np.frombuffer(self._raw, dtype=np.uint8)  # type: ignore[call-overload]
        base = artifact.weights_offset
        for off, arr in artifact.weights:
            raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            self.buffer[base + off:base + off + raw.size] = raw
        self.input_views = [(s.name, self.view(s.address, s.dtype.np, s.shape)) for s in artifact.inputs]
        self.output_views = {s.name: self.view(s.address, s.dtype.np, s.shape) for s in artifact.outputs}
        self.kernel_names = list(artifact.kernel_names)
        n = len(self.kernel_names)
        self._counters = self.view(artifact.counters_offset, np.dtype(np.int32), (n,))

    def view(self, address: int, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        """A NumPy array aliasing linear memory at ``address`` (no copy)."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self.buffer[address:address + nbytes].view(dtype).reshape(shape)

    def _feed(self, inputs: Mapping[str, np.ndarray]) -> None:
        for name, view in self.input_views:
            np.copyto(view, inputs[name])

    def run(self, inputs: Mapping[str, np.ndarray], copy: bool = True) -> dict[str, np.ndarray]:
        """Copy inputs into their planned slots, run every kernel, return the outputs.

        ``copy=False`` returns views of linear memory (valid until the next run).
        """
        self._feed(inputs)
        _call(self._run, self.store)
        if not copy:
            return dict(self.output_views)
        return {k: v.copy() for k, v in self.output_views.items()}

    def profile(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Counter[str]]:
        """Run the instrumented entry point: every kernel call increments its counter in memory."""
        self._feed(inputs)
        self._counters[:] = 0
        _call(self._profile, self.store)
        counts: Counter[str] = Counter()
        for name, c in zip(self.kernel_names, self._counters.tolist()):
            if c:
                counts[name] += int(c)
        return {k: v.copy() for k, v in self.output_views.items()}, counts
