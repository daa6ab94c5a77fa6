"""Every error RLX raises, in one small hierarchy.

Each message says *what* went wrong, *where* (node, field, backend, plugin) and *how to fix it*,
so a user never has to read a traceback to act on it.
"""

from __future__ import annotations


class RLXError(Exception):
    """Base class: catch this to handle any RLX failure."""

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None) -> None:
        self.what = what
        self.where = where
        self.fix = fix
        parts = [what]
        if where:
            parts.append(f"  where: {where}")
        if fix:
            parts.append(f"  fix: {fix}")
        super().__init__("\n".join(parts))


class IRError(RLXError):
    """The graph itself is invalid: unknown op, bad attribute, shape or dtype mismatch."""


class ShapeError(IRError):
    """Shapes of a node's inputs are incompatible with the op."""


class DTypeError(IRError):
    """Dtypes of a node's inputs are not accepted by the op."""


class SerializationError(RLXError):
    """A model file is malformed, truncated or of an unsupported version."""


class SignatureError(SerializationError):
    """A signed model's signature is missing, malformed, made with another key, or does not match the
    file (it was changed after signing). Raised before anything in the file is parsed."""


class PluginError(RLXError):
    """A plugin failed to import, has the wrong API version, or raised in a hook.

    ``kind`` says which: ``import``, ``api_version``, ``conflict``, ``hook``, ``invalid``,
    ``runtime`` (its compiled program raised) or ``other``.
    """

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None,
                 kind: str = "other") -> None:
        self.kind = kind
        super().__init__(what, where=where, fix=fix)


class PluginConflictError(PluginError):
    """Two distributions provide the same backend name."""


class BackendNotFoundError(RLXError):
    """The requested backend is not installed, disabled, or failed to load."""


class DispatchError(RLXError):
    """Compilation failed: some nodes have no legal native, common-IR or rewritten path.

    ``illegal`` holds one record per node that could not be placed.
    """

    def __init__(self, what: str, *, illegal: list | None = None, where: str | None = None,
                 fix: str | None = None) -> None:
        self.illegal = list(illegal or [])
        super().__init__(what, where=where, fix=fix)


class CollectiveError(RLXError):
    """A collective (all_reduce, send, recv ...) failed or timed out on this rank."""


class InputError(RLXError):
    """Inputs given to ``Executable.run`` do not match the graph's inputs."""


class CalibrationError(RLXError):
    """A calibration micro-benchmark could not run."""


class CapabilityError(RLXError):
    """The backend's compiled program lacks an optional capability the caller asked for (for
    example :class:`~rlx_core.records.BufferBinding`, which resident training needs)."""


class SettingError(RLXError, ValueError):
    """An ``RLX_*`` setting has a value its declaration does not allow, or is declared twice differently.

    Also a ValueError, so code that caught the ad-hoc environment parsers' errors still catches it."""
