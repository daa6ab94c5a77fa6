"""The suite as pytest tests: ``pytest -p rlx_conformance --rlx-backend cpu``.

One test per variant (``op::add[f32]``, ``graph::mlp[f32]``, ``contract::determinism``) runs all of
that variant's checks, so the pytest route costs about what ``rlx conformance`` does (pytest adds
about a millisecond per test: one test per check made a small backend's run 3x slower). A variant
fails when any check failed, errored or xpassed (the message lists them), is skipped when every
check was skipped (not certified), xfails when its checks are manifest xfails, and passes otherwise.
``-k`` also matches check ids (``-k "matmul and broadcast"``): a selected variant then runs only its
matching checks. ``--rlx-each-check`` gives one test per check instead. ``--rlx-json`` /
``--rlx-markdown`` write the same certificate as ``rlx conformance``.
"""

from __future__ import annotations

import gc
import time
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
    g.addoption("--rlx-each-check", action="store_true", default=False,
                help="one test per check instead of one per variant (pytest adds ~1 ms per test)")


def pytest_configure(config: pytest.Config) -> None:
    backend = config.getoption("--rlx-backend")
    if not backend:
        return
    # With no explicit paths, `pytest -p rlx_conformance --rlx-backend X` runs just the suite.
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = [str(SUITE_FILE)]
    from rlx_core.plugin import RLXError

    from .runner import load_manifest, open_context

    st = _State()
    # Loaded before collection: a wrong name is one usage error (not one error per check), and the
    # ops the plugin registers (rlx_ops) get their checks, as with `rlx conformance`.
    try:
        st.ctx = open_context(backend)
        st.xfails_file, st.manifest = load_manifest(st.ctx, config.getoption("--rlx-xfails"))
    except (RLXError, ValueError, OSError) as e:
        raise pytest.UsageError(f"--rlx-backend {backend}: {e}") from e
    config.stash[_STATE] = st


class _State:
    def __init__(self) -> None:
        self.results: list[Any] = []
        self.ctx: Any = None
        self.manifest: dict[str, str] = {}
        self.xfails_file: Path | None = None
        self.check_ids: set[str] = set()
        self.t0 = time.perf_counter()


_STATE = pytest.StashKey[_State]()


def state(config: pytest.Config) -> _State:
    return config.stash[_STATE]


def pytest_itemcollected(item: pytest.Item) -> None:
    # `-k` matches the ids of a variant test's checks too, so check-level selection still works.
    checks = getattr(getattr(item, "callspec", None), "params", {}).get("checks")
    if checks is not None and _STATE in item.config.stash:
        item.extra_keyword_matches.update(c.id for c in checks)


def pytest_collection_finish(session: pytest.Session) -> None:
    if _STATE in session.config.stash:
        # Collection leaves ~200k long-lived objects (pytest's items, the checks): frozen, the cyclic
        # GC stops re-scanning them at each full collection and at pytest's 5 collections on exit
        # (about 2 s of a small backend's run, half of what pytest cost over `rlx conformance`).
        gc.freeze()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if not config.getoption("--rlx-backend") or _STATE not in config.stash:
        return
    st = state(config)
    if st.ctx is None or not st.results:
        return
    from .runner import make_certificate

    keyword = config.getoption("keyword") or None
    stale = sorted(set(st.manifest) - st.check_ids) if keyword is None else []
    cert = make_certificate(st.ctx, st.results, keyword=keyword, xfails_file=st.xfails_file,
                            stale_xfails=stale, seconds=time.perf_counter() - st.t0)
    if stale and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if config.getoption("--rlx-json"):
        cert.write_json(config.getoption("--rlx-json"))
    if config.getoption("--rlx-markdown"):
        cert.write_markdown(config.getoption("--rlx-markdown"))
    config.stash[_VERDICT] = (cert.verdict, stale)


_VERDICT = pytest.StashKey[tuple[str, list[str]]]()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _VERDICT not in config.stash:
        return
    verdict, stale = config.stash[_VERDICT]
    for s in stale:
        terminalreporter.write_line(f"stale xfail: {s} is in the manifest but is no check: remove the line",
                                    yellow=True)
    terminalreporter.write_line(f"rlx conformance: {verdict}", bold=True)
