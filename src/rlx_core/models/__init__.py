"""Ready-made models built with the HIR builder.

* :mod:`rlx_core.models.bert` — :func:`build_bert_encoder`, a BERT encoder from Hugging Face weights;
* :mod:`rlx_core.models.minilm` — :class:`MiniLM`, all-MiniLM-L6-v2 sentence embeddings (``rlx embed``).

Names load lazily, so ``import rlx_core.models`` stays cheap.
"""

from __future__ import annotations

from typing import Any

from .._lazy import lazy as _lazy

_LAZY = {
    "build_bert_encoder": "rlx_core.models.bert",
    "MiniLM": "rlx_core.models.minilm",
}


_get, __dir__ = _lazy(globals(), _LAZY)


def __getattr__(name: str) -> Any:
    return _get(name)


__all__ = ["MiniLM", "build_bert_encoder"]
