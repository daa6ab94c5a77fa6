"""Integer settings from the environment, checked the same way everywhere (``RLX_MAX_SPECIALIZATIONS``,
``RLX_ONNX_FOLD_MAX_ELEMENTS``, ``RLX_ONNX_FOLD_MAX_BYTES``)."""

from __future__ import annotations

import os

from .errors import RLXError


def env_int(name: str, default: int, *, minimum: int = 0, fix: str = "") -> int:
    """The integer in environment variable ``name`` (``default`` when unset or empty).

    A value that is not an integer, or is below ``minimum``, is an RLXError naming the variable:
    a typo must not silently turn a safety limit off."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise RLXError(f"{name}={raw!r} is not an integer >= {minimum}", where=f"environment variable {name}",
                       fix=fix or f"set it to an integer such as {default}, or unset it for the default")
    return value


__all__ = ["env_int"]
