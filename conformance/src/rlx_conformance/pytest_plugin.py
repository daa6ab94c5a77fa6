"""The suite as pytest tests: ``pytest -p rlx_conformance --rlx-backend cpu``.

Each check becomes one test (its id is the test id); skipped checks are pytest skips (not
certified), manifest xfails are pytest xfails, and a stale manifest line (xpassed) fails.
``--rlx-json`` / ``--rlx-markdown`` write the same certificate as ``rlx conformance``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

SUITE_FILE = Path(__file__).with_name("suite_tests.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("rlx-conformance", "RLX conformance suite")
    g.addoption("--rlx-backend", default=None, help="backend (or BACKEND:INDEX) to certify")
    g.addoption("--rlx-xfails", default=None, help="expected-failure manifest (default: the plugin's)")
    g.addoption("--rlx-json", default=None, help="write the certificate as JSON")
    g.addoption("--rlx-markdown", default=None, help="write the certificate as Markdown")


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("--rlx-backend"):
        return
    # With no explicit paths, `pytest -p rlx_conformance --rlx-backend X` runs just the suite.
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = [str(SUITE_FILE)]
    config.stash[_STATE] = _State()


class _State:
    def __init__(self) -> None:
        self.results: list[Any] = []
        self.ctx: Any = None
        self.manifest: dict[str, str] = {}


_STATE = pytest.StashKey[_State]()


def state(config: pytest.Config) -> _State:
    return config.stash[_STATE]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if not config.getoption("--rlx-backend") or _STATE not in config.stash:
        return
    st = state(config)
    if st.ctx is None:
        return
    import datetime as _dt

    import rlx_core

    from . import SUITE_VERSION, __version__
    from .certificate import Certificate

    b, d = st.ctx.backend, st.ctx.device
    cert = Certificate(b.name, b.entry.distribution, b.info.version, rlx_core.__version__, b.info.api_version,
                       f"{SUITE_VERSION} (rlx-conformance {__version__})", d.name, dict(d.details),
                       _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), st.results,
                       keyword=config.getoption("keyword") or None)
    if config.getoption("--rlx-json"):
        cert.write_json(config.getoption("--rlx-json"))
    if config.getoption("--rlx-markdown"):
        cert.write_markdown(config.getoption("--rlx-markdown"))
