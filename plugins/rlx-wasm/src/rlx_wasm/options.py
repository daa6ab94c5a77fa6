"""Process-wide options (import-light: no numpy, no wasmtime)."""

from __future__ import annotations

_SIMD: bool | None = None


def set_simd(enabled: bool | None) -> None:
    """Force SIMD128 kernels on or off for programs compiled from now on (``None``: follow the
    ``RLX_WASM_SIMD`` environment variable, default on). Compiled programs keep their setting."""
    global _SIMD
    _SIMD = None if enabled is None else bool(enabled)


def simd_enabled(option: bool | None = None) -> bool:
    """The SIMD setting for a new compilation: an explicit ``option``, else :func:`set_simd`,
    else ``RLX_WASM_SIMD`` (``0``/``false``/``no``/``off`` disable it)."""
    if option is not None:
        return bool(option)
    if _SIMD is not None:
        return _SIMD
    from .settings import SIMD

    return bool(SIMD.get())
