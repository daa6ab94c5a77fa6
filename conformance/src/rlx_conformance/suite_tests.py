"""Collected only through the rlx_conformance pytest plugin (needs ``--rlx-backend``)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from rlx_conformance.certificate import Result
from rlx_conformance.checks import Check, Context, collect
from rlx_conformance.pytest_plugin import state
from rlx_conformance.runner import find_xfails, parse_xfails


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "check" in metafunc.fixturenames:
        checks = collect()
        metafunc.parametrize("check", checks, ids=[c.id for c in checks])


@pytest.fixture(scope="session")
def ctx(request: pytest.FixtureRequest) -> Context:
    from rlx_core.plugin import Hub, Session, parse_device

    config = request.config
    st = state(config)
    if st.ctx is None:
        name, idx = parse_device(config.getoption("--rlx-backend"))
        hub = Hub()
        b = hub.load(name)
        d = b.device(idx)
        st.ctx = Context(b, d, hub, Session(d.name, hub=hub, use_cache=False))
        xf = config.getoption("--rlx-xfails")
        path = Path(xf) if xf else find_xfails(b)
        st.manifest = parse_xfails(path.read_text(), str(path)) if path else {}
    return st.ctx


def test_conformance(check: Check, ctx: Context, request: pytest.FixtureRequest) -> None:
    st = state(request.config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = check.run(ctx)
    status, msg = out.status, out.message
    if check.id in st.manifest:
        if status in ("failed", "error"):
            status, msg = "xfailed", f"{st.manifest[check.id]} ({msg})"
        elif status == "passed":
            status, msg = "xpassed", "listed in conformance-xfails.txt but passes: remove the line"
    st.results.append(Result(check.id, check.kind, check.variant, status, msg, out.path, check.op,
                             check.dtype))
    if status == "skipped":
        pytest.skip(f"not certified: {msg}")
    if status == "xfailed":
        pytest.xfail(msg)
    if status != "passed":
        pytest.fail(f"{status}: {msg}", pytrace=False)
