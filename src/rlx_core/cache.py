"""On-disk compile cache: legalized graphs keyed by graph hash, backend version and device.

Entries are written atomically (temp file + rename) so a crash or two processes racing never leave
a torn entry; a corrupt or stale entry is ignored and rebuilt, never trusted. The key also stamps
the source files of rlx_core and of the backend's package (newest modification time and count):
someone editing a plugin in a development install never gets graphs legalized by the old code.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import API_VERSION, __version__
from .dispatch import Assignment, Legalized, Plan
from .ir.graph import Graph

FORMAT = 1


def default_cache_dir() -> Path:
    env = os.environ.get("RLX_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rlx"


@functools.cache
def source_stamp(package_dir: str) -> str:
    """``"<newest mtime_ns>:<file count>"`` of the ``.py`` files under ``package_dir`` (once a
    process: a few milliseconds for rlx_core's ~100 files)."""
    latest, count = 0, 0
    for p in Path(package_dir).rglob("*.py"):
        try:
            latest = max(latest, p.stat().st_mtime_ns)
        except OSError:
            continue
        count += 1
    return f"{latest}:{count}"


def _package_dir(module_name: str | None) -> str:
    mod = sys.modules.get(module_name or "")
    f = getattr(mod, "__file__", None)
    return str(Path(f).parent) if f else ""


class CompileCache:
    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir() / "compile"
        self.hits = 0
        self.misses = 0

    def key(self, graph: Graph, backend: Any, device: Any, variant: str = "") -> str:
        h = hashlib.sha256()
        stamps = [source_stamp(d) if d else "" for d in (
            _package_dir(__package__), _package_dir(getattr(backend.plugin, "__name__", None)))]
        for part in (graph.fingerprint, backend.name, backend.entry.distribution, backend.info.version,
                     __version__, API_VERSION, device.name, str(FORMAT), variant, *stamps):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.pkl"

    def load(self, graph: Graph, backend: Any, device: Any, variant: str = "") -> Legalized | None:
        from .ir.serialize import graph_from_structure

        p = self.path(self.key(graph, backend, device, variant))
        try:
            with open(p, "rb") as f:
                data = pickle.load(f)
            if data.get("format") != FORMAT:
                raise ValueError("old cache format")
            weights = dict(graph.weights)
            weights.update(data["consts"])
            legal_graph = graph_from_structure(data["structure"], weights)
            assignments = {n: Assignment(backend.claim_by_name(device, c), o, path)
                           for n, (c, o, path) in data["assignments"].items()}
            plans = {n: _plan_from(d) for n, d in data["plans"].items()}
        except FileNotFoundError:
            self.misses += 1
            return None
        except Exception:  # a stale or corrupt entry is rebuilt, never trusted
            self.misses += 1
            return None
        self.hits += 1
        legal = Legalized(legal_graph, assignments, plans, tuple(tuple(x) for x in data["outputs"]),
                          backend.name, device.name)
        legal.extra.update(data.get("extra", {}))
        return legal

    def store(self, graph: Graph, backend: Any, device: Any, legal: Legalized, variant: str = "") -> None:
        orig = set(graph.weights)
        data = {
            "format": FORMAT,
            "structure": legal.graph.structure(),
            "consts": {k: v for k, v in legal.graph.weights.items() if k not in orig},
            "assignments": {n: (a.claim.name, a.origin, a.path) for n, a in legal.assignments.items()},
            "plans": {n: _plan_to(p) for n, p in legal.plans.items()},
            "outputs": [list(x) for x in legal.outputs],
            "extra": {k: legal.extra[k] for k in ("fused", "fused_origins", "kernels") if k in legal.extra},
        }
        p = self.path(self.key(graph, backend, device, variant))
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-", suffix=".pkl")
            try:
                with os.fdopen(fd, "wb") as f:
                    pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
                os.replace(tmp, p)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError:
            pass  # a read-only or full cache directory must not break compilation

    def clear(self) -> int:
        n = 0
        if self.root.exists():
            for f in self.root.rglob("*.pkl"):
                f.unlink(missing_ok=True)
                n += 1
        return n


class _CachedVariant:
    """Enough of a NodeVariant for the report when it comes from the cache."""

    def __init__(self, op: str, text: str) -> None:
        self.op = op
        self._text = text

    def describe(self) -> str:
        return self._text


def _plan_to(p: Plan) -> dict[str, Any]:
    return {"kind": p.kind, "op": p.variant.op, "variant": p.variant.describe(), "via": p.via,
            "kernels": p.kernels(), "cost": p.cost}


class _CachedPlan:
    def __init__(self, d: dict[str, Any]) -> None:
        self.kind = d["kind"]
        self.variant = _CachedVariant(d["op"], d["variant"])
        self.via = d["via"]
        self._kernels = list(d["kernels"])
        self.cost = float(d["cost"])

    def kernels(self) -> list[str]:
        return self._kernels


def _plan_from(d: dict[str, Any]) -> Any:
    return _CachedPlan(d)
