"""CI runs each backend's conformance cases once: tests reuse the certification's results (RLX_CERT_DIR)
when they match what the test would run, and run the suite themselves otherwise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rlx_conformance import reuse, run_suite
from rlx_conformance.certificate import Certificate
from rlx_conformance.reuse import certified_or_run, run_env

KW = "op::add[f32] and not twice"


@pytest.fixture
def certified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Certificate:
    cert = run_suite("whole", keyword=None, checks=[c for c in reuse.collect() if "op::add[f32]" in c.id])
    cert.keyword = None  # as `rlx conformance whole` writes it: a full run
    cert.write_results(tmp_path / "whole.results.json", env=run_env())
    monkeypatch.setenv("RLX_CERT_DIR", str(tmp_path))
    return cert


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []
    real = reuse.run_suite

    def spy(backend: str, **kw: Any) -> Certificate:
        calls.append([c.id for c in kw["checks"]] if kw.get("checks") is not None else ["<all>"])
        return real(backend, **kw)
    monkeypatch.setattr(reuse, "run_suite", spy)
    return calls


def test_results_round_trip(certified: Certificate, tmp_path: Path) -> None:
    back, env = Certificate.read_results(tmp_path / "whole.results.json")
    assert back.results == certified.results and back.device == certified.device and env == run_env()
    assert back.to_json()["variants"] == json.loads(json.dumps(certified.to_json()["variants"]))


def test_matching_checks_are_reused_not_run(certified: Certificate,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy(monkeypatch)
    cert = certified_or_run("whole", keyword=KW)
    assert calls == []
    want = run_suite("whole", keyword=KW)
    assert [(r.id, r.status) for r in cert.results] == [(r.id, r.status) for r in want.results]
    assert cert.keyword == KW and cert.certified == want.certified


def test_checks_the_certification_lacks_are_run(certified: Certificate,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy(monkeypatch)
    cert = certified_or_run("whole", keyword="op::add[f32]-basic or op::sin[f32]-basic")
    (ran,) = calls
    assert ran and all(i.startswith("op::sin[f32]") for i in ran)
    ids = {r.id for r in cert.results}
    assert any(i.startswith("op::add[f32]") for i in ids) and set(ran) <= ids


def test_other_settings_or_device_or_no_dir_run_the_suite(certified: Certificate,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy(monkeypatch)
    monkeypatch.setenv("RLX_WASM_SIMD", "0")  # any RLX_* setting the certification did not run under
    certified_or_run("whole", keyword=KW)
    monkeypatch.delenv("RLX_WASM_SIMD")
    assert reuse.reusable("whole:1") is None and reuse.reusable("whole:0") is not None
    monkeypatch.delenv("RLX_CERT_DIR")
    certified_or_run("whole", keyword=KW)
    assert calls == [["<all>"], ["<all>"]]


def test_a_failure_in_the_certification_reaches_the_test(certified: Certificate, tmp_path: Path) -> None:
    path = tmp_path / "whole.results.json"
    data = json.loads(path.read_text())
    data["results"][0][3] = "failed"
    path.write_text(json.dumps(data))
    cert = certified_or_run("whole", keyword=KW)
    assert cert.counts()["failed"] == 1 and not cert.certified
