"""``rlx new-backend``: the generated plugin installs, is discovered and is certified as generated.

The round trip installs the generated distribution with pip into a throw-away ``--target`` folder
(a real wheel build: entry points, package data) and runs ``rlx conformance`` in a subprocess whose
``PYTHONPATH`` points there, so entry points are scanned afresh and the shared venv never sees the
plugin: nothing to uninstall, and concurrent test runs are not disturbed by a transient backend.
"""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rlx_core import scaffold
from rlx_core.cli import LAZY_COMMANDS, cli
from rlx_core.errors import RLXError
from rlx_core.scaffold import DestinationExistsError, InvalidNameError, NameTakenError

BIN = Path(sys.executable).parent
NAME = "scaffoldprobe"

EXPECTED_FILES = {
    "pyproject.toml", "README.md", "src/rlx_{n}/__init__.py", "src/rlx_{n}/plugin.py",
    "src/rlx_{n}/program.py", "src/rlx_{n}/conformance-xfails.txt", "src/rlx_{n}/py.typed",
    "tests/test_conformance.py",
}


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _env(tmp_path: Path, site: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLX_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["RLX_CACHE_DIR"] = str(tmp_path / "rlx-cache")
    env["COLUMNS"] = "200"
    return env


# ---------------------------------------------------------------------------------------------
# The round trip: generate, install, certify


def test_generated_plugin_installs_and_is_certified(tmp_path: Path) -> None:
    assert NAME not in scaffold.installed_backends()
    dest = tmp_path / f"rlx-{NAME}"
    res = CliRunner().invoke(cli, ["new-backend", NAME, "--dir", str(dest)])
    assert res.exit_code == 0, res.output
    assert f"rlx-{NAME}/" in res.output and "plugin.py" in res.output
    for cmd in ("pip install -e", "rlx doctor", f"rlx conformance {NAME}"):
        assert cmd in res.output
    assert _files(dest) == {f.format(n=NAME) for f in EXPECTED_FILES}

    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--disable-pip-version-check", "--target", str(site), str(dest)],
                         capture_output=True, text=True, timeout=120)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    # The manifest is package data: an installed wheel finds it next to the plugin module.
    assert (site / f"rlx_{NAME}" / "conformance-xfails.txt").is_file()

    env = _env(tmp_path, site)
    cert_path = tmp_path / "cert.json"
    run = subprocess.run([str(BIN / "rlx"), "conformance", NAME, "--json", str(cert_path), "-q"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    cert = json.loads(cert_path.read_text())
    assert cert["certified"] is True and cert["verdict"].startswith("certified")
    assert cert["plugin"]["distribution"] == f"rlx-{NAME}"
    assert cert["xfails_file"] and cert["xfails_file"].endswith("conformance-xfails.txt")
    variants = cert["variants"]
    add = variants["add[f32]"]
    assert add["verdict"] == "certified" and add["passed"] > 0 and add["skipped"] == 0
    assert add["paths"] == ["native"]
    # Unclaimed variants (other ops, other dtypes of add) are skipped: not certified, never passed.
    for key in ("add[f16]", "add[f64]", "mul[f32]", "matmul[f32]", "exp[f32]"):
        assert variants[key]["verdict"] == "not certified", (key, variants[key])
        assert variants[key]["passed"] == 0 and variants[key]["skipped"] > 0
    op_variants = {k: v for k, v in variants.items() if v["kind"] == "op" and k != "add[f32]"}
    assert len(op_variants) > 100
    for key, v in op_variants.items():
        assert v["passed"] == 0 and v["skipped"] > 0 and v["verdict"] == "not certified", (key, v)
    # Per check: only add[f32] cases passed (passed checks may be listed by id only).
    passed = set(cert.get("passed", [])) | {r["id"] for r in cert["results"] if r["status"] == "passed"}
    passed_ops = {i for i in passed if i.startswith("op::")}
    assert passed_ops and all(i.startswith("op::add[f32]-") for i in passed_ops), sorted(passed_ops)
    assert all(r["status"] == "skipped" for r in cert["results"] if r["kind"] == "op")
    counts = cert["counts"]
    assert counts["passed"] == len(passed) and counts["skipped"] > 0
    assert counts["failed"] == counts["error"] == counts["xpassed"] == 0

    # The generated test passes too (the suite through run_suite, as a vendor's CI would run it).
    pytest_cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(dest / "tests")]
    test = subprocess.run(pytest_cmd, capture_output=True, text=True, timeout=120, env=env, cwd=dest)
    assert test.returncode == 0, test.stdout[-3000:] + test.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# The generated code


def test_generated_code_is_ruff_clean_and_compiles(tmp_path: Path) -> None:
    ruff = shutil.which("ruff", path=str(BIN)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    roots = [scaffold.create(n, tmp_path / n).root for n in ("acme", "my_dev2", "x" * scaffold.MAX_NAME)]
    for root in roots:
        for py in root.rglob("*.py"):
            py_compile.compile(str(py), doraise=True)
    # Checked with the generated pyproject's own ruff settings (the RLX rule set, line length 110).
    res = subprocess.run([ruff, "check", "--no-cache", *map(str, roots)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_rendered_files_fill_every_placeholder() -> None:
    files = scaffold.render("acme")
    assert set(files) == {f.format(n="acme") for f in EXPECTED_FILES}
    for rel, text in files.items():
        assert "{{" not in text and "__pkg__" not in rel, rel
    py = files["pyproject.toml"]
    assert 'acme = "rlx_acme.plugin"' in py and '[project.entry-points."rlx.backends"]' in py
    assert 'name = "rlx-acme"' in py and '"rlx-core>=0.1,<0.2"' in py
    plugin = files["src/rlx_acme/plugin.py"]
    assert "api_version=API_VERSION" in plugin and "rlx calibrate acme" in plugin
    assert 'op="add"' in plugin and 'dtypes={"f32"}' in plugin
    # Heavy imports only in rlx_compile: plugin.py does not import NumPy or program.py at module level.
    top = plugin.split("@hookimpl", 1)[0]
    assert "numpy" not in top and "from .program" not in top
    xf = files["src/rlx_acme/conformance-xfails.txt"]
    assert all(not line.strip() or line.startswith("#") for line in xf.splitlines())


def test_minor_range() -> None:
    assert scaffold._minor_range("0.1.0") == ">=0.1,<0.2"
    assert scaffold._minor_range("1.12.3rc1") == ">=1.12,<1.13"


# ---------------------------------------------------------------------------------------------
# Names and destinations


BAD_NAMES = ["", "Acme", "1acme", "_acme", "my-dev", "my dev", "acmé", "core", "conformance", "all",
             "a" * (scaffold.MAX_NAME + 1)]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_invalid_names_are_refused(bad: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidNameError) as ei:
        scaffold.create(bad, tmp_path / "out")
    assert isinstance(ei.value, RLXError) and ei.value.fix
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("good", ["acme", "my_dev2", "npu3", "a" * scaffold.MAX_NAME])
def test_valid_names(good: str) -> None:
    assert scaffold.validate_name(good) == good


def test_invalid_name_on_the_command_line_is_a_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["new-backend", "My-Dev", "--dir", str(tmp_path / "x")])
    assert res.exit_code == 2
    assert "not a lowercase identifier" in res.output and "'my_dev'" in res.output
    assert not (tmp_path / "x").exists()


def test_installed_backend_name_needs_force(tmp_path: Path) -> None:
    assert "cpu" in scaffold.installed_backends()
    with pytest.raises(NameTakenError, match="already installed"):
        scaffold.create("cpu", tmp_path / "rlx-cpu")
    res = CliRunner().invoke(cli, ["new-backend", "cpu", "--dir", str(tmp_path / "rlx-cpu")])
    assert res.exit_code == 1 and "already installed" in res.output and "--force" in res.output
    assert not (tmp_path / "rlx-cpu").exists()
    created = scaffold.create("cpu", tmp_path / "rlx-cpu", force=True)
    assert (created.root / "src" / "rlx_cpu" / "plugin.py").is_file()


def test_refuses_to_overwrite_an_existing_folder(tmp_path: Path) -> None:
    dest = tmp_path / "rlx-acme"
    scaffold.create("acme", dest)
    plugin = dest / "src" / "rlx_acme" / "plugin.py"
    plugin.write_text("# my edits\n")
    (dest / "NOTES.md").write_text("mine\n")
    with pytest.raises(DestinationExistsError, match="already exists"):
        scaffold.create("acme", dest)
    res = CliRunner().invoke(cli, ["new-backend", "acme", "--dir", str(dest)])
    assert res.exit_code == 1 and "already exists" in res.output and "--force" in res.output
    assert plugin.read_text() == "# my edits\n"
    # --force rewrites the generated files and keeps the user's others.
    res = CliRunner().invoke(cli, ["new-backend", "acme", "--dir", str(dest), "--force"])
    assert res.exit_code == 0, res.output
    assert "overwrote" in res.output and "@hookimpl" in plugin.read_text()
    assert (dest / "NOTES.md").read_text() == "mine\n"
    # A file where the folder should be is refused even with --force.
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DestinationExistsError, match="not a folder"):
        scaffold.create("acme", tmp_path / "afile", force=True)


def test_empty_existing_folder_is_fine(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert scaffold.create("acme", tmp_path / "empty").root == tmp_path / "empty"


def test_default_destination(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli, ["new-backend", "acme"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "rlx-acme" / "pyproject.toml").is_file()
    assert "pip install -e ./rlx-acme" in res.output
    # A plugins/ folder (someone's project, maybe) is never written into unless asked: --into.
    repo = tmp_path / "repo"
    (repo / "plugins").mkdir(parents=True)
    monkeypatch.chdir(repo)
    res = CliRunner().invoke(cli, ["new-backend", "acme"])
    assert res.exit_code == 0, res.output
    assert (repo / "rlx-acme" / "pyproject.toml").is_file() and not any((repo / "plugins").iterdir())
    res = CliRunner().invoke(cli, ["new-backend", "acme", "--into", "plugins"])
    assert res.exit_code == 0, res.output
    assert (repo / "plugins" / "rlx-acme" / "src" / "rlx_acme" / "plugin.py").is_file()
    assert "pip install -e ./plugins/rlx-acme" in res.output
    assert scaffold.default_destination("x", cwd=repo) == repo / "rlx-x"
    assert scaffold.default_destination("x", cwd=repo, into="plugins") == repo / "plugins" / "rlx-x"
    res = CliRunner().invoke(cli, ["new-backend", "acme", "--into", "nowhere"])
    assert res.exit_code == 1 and "no such folder" in res.stderr
    res = CliRunner().invoke(cli, ["new-backend", "acme", "--into", "plugins", "--dir", "x"])
    assert res.exit_code == 1 and "not both" in res.stderr
    res = CliRunner().invoke(cli, ["new-backend", "acme", "--into", "plugins"])  # exists, not empty
    assert res.exit_code == 1 and "DestinationExistsError" in res.stderr


def test_registered_as_a_lazy_command() -> None:
    assert LAZY_COMMANDS["new-backend"][0] == "rlx_core.scaffold:new_backend"
    res = CliRunner().invoke(cli, ["--help"])
    assert "new-backend" in res.output
    res = CliRunner().invoke(cli, ["new-backend", "--help"])
    assert res.exit_code == 0 and "--force" in res.output and "--dir" in res.output
