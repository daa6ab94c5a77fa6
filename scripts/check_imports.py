"""The plugin import contract, checked on source (complements import-linter in pyproject.toml).

import-linter checks the installed packages; this also reads what it cannot: the ``rlx new-backend``
templates (``*.py.tmpl``), imports inside functions of packages installed as copies (the test plugins),
``importlib.import_module("rlx_core.x")`` with a literal name, and whether each name taken from
``rlx_core.plugin`` is really in its ``__all__``.

Rules, for every in-tree plugin, ``rlx_conformance``, the test plugins and the scaffold templates:

* ``rlx_core`` may be imported only as ``rlx_core`` (its lazy top-level names) or ``rlx_core.plugin``;
* a name imported from either must be public there (``rlx_core.plugin.__all__`` / ``rlx_core.__dir__``);
* a plugin never imports another plugin's package (rlx_conformance may: it drives their exporters).

Usage: ``python scripts/check_imports.py`` (exit 1 and one line per violation: file:line, what, fix).
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PUBLIC_MODULES = ("rlx_core", "rlx_core.plugin")
#: (file suffix, module prefix): a private import that is allowed, each with its reason.
EXCEPTIONS: tuple[tuple[str, str], ...] = (
    # rlx-conformance's fuzzer fuzzes the core's own model-file readers, which are not plugin API.
    ("conformance/src/rlx_conformance/fuzz.py", "rlx_core.formats."),
)


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.what} (fix: {self.fix})"


def checked_trees(root: Path = ROOT) -> list[tuple[Path, str | None]]:
    """Each source tree under the contract, with the plugin package it is (None: not a plugin)."""
    out: list[tuple[Path, str | None]] = []
    for d in sorted(root.glob("plugins/*/src/*")) + sorted(root.glob("tests/plugins/*/src/*")):
        if d.is_dir() and (d / "__init__.py").exists():
            out.append((d, d.name))
    out.append((root / "conformance" / "src" / "rlx_conformance", None))
    out.append((root / "src" / "rlx_core" / "templates", None))
    return out


def _source_files(tree: Path) -> Iterator[Path]:
    for p in sorted(tree.rglob("*")):
        if "__pycache__" not in p.parts and (p.name.endswith(".py") or p.name.endswith(".py.tmpl")):
            yield p


def _parse(path: Path) -> ast.Module:
    text = path.read_text(encoding="utf-8")
    if path.name.endswith(".tmpl"):
        # Template placeholders are ``{{name}}``; as ``name`` they parse as ordinary identifiers.
        text = text.replace("{{", "").replace("}}", "")
    return ast.parse(text, filename=str(path))


def _public_names() -> dict[str, set[str]]:
    import rlx_core
    import rlx_core.plugin

    top = {n for n in dir(rlx_core) if not n.startswith("_")}
    return {"rlx_core": top | {"plugin"}, "rlx_core.plugin": set(rlx_core.plugin.__all__)}


def _imported_modules(tree: ast.Module) -> Iterator[tuple[int, str, list[str]]]:
    """(line, module, names) of every absolute import anywhere in the file, lazy ones included."""
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            yield n.lineno, n.module, [a.name for a in n.names]
        elif isinstance(n, ast.Import):
            for a in n.names:
                yield n.lineno, a.name, []
        elif (isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant)
              and isinstance(n.args[0].value, str)
              and ((isinstance(n.func, ast.Attribute) and n.func.attr == "import_module")
                   or (isinstance(n.func, ast.Name) and n.func.id in ("import_module", "__import__")))):
            yield n.lineno, n.args[0].value, []


def check(root: Path = ROOT) -> list[Violation]:
    public = _public_names()
    trees = checked_trees(root)
    plugin_packages = {pkg for _, pkg in trees if pkg}
    found: list[Violation] = []
    for tree_dir, own in trees:
        for path in _source_files(tree_dir):
            rel = path.relative_to(root).as_posix()
            for line, module, names in _imported_modules(_parse(path)):
                top = module.split(".")[0]
                if top == "rlx_core":
                    if module not in PUBLIC_MODULES:
                        if any(rel.endswith(f) and module.startswith(m) for f, m in EXCEPTIONS):
                            continue
                        found.append(Violation(path, line, f"imports private module {module}",
                                               "import it from rlx_core.plugin (add it there if a plugin "
                                               "really needs it)"))
                        continue
                    for name in names:
                        if name not in public[module]:
                            found.append(Violation(path, line, f"{name!r} is not public in {module}",
                                                   f"use a name in {module}.__all__"))
                elif own is not None and top in plugin_packages and top != own:
                    found.append(Violation(path, line, f"plugin {own} imports plugin {top}",
                                           "plugins never import each other: move the shared code into "
                                           "rlx_core.plugin"))
    return found


def main() -> int:
    importlib.invalidate_caches()
    violations = check()
    for v in violations:
        print(v)
    n = sum(1 for t, _ in checked_trees() for _ in _source_files(t))
    print(f"import contract: {n} files checked, {len(violations)} violations", file=sys.stderr)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
