"""Ready-made models built with the HIR builder.

* :mod:`rlx_core.models.bert` — :func:`build_bert_encoder`, a BERT encoder from Hugging Face weights;
* :mod:`rlx_core.models.minilm` — :class:`MiniLM`, all-MiniLM-L6-v2 sentence embeddings (``rlx embed``).

Names load lazily, so ``import rlx_core.models`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "build_bert_encoder": "rlx_core.models.bert",
    "MiniLM": "rlx_core.models.minilm",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'rlx_core.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


__all__ = ["MiniLM", "build_bert_encoder"]
