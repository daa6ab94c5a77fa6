"""Lazy module attributes (PEP 562) for the core's packages: ``import rlx_core`` and plugin discovery
stay fast because a name's home module is imported on its first use, not when the package is."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy(namespace: dict[str, Any], homes: Mapping[str, str],
         hint: str = "") -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` body and its ``__dir__``. ``homes`` maps a public name to its home:
    ``"pkg.mod"`` (or ``".mod"``, relative to the package) exports ``mod.name``; ``"pkg.mod:attr"``
    exports ``mod.attr`` under ``name``; ``"pkg.mod:"`` exports the module itself. The value is
    cached in ``namespace`` so the lookup runs once. ``hint`` ends the AttributeError's message."""
    package = namespace["__name__"]

    def get(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}{hint}")
        module, _, attr = home.partition(":")
        mod = importlib.import_module(module, package)
        value = mod if home.endswith(":") else getattr(mod, attr or name)
        namespace[name] = value
        return value

    def names() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return get, names
