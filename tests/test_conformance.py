"""The conformance suite itself: certification, manifests, filters and the pytest entry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PluginFactory
from rlx_conformance import run_suite
from rlx_conformance.certificate import Certificate, read_json
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
        if schema.extra.get("collective"):
            continue  # certified across ranks: `rlx conformance cpu --world N` (tests/test_distributed.py)
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
    # One pytest test per variant: add[f32]'s checks all run in one test; -k also matches check ids.
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "rlx_conformance", "--rlx-backend", "whole",
                        "-q", "-k", "contract or op::add[f32]", "--rlx-json", str(tmp_path / "p.json")],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    n_contract, n_add = len(CONTRACT), sum("op::add[f32]" in c.id for c in collect())
    assert f"{n_contract + 1} passed" in r.stdout
    assert f"rlx conformance: certified for {n_contract + 1} of {n_contract + 1} variants" in r.stdout
    assert json.loads((tmp_path / "p.json").read_text())["counts"]["passed"] == n_contract + n_add


def test_pytest_route_one_test_per_check_on_request(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "rlx_conformance", "--rlx-backend", "whole",
                        "-q", "-p", "no:cacheprovider", "-k", "op::add[f32]", "--rlx-each-check"],
                       capture_output=True, text=True, cwd=tmp_path)
    n_checks = sum("op::add[f32]" in c.id for c in collect())
    assert r.returncode == 0 and f"{n_checks} passed" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]


def test_pytest_route_unknown_backend_is_one_usage_error(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "rlx_conformance", "--rlx-backend", "nosuch",
                        "-q", "-p", "no:cacheprovider"], capture_output=True, text=True, cwd=tmp_path,
                       timeout=60)
    assert r.returncode == pytest.ExitCode.USAGE_ERROR, r.stdout[-2000:] + r.stderr[-2000:]
    err = r.stderr
    assert err.count("ERROR:") == 1 and "--rlx-backend nosuch" in err and "no backend named 'nosuch'" in err
    assert "installed: " in err and "whole" in err and "fix:" in err
    assert "error" not in r.stdout.lower()  # no test ran, so none errored


def test_certificate_states_coverage_and_the_kernel_per_variant() -> None:
    cert = run_suite("whole", keyword="op::add[f16] or op::add[f32] or op::softmax[f32] or op::sin[f32]")
    cov = cert.coverage()
    assert (cov["variants"], cov["certified"], cov["not_claimed"]) == (4, 3, 1)
    assert cert.verdict.startswith("certified for 3 of 4 variants; 1 not claimed")
    v = cert.variants()
    assert "whole.add" in v["add[f32]"]["kernels"]  # equal shapes: the native kernel
    assert any(k.startswith("rewrite materialize_broadcast -> ") for k in v["add[f32]"]["kernels"])
    assert all(k.startswith("rewrite compute_f16_in_f32 -> ") for k in v["add[f16]"]["kernels"])
    assert all(k.startswith("decomposition core.softmax -> whole.") for k in v["softmax[f32]"]["kernels"])
    assert v["sin[f32]"]["kernels"] == []  # nothing compiled: nothing served it
    md = cert.to_markdown().splitlines()
    assert md[2] == f"**Verdict: {cert.verdict}**"
    assert md[4].startswith("Coverage: 3 of 4 variants certified, ") and "**not certified**" in md[4]
    assert any(line.startswith("| `add[f32]` | op | certified |") and "whole.add" in line for line in md)
    data = cert.to_json()
    assert data["coverage"] == cov and data["variants"]["add[f32]"]["kernels"] == v["add[f32]"]["kernels"]


def test_certificates_written_before_kernels_and_coverage_still_read(tmp_path: Path) -> None:
    # A trimmed copy of the cuda certificate made on the H200 in the earlier format (956d2c6).
    old = read_json(Path(__file__).parent / "data" / "cert-before-kernels.json")
    assert old["certified"] is True and old["coverage"]["variants"] == len(old["variants"])
    assert old["coverage"]["checks_passed"] == old["counts"]["passed"]
    assert all(v["kernels"] == [] for v in old["variants"].values())
    # A results file of 8-field rows (before kernels were recorded) reads back too.
    cert = run_suite("whole", keyword="op::add[f32]-basic and not twice")
    cert.write_results(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    data["results"] = [row[:8] for row in data["results"]]
    (tmp_path / "r.json").write_text(json.dumps(data))
    back, _ = Certificate.read_results(tmp_path / "r.json")
    assert [(r.id, r.status, r.kernels) for r in back.results] == [(r.id, r.status, "") for r in cert.results]
    with pytest.raises(ValueError, match="not an rlx-conformance certificate"):
        (tmp_path / "x.json").write_text("{}")
        read_json(tmp_path / "x.json")


#: A backend that claims one op (neg f32), no matmul: its kernels are still checked for running.
ONE_OP = """
from collections import Counter
import numpy as np
from rlx_core import API_VERSION
from rlx_core.plugin import BackendInfo, DeviceCaps, DeviceInfo, KernelClaim, hookimpl

@hookimpl
def rlx_backend_info():
    return BackendInfo(name="{name}", version="1.0", api_version=API_VERSION, description="test: neg only")

@hookimpl
def rlx_probe_devices():
    caps = DeviceCaps(peak_flops={{"default": 1e8}}, mem_bandwidth=1e8, launch_overhead=1e-4)
    return [DeviceInfo(backend="{name}", name="{name}:0", available=True, caps=caps)]

@hookimpl
def rlx_kernels(device):
    return [KernelClaim(op="neg", name="{name}.neg", dtypes={{"f32"}})]

class Prog:
    def __init__(self, program):
        self.program = program

    def run(self, inputs):
        return self.profile(inputs)[0]

    def profile(self, inputs):
        env = {{k: np.asarray(v) for k, v in inputs.items()}}
        counts = Counter()
        for s in self.program.kernels:
            env[s.outputs[0]] = np.negative(env[s.inputs[0]])
            counts[s.kernel] += {counted}
        return {{v: env[v].copy() for _, v in self.program.outputs}}, counts

@hookimpl
def rlx_compile(program, device):
    return Prog(program)
"""


def test_native_kernels_ran_checks_any_claimed_op(make_plugin: PluginFactory) -> None:
    make_plugin("rlx-negonly", "negonly", ONE_OP.format(name="negonly", counted=1))
    make_plugin("rlx-negghost", "negghost", ONE_OP.format(name="negghost", counted=0))
    kw = "contract::native_kernels_ran or op::neg[f32]-basic"
    cert = run_suite("negonly", keyword=kw)
    (native,) = [r for r in cert.results if r.id == "contract::native_kernels_ran"]
    assert native.status == "passed" and "(1 distinct kernels)" in native.message, native
    assert cert.variants()["neg[f32]"]["kernels"] == ["negonly.neg"]
    # Correct numbers, but the kernel the report names never ran: caught without any matmul claim.
    cert = run_suite("negghost", keyword=kw)
    (native,) = [r for r in cert.results if r.id == "contract::native_kernels_ran"]
    assert native.status == "failed" and "ran negghost.neg" in native.message, native
    assert "never called it" in native.message and not cert.certified
