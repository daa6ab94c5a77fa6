"""The ``rlx`` command line, driven through click's CliRunner (and once as a real process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _plugintools import plugin_source
from click.testing import CliRunner, Result
from conftest import PluginFactory

import rlx_core
from rlx_core import cli as cli_module
from rlx_core._hub import Hub, reset_hub
from rlx_core.cli import cli
from rlx_core.errors import InputError

# ---------------------------------------------------------------------------------------------
# Fixtures and helpers


def _reset_hub_with_env(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    """Set environment variables, then replace the process-wide hub so the CLI sees them."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    reset_hub(Hub())


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Deterministic: only the cpu backend, whatever else is installed in the environment.
    _reset_hub_with_env(monkeypatch, RLX_BACKENDS="cpu")
    monkeypatch.delenv("RLX_DEBUG", raising=False)
    monkeypatch.delenv("RLX_NO_CACHE", raising=False)
    monkeypatch.setenv("COLUMNS", "120")
    yield
    monkeypatch.delenv("RLX_BACKENDS", raising=False)
    reset_hub(Hub())


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def invoke(runner: CliRunner, *args: str) -> Result:
    return runner.invoke(cli, list(args), prog_name="rlx")


def assert_clean_error(result: Result, *fragments: str) -> None:
    """Exit 1, a what/where/fix block on stderr, and no Python traceback anywhere."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)
    for f in fragments:
        assert f in result.stderr, result.stderr
    assert "fix:" in result.stderr


@pytest.fixture
def serialize() -> Any:
    # Only skipped if the model-file module is missing from this checkout.
    return pytest.importorskip("rlx_core.ir.serialize")


W = np.arange(6, dtype=np.float32).reshape(3, 2) / 4


@pytest.fixture
def model(tmp_path: Path, serialize: Any) -> Path:
    """x: f32[batch, 3] -> p = softmax(x @ w), s = sum(x @ w)."""
    from rlx_core.ir import GraphBuilder

    g = GraphBuilder("tiny")
    x = g.input("x", "f32", ("batch", 3))
    w = g.param("w", W)
    h = x @ w
    g.output(g.softmax(h), "p")
    g.output(h.sum(), "s")
    path = tmp_path / "tiny.rlx"
    serialize.save(g.build(), path)
    return path


@pytest.fixture
def static_model(tmp_path: Path, serialize: Any) -> Path:
    from rlx_core.ir import GraphBuilder

    g = GraphBuilder("static")
    x = g.input("x", "f32", (2, 3))
    i = g.input("i", "i32", (4,))
    g.output(x * 2.0, "y")
    g.output(i + 1, "j")
    path = tmp_path / "static.rlx"
    serialize.save(g.build(), path)
    return path


def _expected(x: np.ndarray) -> tuple[np.ndarray, float]:
    h = x.astype(np.float64) @ W.astype(np.float64)
    e = np.exp(h - h.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True), float(h.sum())


# ---------------------------------------------------------------------------------------------
# The group: help, version, lazy imports


def test_help_runs_as_a_process_without_heavy_imports() -> None:
    code = textwrap.dedent("""
        import sys
        from rlx_core import cli
        try:
            cli.main(["--help"])
        except SystemExit as e:
            assert e.code == 0, e.code
        heavy = [m for m in ("numpy", "rich", "rlx_core.ir", "rlx_core._hub", "rlx_core.runtime")
                 if m in sys.modules]
        assert not heavy, heavy
    """)
    subprocess.run([sys.executable, "-c", code], check=True)
    out = subprocess.run([sys.executable, "-m", "rlx_core.cli", "--help"], check=True, capture_output=True,
                         text=True).stdout
    for name in ("doctor", "run", "explain", "calibrate", "demo", "ops", "cache"):
        assert name in out
    script = Path(sys.executable).parent / "rlx"
    if script.exists():
        v = subprocess.run([str(script), "--version"], check=True, capture_output=True, text=True).stdout
        assert v.startswith("rlx 0.") and "plugin API" in v


@pytest.mark.parametrize("command", [["doctor"], ["run"], ["explain"], ["calibrate"], ["demo"], ["ops"],
                                     ["cache"], ["cache", "info"], ["cache", "clear"]])
def test_every_command_has_help_with_an_example(runner: CliRunner, command: list[str]) -> None:
    r = invoke(runner, *command, "--help")
    assert r.exit_code == 0, r.output
    assert "Example" in r.output


def test_unknown_command_is_a_usage_error(runner: CliRunner) -> None:
    r = invoke(runner, "frobnicate")
    assert r.exit_code == 2


def test_lazy_commands_are_listed_without_import_and_run(runner: CliRunner, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rlx_cli_ext_mod.py").write_text(textwrap.dedent("""
        import click

        @click.command()
        def hello() -> None:
            click.echo("hello from a lazy command")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli_module.LAZY_COMMANDS, "hello", ("rlx_cli_ext_mod:hello", "Say hello."))
    r = invoke(runner, "--help")
    assert "hello" in r.output and "Say hello." in r.output
    assert "rlx_cli_ext_mod" not in sys.modules
    assert "hello" not in invoke(runner, "cache", "--help").output  # top-level only
    r = invoke(runner, "hello")
    assert r.exit_code == 0 and "hello from a lazy command" in r.output
    sys.modules.pop("rlx_cli_ext_mod", None)


# ---------------------------------------------------------------------------------------------
# rlx doctor


def test_doctor_text_cpu_passes(runner: CliRunner) -> None:
    r = invoke(runner, "doctor")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "PASS" in out and "cpu" in out and "rlx-cpu" in out and "cpu:0" in out
    assert f"plugin API {rlx_core.API_VERSION}" in out and "NumPy" in out
    assert "RLX_BACKENDS=cpu" in out
    assert "1 passed, 0 failed" in out


def test_doctor_json(runner: CliRunner) -> None:
    r = invoke(runner, "doctor", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["exit_code"] == 0
    assert rep["core"]["api_version"] == rlx_core.API_VERSION and rep["core"]["numpy"] == np.__version__
    assert rep["core"]["env"]["RLX_BACKENDS"] == "cpu"
    (cpu,) = [b for b in rep["backends"] if b["name"] == "cpu"]
    assert cpu["status"] == "PASS" and cpu["api_version"] == rlx_core.API_VERSION
    assert cpu["distributions"][0]["name"] == "rlx-cpu"
    dev = cpu["devices"][0]
    assert dev["name"] == "cpu:0" and dev["available"] is True and dev["caps_source"]
    assert dev["check"]["status"] == "PASS"


def _doctor_json(runner: CliRunner) -> tuple[int, dict[str, Any]]:
    r = invoke(runner, "doctor", "--json")
    return r.exit_code, json.loads(r.stdout)


def test_doctor_reports_import_error_and_api_mismatch(runner: CliRunner, make_plugin: PluginFactory,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    make_plugin("rlx-broken", "broken", "import cupy_that_does_not_exist\n")
    make_plugin("rlx-future", "future", plugin_source("future", api="2.0"))
    _reset_hub_with_env(monkeypatch, RLX_BACKENDS="cpu,broken,future")
    code, rep = _doctor_json(runner)
    assert code == 1 and rep["exit_code"] == 1
    by = {b["name"]: b for b in rep["backends"]}
    assert by["cpu"]["status"] == "PASS"
    assert by["broken"]["status"] == "FAIL" and by["broken"]["kind"] == "import error"
    assert "cupy_that_does_not_exist" in by["broken"]["reason"]
    assert by["broken"]["distributions"] == [{"name": "rlx-broken", "version": "1.0",
                                              "entry_point": "rlx_broken_plugin"}]
    assert by["future"]["status"] == "FAIL" and by["future"]["kind"] == "API mismatch"
    assert "2.0" in by["future"]["reason"]
    # The text form shows the same reasons and no traceback.
    r = invoke(runner, "doctor")
    assert r.exit_code == 1
    assert "FAIL" in r.stdout and "import error" in r.stdout and "API mismatch" in r.stdout
    assert "Traceback" not in r.output


def test_doctor_reports_conflicting_distributions(runner: CliRunner, make_plugin: PluginFactory,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    make_plugin("rlx-twin-a", "twin", plugin_source("twin"))
    make_plugin("rlx-twin-b", "twin", plugin_source("twin"))
    _reset_hub_with_env(monkeypatch, RLX_BACKENDS="cpu,twin")
    code, rep = _doctor_json(runner)
    assert code == 1
    (twin,) = [b for b in rep["backends"] if b["name"] == "twin"]
    assert twin["status"] == "FAIL" and twin["kind"] == "conflicting distributions"
    assert {d["name"] for d in twin["distributions"]} == {"rlx-twin-a", "rlx-twin-b"}
    assert "uninstall" in twin["error"]["fix"]


def test_doctor_catches_a_wrong_result(runner: CliRunner, make_plugin: PluginFactory,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    source = plugin_source("liar") + textwrap.dedent("""
        class _Liar:
            def run(self, inputs):
                return {"y": np.zeros(4, np.float32)}

        @hookimpl
        def rlx_compile(program, device):
            return _Liar()
    """)
    make_plugin("rlx-liar", "liar", source)
    _reset_hub_with_env(monkeypatch, RLX_BACKENDS="liar")
    code, rep = _doctor_json(runner)
    assert code == 1
    (liar,) = [b for b in rep["backends"] if b["name"] == "liar"]
    assert liar["status"] == "FAIL" and liar["kind"] == "wrong result"
    assert liar["devices"][0]["check"]["status"] == "FAIL"


def test_doctor_skips_backends_outside_the_selection(runner: CliRunner, make_plugin: PluginFactory,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    make_plugin("rlx-other", "other", plugin_source("other"))
    _reset_hub_with_env(monkeypatch, RLX_BACKENDS="cpu")
    code, rep = _doctor_json(runner)
    assert code == 0
    by = {b["name"]: b for b in rep["backends"]}
    assert by["other"]["status"] == "SKIP" and "RLX_BACKENDS" in by["other"]["reason"]


def test_doctor_with_no_backends_exits_2(runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLX_BACKENDS")
    _reset_hub_with_env(monkeypatch, RLX_DISABLE_PLUGINS="all")
    r = invoke(runner, "doctor")
    assert r.exit_code == 2
    assert "disabled" in r.stdout
    code, rep = _doctor_json(runner)
    assert code == 2 and rep["backends"] == [] and rep["summary"]["installed"] == 0


# ---------------------------------------------------------------------------------------------
# rlx demo


def test_demo_runs_and_checks(runner: CliRunner) -> None:
    r = invoke(runner, "demo", "--batch", "3")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "Device ranking" in out and "<- chosen" in out
    assert "Chosen device: cpu:0" in out
    assert "Dispatch report" in out and "softmax" in out
    assert "Check against the reference evaluator: PASS" in out


def test_demo_with_explicit_device(runner: CliRunner) -> None:
    r = invoke(runner, "demo", "--device", "cpu")
    assert r.exit_code == 0, r.output
    assert "Device ranking" not in r.stdout and "--device" in r.stdout


def test_demo_fails_when_the_check_fails(runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_module, "DEMO_TOLERANCE", -1.0)
    r = invoke(runner, "demo", "--device", "cpu")
    assert r.exit_code == 1
    assert "FAIL" in r.stdout


def test_unknown_device_is_a_clean_error(runner: CliRunner) -> None:
    r = invoke(runner, "demo", "--device", "nosuchbackend")
    assert_clean_error(r, "'nosuchbackend'", "BackendNotFoundError")


# ---------------------------------------------------------------------------------------------
# rlx run


def test_run_with_input_file(runner: CliRunner, model: Path, tmp_path: Path) -> None:
    x = np.random.default_rng(3).standard_normal((5, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = invoke(runner, "run", str(model), "--input", f"x={tmp_path / 'x.npy'}", "--json",
               "--output-dir", str(tmp_path / "out"))
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    p_ref, s_ref = _expected(x)
    assert rep["device"] == "cpu:0"
    assert rep["outputs"]["p"]["shape"] == [5, 2] and rep["outputs"]["p"]["dtype"] == "f32"
    np.testing.assert_allclose(rep["outputs"]["p"]["preview"], p_ref.reshape(-1)[:8], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rep["outputs"]["s"]["stats"]["max"], s_ref, rtol=1e-5)
    saved = np.load(tmp_path / "out" / "p.npy")
    np.testing.assert_allclose(saved, p_ref, rtol=1e-5, atol=1e-6)
    assert rep["outputs"]["p"]["saved"] == str(tmp_path / "out" / "p.npy")
    # Text form: shapes, dtypes, preview and stats.
    r = invoke(runner, "run", str(model), "-i", f"x={tmp_path / 'x.npy'}")
    assert r.exit_code == 0, r.output
    assert "output p: f32[5,2]" in r.stdout and "mean" in r.stdout and "output s: f32[]" in r.stdout


def test_run_random_static_inputs(runner: CliRunner, static_model: Path) -> None:
    r = invoke(runner, "run", str(static_model), "--random", "--seed", "7", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["inputs"]["x"]["source"] == "random (seed 7)"
    assert rep["outputs"]["y"]["shape"] == [2, 3] and rep["outputs"]["j"]["dtype"] == "i32"
    again = json.loads(invoke(runner, "run", str(static_model), "--random", "--seed", "7", "--json").stdout)
    assert again["outputs"] == rep["outputs"]  # seeded


def test_run_random_symbolic_needs_a_size(runner: CliRunner, model: Path) -> None:
    r = invoke(runner, "run", str(model), "--random")
    assert_clean_error(r, "symbolic", "--bind batch=N")
    r = invoke(runner, "run", str(model), "--random", "--bind", "batch=4", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["outputs"]["p"]["shape"] == [4, 2]


def test_run_wrong_input_dtype_is_a_clean_error(runner: CliRunner, model: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x64.npy", np.ones((2, 3), np.float64))
    r = invoke(runner, "run", str(model), "--input", f"x={tmp_path / 'x64.npy'}")
    assert_clean_error(r, "dtype", "f32", "InputError")


def test_run_missing_and_malformed_inputs(runner: CliRunner, model: Path, tmp_path: Path) -> None:
    assert_clean_error(invoke(runner, "run", str(model)), "missing input", "--random")
    assert invoke(runner, "run", str(model), "--input", "x").exit_code == 2
    assert invoke(runner, "run", str(model), "--input", "nope=a.npy").exit_code == 2
    assert invoke(runner, "run", str(tmp_path / "absent.rlx")).exit_code == 2
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    assert_clean_error(invoke(runner, "run", str(model), "-i", f"x={tmp_path / 'bad.npy'}"), ".npy")
    (tmp_path / "bad.rlx").write_bytes(b"\0" * 16)
    assert_clean_error(invoke(runner, "run", str(tmp_path / "bad.rlx")))


def test_debug_shows_the_exception(runner: CliRunner, model: Path, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    np.save(tmp_path / "x64.npy", np.ones((2, 3), np.float64))
    r = invoke(runner, "--debug", "run", str(model), "-i", f"x={tmp_path / 'x64.npy'}")
    assert isinstance(r.exception, InputError)
    monkeypatch.setenv("RLX_DEBUG", "1")
    r = invoke(runner, "run", str(model), "-i", f"x={tmp_path / 'x64.npy'}")
    assert isinstance(r.exception, InputError)


def test_unexpected_exception_is_reported_without_traceback(runner: CliRunner,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(h: Any) -> Any:
        raise ZeroDivisionError("division by zero in a plugin")

    monkeypatch.setattr(cli_module, "doctor_report", boom)
    r = invoke(runner, "doctor")
    assert r.exit_code == 1
    assert "internal error" in r.stderr and "ZeroDivisionError" in r.stderr and "--debug" in r.stderr
    assert "Traceback" not in r.output


# ---------------------------------------------------------------------------------------------
# rlx explain


def test_explain_text_and_json(runner: CliRunner, model: Path) -> None:
    r = invoke(runner, "explain", str(model))
    assert r.exit_code == 0, r.output
    assert "Dispatch report: graph 'tiny' on cpu:0" in r.stdout and "softmax" in r.stdout
    assert "planned with size 1" in r.stderr
    r = invoke(runner, "explain", str(model), "--bind", "batch=8", "--json", "--device", "cpu")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["bindings"] == {"batch": 8} and rep["device"] == "cpu:0"
    assert rep["defaulted_symbols"] == []
    ops = {n["op"] for n in rep["nodes"]}
    assert {"matmul", "softmax"} <= ops


def test_explain_bad_bindings_are_usage_errors(runner: CliRunner, model: Path) -> None:
    assert invoke(runner, "explain", str(model), "--bind", "nope=3").exit_code == 2
    assert invoke(runner, "explain", str(model), "--bind", "batch=x").exit_code == 2
    assert invoke(runner, "explain", str(model), "--bind", "batch").exit_code == 2


# ---------------------------------------------------------------------------------------------
# rlx ops


def test_ops_listing(runner: CliRunner) -> None:
    r = invoke(runner, "ops")
    assert r.exit_code == 0, r.output
    assert "softmax" in r.stdout and "matmul" in r.stdout and "hir" in r.stdout
    r = invoke(runner, "ops", "--level", "mir", "--json")
    rows = json.loads(r.stdout)
    names = {o["name"] for o in rows}
    assert "matmul" in names and "softmax" not in names
    assert all(o["level"] == "mir" for o in rows)
    (hir,) = [o for o in json.loads(invoke(runner, "ops", "--json").stdout) if o["name"] == "softmax"]
    assert hir["level"] == "hir" and hir["category"] == "activation" and "f32" in hir["dtypes"]
    assert hir["attrs"][0]["name"] == "axis" and hir["attrs"][0]["default"] == -1


def test_ops_detail_and_unknown_op(runner: CliRunner) -> None:
    r = invoke(runner, "ops", "softmax")
    assert r.exit_code == 0 and "attr axis" in r.stdout
    assert_clean_error(invoke(runner, "ops", "sofmax"), "unknown op", "softmax")


# ---------------------------------------------------------------------------------------------
# rlx cache and rlx calibrate


def test_cache_info_and_clear(runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "cache"))
    assert invoke(runner, "demo", "--device", "cpu").exit_code == 0  # fills the compile cache
    info = json.loads(invoke(runner, "cache", "info", "--json").stdout)
    assert info["dir"] == str(tmp_path / "cache") and info["compile"]["entries"] >= 1
    r = invoke(runner, "cache", "clear")
    assert r.exit_code == 0 and f"removed {info['compile']['entries']} compiled-graph" in r.stdout
    assert json.loads(invoke(runner, "cache", "info", "--json").stdout)["compile"]["entries"] == 0
    assert not list((tmp_path / "cache").rglob("*.pkl"))


def test_calibrate_quick_writes_the_cache_file(runner: CliRunner, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path / "cache"))
    # --force: a busy test machine may time a benchmark far below the plugin's estimate, which
    # alone would refuse to store it (tests/test_calibrate_robust.py covers the refusal).
    r = invoke(runner, "calibrate", "cpu", "--quick", "--force")
    assert r.exit_code == 0, r.output
    files = list((tmp_path / "cache" / "calibration").glob("cpu-*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["backend"] == "cpu" and data["mem_bandwidth"] > 0 and data["peak_flops"]["f32"] > 0
    assert data["method"]["rounds"] == 3 and data["method"]["benchmarks"]["gemm f32"]["best"] > 0
    # rich breaks a long path wherever the console width falls: compare without line breaks
    assert "launch overhead" in r.stdout and "memory bandwidth" in r.stdout
    assert str(files[0]) in r.stdout.replace("\n", "")
    info = json.loads(invoke(runner, "cache", "info", "--json").stdout)
    assert [c["backend"] for c in info["calibration"]] == ["cpu"]
    r = invoke(runner, "cache", "clear", "--calibration")
    assert r.exit_code == 0 and "1 calibration file" in r.stdout
    assert not files[0].exists()


def test_calibrate_rejects_a_device_index(runner: CliRunner) -> None:
    assert invoke(runner, "calibrate", "cpu:0").exit_code == 2


def test_json_safe_handles_non_finite_and_numpy() -> None:
    from rlx_core.cliutil import json_safe

    data = json_safe({"a": float("nan"), "b": np.float32(1.5), "c": (1, 2), "d": np.int64(3)})
    assert json.loads(json.dumps(data)) == {"a": "nan", "b": 1.5, "c": [1, 2], "d": 3}


def test_main_entry_point_matches_pyproject() -> None:
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'rlx = "rlx_core.cli:main"' in text
    assert callable(cli_module.main)
    assert os.path.basename(cli_module.__file__) == "cli.py"
