"""Whether rlx-cpu's compiled dispatch loop (the optional ``rlx_cpu._dispatch`` extension) is used,
and why an optional extension is missing.

A module of its own, importing nothing heavy, so that device probing (``rlx doctor``) can say so
without loading NumPy's or oneDNN's bindings.
"""

from __future__ import annotations

from . import settings


def why_not() -> str | None:
    """Why the compiled dispatch loop is not used, or None when it is."""
    if not settings.NATIVE_DISPATCH.get():
        return f"{settings.NATIVE_DISPATCH.name}=0"
    try:
        from . import _dispatch  # noqa: F401
    except ImportError as e:
        return not_built("rlx_cpu._dispatch", e)
    return None


def not_built(module: str, e: ImportError) -> str:
    """Why one of rlx-cpu's optional C extensions is missing, and the fix."""
    return (f"{module} was not built when rlx-cpu was installed ({e}); reinstall rlx-cpu where a C "
            "compiler and Python's headers are present (apt-get install gcc python3-dev)")
