"""Model importers: other formats in, RLX graphs out.

* :func:`load_onnx` (``rlx_core.frontends.onnx``) translates ``.onnx`` files (needs the ``onnx``
  package, imported on first use);
* :func:`to_dot` (``rlx_core.frontends.dot``) writes a graph, optionally with its dispatch report,
  as Graphviz DOT.

Nothing heavy is imported until a name is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "load_onnx": "rlx_core.frontends.onnx",
    "UnsupportedOnnxError": "rlx_core.frontends.onnx",
    "register_handler": "rlx_core.frontends.onnx",
    "to_dot": "rlx_core.frontends.dot",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'rlx_core.frontends' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))


__all__ = ["UnsupportedOnnxError", "load_onnx", "register_handler", "to_dot"]
