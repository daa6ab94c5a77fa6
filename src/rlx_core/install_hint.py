"""Install hints that name a real extra of rlx-core, never a package name guessed from user input.

``--device gpu`` used to suggest ``pip install rlx-gpu``: a name made up from a typo, which on a
public registry could be anyone's package. The hints here come from rlx-core's own metadata (its
``Provides-Extra`` / ``Requires-Dist``), so the core still names no backend: a backend ``B`` has an
install line only when an extra ``B`` (or ``B`` plus a version, like ``cuda12``) requires a plugin
distribution. Everything else gets "check the name" and where the extras are listed.
"""

from __future__ import annotations

import functools
import re

__all__ = ["backend_extras", "backend_hint", "default_backend_hint", "module_hint"]

_DIST = "rlx-core"
# rlx-conformance is the core's own test companion, not a backend (an extra that requires it only
# certifies backends).
_NOT_BACKENDS = frozenset({"rlx-conformance"})
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def _extras() -> dict[str, frozenset[str]]:
    """extra -> the normalized distribution names it requires ({} when rlx-core is not installed)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        meta = distribution(_DIST).metadata
    except PackageNotFoundError:
        return {}
    out: dict[str, set[str]] = {e: set() for e in meta.get_all("Provides-Extra") or []}
    for req in meta.get_all("Requires-Dist") or []:
        m, e = _REQ_NAME.match(req), _EXTRA.search(req)
        if m and e and e.group(1) in out:
            out[e.group(1)].add(_norm(m.group(1)))
    return {k: frozenset(v) for k, v in out.items()}


def backend_extras() -> dict[str, str]:
    """extra -> plugin distribution, for the extras that install exactly one backend plugin."""
    out = {}
    for extra, dists in _extras().items():
        plugins = [d for d in dists if d.startswith("rlx-") and d != _DIST and d not in _NOT_BACKENDS]
        # cpu, cpu-onednn, cuda12: named after their plugin (not embed or all, which bundle one)
        if len(plugins) == 1 and re.match(re.escape(plugins[0][4:]) + r"(\d|-|$)", extra):
            out[extra] = plugins[0]
    return out


def _extras_for(name: str) -> list[str]:
    return sorted(e for e in backend_extras() if re.fullmatch(re.escape(name) + r"\d*", e))


def _pip(extra: str) -> str:
    return f'pip install "rlx-core[{extra}]"'


def backend_hint(name: str) -> str:
    """How to get backend ``name``: its extra's install line, or how to find the right name."""
    found = _extras_for(name)
    if found:
        return _pip(found[0]) + "".join(f" (or {_pip(e)})" for e in found[1:])
    known = ", ".join(sorted(backend_extras())) or "none found: rlx-core is not installed as a package"
    return (f"check the name with `rlx doctor`; rlx-core has no extra for a backend named {name!r} "
            f"(its backend extras: {known}); a third-party backend comes from its author's package")


def default_backend_hint() -> str:
    """What to install when no backend is usable at all."""
    extras = backend_extras()
    first = "cpu" if "cpu" in extras else min(extras, default="")
    if not first:
        return "install a backend plugin (README, Install)"
    return f"{_pip(first)} (the CPU backend); other backends: {', '.join(sorted(extras))}"


def module_hint(module: str) -> str:
    """The install line for a missing importable ``module`` (its top-level package): the extras of
    rlx-core that require a distribution of that name, else a plain note that it is not installed."""
    top = _norm(module.split(".")[0])
    extras = sorted(e for e, dists in _extras().items() if top in dists and e != "all")
    if extras:
        return _pip(extras[0]) + "".join(f" (or {_pip(e)})" for e in extras[1:])
    return f"install the package that provides the {module.split('.')[0]!r} module"
