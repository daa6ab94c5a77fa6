"""Run each backend's conformance cases once per CI run: tests reuse the certification's results.

CI (``scripts/dev.sh test``) certifies every CI plugin first with ``rlx conformance B --results
DIR/B.results.json`` and then runs pytest with ``RLX_CERT_DIR=DIR``. A test that needs the suite's
verdict on a backend calls :func:`certified_or_run` instead of :func:`~rlx_conformance.run_suite`:
with a matching results file it rebuilds the certificate from it (a ``keyword`` selects the same
checks ``run_suite(keyword=...)`` would run); without one (a developer's plain ``pytest``, a backend
CI did not certify, other settings) it runs the suite itself, so every assertion is still checked.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from rlx_core.plugin import Hub, parse_device

from .certificate import Certificate
from .checks import collect
from .runner import keyword_filter, run_suite
from .settings import CERT_DIR

#: Settings that cannot change a check's outcome: where caches and certificates live, which plugins
#: are listed for selection (the backend is named explicitly), and reporting switches.
NEUTRAL = frozenset({CERT_DIR.name, "RLX_CACHE_DIR", "RLX_NO_CACHE", "RLX_BACKENDS", "RLX_DISABLE_PLUGINS",
                     "RLX_DEBUG", "RLX_DISPATCH_REPORT", "RLX_PLUGIN_IMPORT_TIMEOUT"})


def run_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``RLX_*`` settings a conformance run depends on."""
    env = os.environ if env is None else env
    return {k: v for k, v in sorted(env.items()) if k.startswith("RLX_") and k not in NEUTRAL}


def reusable(backend: str, env: Mapping[str, str] | None = None) -> Certificate | None:
    """The full certificate of ``backend`` from ``$RLX_CERT_DIR/<name>.results.json``, when that file
    exists, is a full run on the same device, and ran under the same settings; else ``None``."""
    env = os.environ if env is None else env
    folder = CERT_DIR.get(env)
    if not folder:
        return None
    name, index = parse_device(backend)
    path = Path(folder) / f"{name}.results.json"
    if not path.is_file():
        return None
    cert, ran_under = Certificate.read_results(path)
    if cert.keyword is not None or cert.backend != name or ran_under != run_env(env):
        return None
    if index is not None and cert.device != f"{name}:{index}":
        return None
    return cert


def certified_or_run(backend: str, *, keyword: str | None = None) -> Certificate:
    """``run_suite(backend, keyword=keyword)``, read from this CI run's certification when it has it.

    The checks are those this process would run (ops a test registered, e.g. the quantized ones, are
    included): the ones the certification ran are taken from it, only the others run now.
    """
    cert = reusable(backend)
    if cert is None:
        return run_suite(backend, keyword=keyword)
    # As run_suite does: load the backend first, so the ops it registers (rlx_ops) have their checks.
    Hub().load(parse_device(backend)[0])
    keep = keyword_filter(keyword)
    todo = [c for c in collect() if keep(c.id)]
    have = {r.id: r for r in cert.results}
    missing = [c for c in todo if c.id not in have]
    extra = run_suite(backend, keyword=keyword, checks=missing) if missing else None
    ran = {r.id: r for r in extra.results} if extra is not None else {}
    return dataclasses.replace(
        cert, results=[have[c.id] if c.id in have else ran[c.id] for c in todo], keyword=keyword,
        stale_xfails=cert.stale_xfails if keyword is None else [],
        seconds=cert.seconds + (extra.seconds if extra is not None else 0.0))
