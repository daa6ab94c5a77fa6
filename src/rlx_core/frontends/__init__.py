"""Model importers: other formats in, RLX graphs out.

* :func:`load_onnx` (``rlx_core.frontends.onnx``) translates ``.onnx`` files (needs the ``onnx``
  package, imported on first use);
* :func:`to_dot` (``rlx_core.frontends.dot``) writes a graph, optionally with its dispatch report,
  as Graphviz DOT.

Nothing heavy is imported until a name is used.
"""

from __future__ import annotations

from typing import Any

from .._lazy import lazy as _lazy

_LAZY = {
    "load_onnx": "rlx_core.frontends.onnx",
    "UnsupportedOnnxError": "rlx_core.frontends.onnx",
    "register_handler": "rlx_core.frontends.onnx",
    "to_dot": "rlx_core.frontends.dot",
}


_get, __dir__ = _lazy(globals(), _LAZY)


def __getattr__(name: str) -> Any:
    return _get(name)


__all__ = ["UnsupportedOnnxError", "load_onnx", "register_handler", "to_dot"]
