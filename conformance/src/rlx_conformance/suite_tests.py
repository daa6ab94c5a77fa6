"""Collected only through the rlx_conformance pytest plugin (needs ``--rlx-backend``)."""

from __future__ import annotations

import pytest

from rlx_conformance.checks import Check, collect
from rlx_conformance.pytest_plugin import state
from rlx_conformance.runner import keyword_filter, run_check

BAD = ("failed", "error", "xpassed")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "checks" not in metafunc.fixturenames:
        return
    checks = collect()  # the backend is loaded (pytest_configure): its own ops are included
    state(metafunc.config).check_ids = {c.id for c in checks}
    if metafunc.config.getoption("--rlx-each-check"):
        groups, ids = [[c] for c in checks], [c.id for c in checks]
    else:
        by: dict[str, list[Check]] = {}
        for c in checks:
            by.setdefault(f"{c.kind}::{c.variant}", []).append(c)
        groups, ids = list(by.values()), list(by)
    metafunc.parametrize("checks", groups, ids=ids)


def test_conformance(checks: list[Check], request: pytest.FixtureRequest) -> None:
    st = state(request.config)
    keyword = request.config.getoption("keyword")
    if keyword and len(checks) > 1:
        # Selected through one of its check ids: run those (a -k on pytest names keeps them all).
        chosen = [c for c in checks if keyword_filter(keyword)(c.id)]
        checks = chosen or checks
    results = [run_check(c, st.ctx, st.manifest) for c in checks]
    st.results.extend(results)
    bad = [r for r in results if r.status in BAD]
    if bad:
        lines = [f"{r.id}: {r.status}: {r.message[:300]}" for r in bad[:20]]
        more = f"\n... and {len(bad) - 20} more" if len(bad) > 20 else ""
        pytest.fail(f"{len(bad)} of {len(results)} checks {'/'.join(sorted({r.status for r in bad}))}:\n"
                    + "\n".join(lines) + more, pytrace=False)
    if any(r.status == "passed" for r in results):
        return
    if all(r.status == "skipped" for r in results):
        pytest.skip(f"not certified: {results[0].message}")
    xf = [r for r in results if r.status == "xfailed"]
    pytest.xfail(xf[0].message if xf else results[0].message)
