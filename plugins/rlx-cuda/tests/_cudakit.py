"""What rlx-cuda's test modules share: the GPU marker (with the probe's reason), the record of the
generated kernels a test binds, and NVRTC compile checks that need no GPU (CuPy's libnvrtc, the
``nvidia-cuda-nvrtc`` wheel's, or the system's)."""

from __future__ import annotations

import ctypes
import ctypes.util
from pathlib import Path
from typing import Any

import pytest


def cuda_reason() -> str | None:
    """None where rlx-cuda has a usable device, else why not (the probe's words)."""
    try:
        from rlx_cuda.plugin import rlx_probe_devices
    except ImportError as e:
        return f"rlx-cuda is not installed ({e})"
    devs = rlx_probe_devices()
    return None if any(d.available for d in devs) else devs[0].reason


WHY = cuda_reason()
gpu = pytest.mark.skipif(WHY is not None, reason=f"needs a CUDA GPU: {WHY}")

#: Names of the generated kernels bound (by ``kernels.raw_kernel``) since :func:`record_kernels` or
#: the last ``BOUND.clear()``, in order: a test's proof that the kernel it means really ran.
BOUND: list[str] = []


def record_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty :data:`BOUND` and, with a GPU, record in it every kernel ``kernels.raw_kernel`` binds
    until ``monkeypatch`` is undone (for an autouse fixture). The wrapper records names only and
    calls through: the process's kernel cache stays warm."""
    BOUND.clear()
    if WHY is not None:
        return
    from rlx_cuda import kernels

    real = kernels.raw_kernel

    def recording(name: str, source: str) -> Any:
        BOUND.append(name)
        return real(name, source)
    monkeypatch.setattr(kernels, "raw_kernel", recording)


def nvrtc_lib() -> Any:
    """A ctypes handle on libnvrtc, or None: the pip wheel's, then the system's."""
    cands: list[str] = []
    try:
        import nvidia.cuda_nvrtc as pkg

        root = Path(next(iter(pkg.__path__))) / "lib"
        cands += [str(p) for p in sorted(root.glob("libnvrtc.so*")) if "builtins" not in p.name]
    except Exception:
        pass
    found = ctypes.util.find_library("nvrtc")
    cands += [found] if found else []
    cands += ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    for c in cands:
        try:
            return ctypes.CDLL(c)
        except OSError:
            continue
    return None


def nvrtc_compile(lib: Any, src: str, arch: str, name: str = "kernel.cu") -> tuple[int, str]:
    """NVRTC's status and log for ``src`` compiled for ``arch`` (e.g. compute_90); nothing runs."""
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None) == 0
    opts = [b"-ftz=true", f"--gpu-architecture={arch}".encode()]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = int(lib.nvrtcCompileProgram(prog, len(opts), arr))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, buf)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, buf.value.decode(errors="replace")
