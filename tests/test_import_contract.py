"""The public plugin API (rlx_core.plugin) and the import contract that keeps plugins on it."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import rlx_core
import rlx_core.plugin as api

ROOT = Path(__file__).resolve().parent.parent


def _checker():  # scripts/ is not a package: load the checker from its file
    spec = importlib.util.spec_from_file_location("check_imports", ROOT / "scripts" / "check_imports.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_imports"] = mod  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_in_tree_plugins_keep_the_contract() -> None:
    violations = _checker().check()
    assert not violations, "\n".join(map(str, violations))


def test_checker_catches_private_lazy_unknown_and_cross_plugin_imports(tmp_path: Path) -> None:
    a = tmp_path / "plugins" / "rlx-a" / "src" / "rlx_a"
    b = tmp_path / "plugins" / "rlx-b" / "src" / "rlx_b"
    for d in (a, b):
        d.mkdir(parents=True)
    (a / "__init__.py").write_text(
        "import importlib\n"
        "from rlx_core.plugin import DType, not_public\n"
        "def f():\n"
        "    from rlx_core.lir import Program\n"
        "    importlib.import_module('rlx_core.quant')\n"
        "    import rlx_b\n")
    (b / "__init__.py").write_text("from rlx_core import API_VERSION\nfrom rlx_core.plugin import hookimpl\n")
    (tmp_path / "conformance" / "src" / "rlx_conformance").mkdir(parents=True)
    (tmp_path / "src" / "rlx_core" / "templates").mkdir(parents=True)
    found = sorted((v.line, v.what) for v in _checker().check(tmp_path))
    assert found == [(2, "'not_public' is not public in rlx_core.plugin"),
                     (4, "imports private module rlx_core.lir"),
                     (5, "imports private module rlx_core.quant"),
                     (6, "plugin rlx_a imports plugin rlx_b")]


def test_every_public_name_resolves_and_is_declared_for_type_checkers() -> None:
    assert api.PLUGIN_API_VERSION == rlx_core.API_VERSION
    assert len(api.__all__) == len(set(api.__all__))
    assert set(api._LAZY) <= set(api.__all__)
    for name in api.__all__:
        assert getattr(api, name) is not None, name
    # Every lazy name is also imported under TYPE_CHECKING, so mypy and editors see its real type.
    tree = ast.parse(Path(api.__file__).read_text(encoding="utf-8"))
    typed = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.If)
             and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"
             for i in n.body if isinstance(i, ast.ImportFrom) for a in i.names}
    assert set(api._LAZY) - typed == set()
    with pytest.raises(AttributeError, match=r"rlx_core\.plugin\.__all__"):
        api.no_such_name  # noqa: B018


def test_import_is_cheap() -> None:
    # Each name loads its home on first use; the module itself loads none of them.
    code = ("import sys, rlx_core.plugin; heavy = ('numpy', 'rlx_core.ir', 'rlx_core.records', 'click'); "
            "loaded = [m for m in heavy if m in sys.modules]; assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_slice_params_is_public_and_matches_the_reference() -> None:
    from rlx_core.plugin import Attrs, slice_params

    attrs = Attrs({"starts": (1, 0), "stops": (2**63 - 1, -1), "axes": (-1, 0), "steps": (2, 1)})
    assert slice_params(attrs, (4, 6)) == [(1, slice(1, 2**62, 2)), (0, slice(0, -1, 1))]


@pytest.mark.skipif(shutil.which("lint-imports", path=str(Path(sys.executable).parent)) is None,
                    reason="import-linter is not installed (requirements/test.txt)")
def test_import_linter_contracts_are_kept() -> None:
    exe = Path(sys.executable).parent / "lint-imports"
    r = subprocess.run([str(exe)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
