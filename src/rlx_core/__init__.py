"""RLX for Python: one tensor IR, a dispatch contract, and backends as plugins.

``import rlx_core`` is cheap: NumPy and the IR load on first use of a name that needs them.
"""

from __future__ import annotations

from typing import Any

from ._lazy import lazy as _lazy

__version__ = "0.1.0"
#: The plugin API version. A plugin whose major differs is refused with a clear message.
API_VERSION = "1.1"

_LAZY = {
    "DType": "rlx_core.dtypes",
    "Graph": "rlx_core.ir",
    "GraphBuilder": "rlx_core.ir",
    "Tensor": "rlx_core.ir",
    "TensorType": "rlx_core.ir",
    "OpSchema": "rlx_core.ir",
    "AttrSpec": "rlx_core.ir",
    "register_op": "rlx_core.ir",
    "Session": "rlx_core.runtime",
    "Executable": "rlx_core.runtime",
    "fastest_device": "rlx_core.cost",
    "hub": "rlx_core._hub",
    "backends": "rlx_core._hub",
    "devices": "rlx_core._hub",
    "load": "rlx_core.ir.serialize",
    "save": "rlx_core.ir.serialize",
    "grad": "rlx_core.autodiff",
    "value_and_grad": "rlx_core.autodiff",
    "vjp": "rlx_core.autodiff",
    "jvp": "rlx_core.autodiff",
    "hvp": "rlx_core.autodiff",
    "vmap": "rlx_core.autodiff",
    "load_onnx": "rlx_core.frontends.onnx",
}


_get, __dir__ = _lazy(globals(), _LAZY)


def __getattr__(name: str) -> Any:
    return _get(name)
