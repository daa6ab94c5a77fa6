"""The conformance suite itself: certification, manifests, filters and the pytest entry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rlx_conformance import run_suite
from rlx_conformance.checks import CONTRACT, collect, op_checks
from rlx_conformance.reuse import certified_or_run
from rlx_conformance.runner import keyword_filter, parse_xfails

from rlx_core.ir.schema import REGISTRY


@pytest.fixture(scope="module")
def cpu_cert() -> object:
    # CI certified cpu before pytest (RLX_CERT_DIR): its results are reused, not run again.
    return certified_or_run("cpu")


def test_cpu_is_certified_with_zero_failures(cpu_cert: object) -> None:
    c = cpu_cert.counts()  # type: ignore[attr-defined]
    assert c["failed"] == 0 and c["error"] == 0 and c["xpassed"] == 0, cpu_cert.to_markdown()[:3000]  # type: ignore[attr-defined]
    assert cpu_cert.certified  # type: ignore[attr-defined]
    assert c["passed"] > 5000


def test_json_lists_every_op_variant(cpu_cert: object, tmp_path: Path) -> None:
    cpu_cert.write_json(tmp_path / "cert.json")  # type: ignore[attr-defined]
    data = json.loads((tmp_path / "cert.json").read_text())
    for key in ("backend", "plugin", "core_version", "suite_version", "device", "date", "verdict"):
        assert key in data
    variants = data["variants"]
    for schema in REGISTRY.schemas("mir"):
        for dt in schema.dtypes:
            v = variants.get(f"{schema.name}[{dt.value}]")
            assert v is not None, f"{schema.name}[{dt.value}] missing from the certificate"
            assert v["verdict"] == "certified", (schema.name, dt.value, v)
    assert all(r["status"] in ("failed", "error", "skipped", "xfailed", "xpassed") for r in data["results"])
    assert len(data["passed"]) == data["counts"]["passed"]
    assert variants["determinism"]["verdict"] == "certified"


def test_skipped_is_not_certified_never_passed() -> None:
    cert = run_suite("whole", keyword="op::sin or op::add[f32]-basic")
    v = cert.variants()
    assert v["sin[f32]"]["verdict"] == "not certified" and v["sin[f32]"]["passed"] == 0
    assert v["add[f32]"]["verdict"] in ("certified", "partial")
    md = cert.to_markdown()
    assert "Not certified (skipped)" in md and "`sin[f32]`" in md


def test_xfail_manifest(tmp_path: Path) -> None:
    ids = [c.id for c in op_checks([REGISTRY.get("sin")]) if "[f32]" in c.id][:2]
    manifest = tmp_path / "conformance-xfails.txt"
    manifest.write_text(f"# comment\n{ids[0]}  # known to fail on this test rig\n")
    cert = run_suite("cpu", keyword=f"{ids[0]} and not twice", xfails=manifest)
    # The check passes on cpu, so the manifest is stale: reported and blocking.
    (r,) = cert.results
    assert r.status == "xpassed" and "remove the line" in r.message
    assert not cert.certified


def test_manifest_line_needs_a_reason() -> None:
    with pytest.raises(ValueError, match="has no reason"):
        parse_xfails("op::add[f32]-basic\n")
    assert parse_xfails("a  # why\n\n# c\n") == {"a": "why"}


def test_keyword_filter() -> None:
    f = keyword_filter("matmul and f32 and not broadcast")
    assert f("op::matmul[f32]-basic") and not f("op::matmul[f32]-broadcast") and not f("op::add[f32]")
    with pytest.raises(ValueError):
        keyword_filter("and and")


def test_collect_covers_contract_ops_and_ids_are_unique() -> None:
    checks = collect()
    ids = [c.id for c in checks]
    assert len(ids) == len(set(ids))
    kinds = {c.kind for c in checks}
    assert {"contract", "op"} <= kinds
    assert {c.variant for c in checks if c.kind == "contract"} >= {
        "native_kernels_ran", "unsupported_variant_fails", "determinism", "two_sessions_two_threads",
        "memory_reuse_no_corruption", "costs_positive_and_growing", "records"}


def test_cli_and_pytest_entry_points(tmp_path: Path) -> None:
    rlx = Path(sys.executable).with_name("rlx")
    r = subprocess.run([str(rlx), "conformance", "whole", "-q", "-k", "contract", "--json",
                        str(tmp_path / "c.json"), "--markdown", str(tmp_path / "c.md")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((tmp_path / "c.json").read_text())["certified"]
    assert "# Conformance certificate: `whole`" in (tmp_path / "c.md").read_text()
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "rlx_conformance", "--rlx-backend", "whole",
                        "-q", "-k", "contract", "--rlx-json", str(tmp_path / "p.json")],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    n_contract = len(CONTRACT)
    assert f"{n_contract} passed" in r.stdout
    assert json.loads((tmp_path / "p.json").read_text())["counts"]["passed"] == n_contract
