"""Per-kernel microbenchmarks on pytest-benchmark: group = kernel, one benchmark per runtime.

    pytest bench/micro --benchmark-only                       # all kernels, all runtimes here
    pytest bench/micro --benchmark-only -k "matmul and (cpu or numpy)"

Every runtime's output is checked against the float64 (or exact integer) reference before it is
timed: a wrong result fails, it is never timed. A runtime that cannot run a kernel is skipped with
the reason (plugin not installed, no device, or the backend's dispatch error: e.g. rlx-cortexm and
rlx-fpga claim INT8 ops only). Timed is the user-facing call: ``Executable.run`` for RLX (input
checks, copy in, kernels, copy out), ``InferenceSession.run`` for ONNX Runtime, plain NumPy
expressions for NumPy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _kernels import KERNELS, Kernel, _params
from _results import record, runtimes, threads

#: Built once per kernel: (graph, feed, reference, params).
_BUILT: dict[str, tuple[Any, dict[str, np.ndarray], np.ndarray, dict[str, np.ndarray]]] = {}

#: What the wall time of a simulated target measures, for the JSON.
_SIMULATED = {"cortexm": "QEMU mps2-an386 run of the firmware (process start included), not a device",
              "fpga": "Icarus Verilog simulation of the RTL (process start included), not a device",
              "wasm": "wasmtime, one thread, SIMD128",
              "vulkan": "the device rlx-vulkan probes (Mesa lavapipe = software Vulkan on a CPU-only host)",
              "metal": "MSL compiled as C++ and run on the host unless an Apple GPU is present"}


def _built(kernel: Kernel) -> tuple[Any, dict[str, np.ndarray], np.ndarray, dict[str, np.ndarray]]:
    if kernel.name not in _BUILT:
        graph, feed, ref = kernel.build()
        _BUILT[kernel.name] = (graph, feed, ref, _params(graph))
    return _BUILT[kernel.name]


def _check(kernel: Kernel, runtime: str, out: np.ndarray, ref: np.ndarray) -> None:
    out = np.asarray(out)
    if out.shape != ref.shape:
        pytest.fail(f"{runtime} {kernel.name}: output shape {out.shape}, expected {ref.shape}")
    if kernel.exact:
        if not np.array_equal(out.astype(np.int64), ref.astype(np.int64)):
            bad = int(np.sum(out.astype(np.int64) != ref.astype(np.int64)))
            pytest.fail(f"{runtime} {kernel.name}: {bad} of {ref.size} values differ from the exact "
                        "reference")
        return
    err = np.abs(out.astype(np.float64) - ref)
    tol = kernel.atol + kernel.rtol * np.abs(ref)
    if not np.all(err <= tol):
        pytest.fail(f"{runtime} {kernel.name}: max |error| {err.max():.3g} over the tolerance "
                    f"(rtol {kernel.rtol}, atol {kernel.atol}) against the float64 reference")


def _rlx_runner(backend: str, graph: Any, feed: dict[str, np.ndarray]) -> tuple[Callable[[], Any], str,
                                                                                dict[str, Any]]:
    from rlx_core import Session, hub
    from rlx_core.errors import BackendNotFoundError, DispatchError

    if backend not in hub().names():
        pytest.skip(f"rlx-{backend} is not installed (pip install -e plugins/rlx-{backend})")
    try:
        exe = Session(backend).compile(graph)
    except BackendNotFoundError as e:
        pytest.skip(f"rlx-{backend}: no usable device ({e.what})")
    except DispatchError as e:
        lines = [ln.strip() for ln in str(e).splitlines()[1:3]]
        pytest.skip(f"rlx-{backend} cannot run this kernel: {'; '.join(lines)}")
    out_name = graph.outputs[0]
    rep = exe.report
    info = {"device": rep.device, "paths": sorted({e.path for e in rep.entries}),
            "kernels": sorted({k for e in rep.entries for k in e.kernels}),
            "fused": len(rep.fused)}
    return (lambda: exe.run(feed)), out_name, info


def _ort_runner(kernel: Kernel, feed: dict[str, np.ndarray], params: dict[str, np.ndarray]
                ) -> Callable[[], Any]:
    if kernel.onnx_model is None:
        pytest.skip(f"ONNX has no operator for {kernel.name} (INT8 requantize is RLX's own op)")
    try:
        import onnxruntime as ort
    except ImportError:
        pytest.skip("onnxruntime is not installed (pip install onnxruntime)")
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads()
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(kernel.onnx_model(params).SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, feed)


@pytest.mark.parametrize("runtime", runtimes())
@pytest.mark.parametrize("name", list(KERNELS))
def test_kernel(benchmark: Any, name: str, runtime: str) -> None:
    kernel = KERNELS[name]
    graph, feed, ref, params = _built(kernel)
    benchmark.group = name
    benchmark.extra_info.update(runtime=runtime, shape=kernel.shape, threads=threads())
    if runtime == "numpy":
        fn: Callable[[], Any] = kernel.numpy_peer(feed, params)
        get = lambda r: r  # noqa: E731
    elif runtime == "onnxruntime":
        fn = _ort_runner(kernel, feed, params)
        get = lambda r: r[0]  # noqa: E731
    else:
        backend = runtime.removeprefix("rlx-")
        fn, out_name, info = _rlx_runner(backend, graph, feed)
        benchmark.extra_info.update(info)
        if backend in _SIMULATED:
            benchmark.extra_info["measures"] = _SIMULATED[backend]
        get = lambda r: r[out_name]  # noqa: E731
    _check(kernel, runtime, get(fn()), ref)
    benchmark(fn)
    record(name, runtime, benchmark)
    stats = getattr(benchmark, "stats", None)
    if kernel.flops and stats is not None and stats.stats is not None:
        benchmark.extra_info["gflops"] = kernel.flops / stats.stats.median / 1e9
