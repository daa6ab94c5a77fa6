"""Helpers shared by the tests of rlx-cpu's optional C kernels (rlx_cpu._stemconv, rlx_cpu._winograd)
that run inside conv chains."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest


def require_built(ext: str, what: str) -> None:
    """Skip where oneDNN is missing (the kernels run on its OpenMP team); fail where the extension
    ``ext`` (``rlx_cpu._stemconv``...) was not built: CI builds it, so a missing build is a failure."""
    from rlx_cpu import onednn_conv

    if onednn_conv._api() is None:
        pytest.skip(f"oneDNN is not installed ({what} run on its OpenMP team)")
    try:
        importlib.import_module(ext)
    except ImportError as e:
        pytest.fail(f"{ext} was not built: {e}")


def isas(ext: str, module: Any) -> list[int]:
    """The code paths to test: the portable one everywhere, the AVX-512 one where the CPU has it
    (``module``: the binding, with GENERIC and AVX512)."""
    fast = importlib.import_module(ext).isa() == "avx512"
    return [module.GENERIC] + ([module.AVX512] if fast else [])


def chain_impls(exe: Any, graph: Any, feeds: dict[str, np.ndarray]) -> list[str]:
    """The implementations a compiled program's conv chains run, in order (oneDNN's impl names, or
    rlx-cpu's kernels')."""
    from rlx_core.runtime import bind_inputs

    compiled, _, _ = exe._specialise(bind_inputs(graph, feeds, "test")[1])
    out: list[str] = []
    for name, r in zip(compiled.kernel_names, compiled.runs):
        if "conv_chain" in name:
            out += list(getattr(r, "onednn_impl", None) or [])
    return out
