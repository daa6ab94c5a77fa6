"""Install hints name rlx-core's real extras (from its metadata), never a name guessed from input;
the packaging metadata every distribution ships (license, readme, extras with version ranges)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from rlx_core import install_hint
from rlx_core._hub import Hub
from rlx_core.errors import BackendNotFoundError

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = [ROOT, *sorted(p for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file()),
            ROOT / "conformance"]


def _meta(d: Path) -> dict:
    return tomllib.loads((d / "pyproject.toml").read_text())["project"]


def test_backend_hint_names_the_extra_not_a_guess() -> None:
    extras = install_hint.backend_extras()
    assert extras["cpu"] == "rlx-cpu" and extras["cuda12"] == "rlx-cuda"
    assert "all" not in extras and "embed" not in extras and "conformance" not in extras
    assert install_hint.backend_hint("cpu") == 'pip install "rlx-core[cpu]"'
    assert install_hint.backend_hint("cuda").startswith('pip install "rlx-core[cuda12]"')
    gpu = install_hint.backend_hint("gpu")
    assert "rlx-gpu" not in gpu and "rlx doctor" in gpu and "cuda12" in gpu
    assert install_hint.default_backend_hint().startswith('pip install "rlx-core[cpu]"')


def test_module_hint_uses_the_extra_that_requires_it() -> None:
    assert install_hint.module_hint("rlx_conformance.cli") == 'pip install "rlx-core[conformance]"'
    assert install_hint.module_hint("onnx").startswith('pip install "rlx-core[onnx]"')
    assert install_hint.module_hint("tokenizers").startswith('pip install "rlx-core[embed]"')
    assert "pip install" not in install_hint.module_hint("no_such_module_xyz")


def test_unknown_device_error_guesses_no_package() -> None:
    with pytest.raises(BackendNotFoundError) as e:
        Hub().load("gpu")
    assert "rlx-gpu" not in str(e.value) and "rlx doctor" in str(e.value)


def test_root_extras_cover_every_plugin_with_ranges() -> None:
    core = _meta(ROOT)
    extras = core["optional-dependencies"]
    plugins = {_meta(d)["name"] for d in PROJECTS[1:-1]}
    named = {re.match(r"[a-z0-9-]+", r).group(0) for reqs in extras.values() for r in reqs}  # type: ignore[union-attr]
    assert plugins <= named, f"plugins without an rlx-core extra: {plugins - named}"
    assert "all" in extras and "embed" in extras
    for reqs in extras.values():
        for r in reqs:
            if r.startswith("rlx-") and not r.startswith("rlx-core["):
                assert ">=" in r and "<" in r, f"rlx-core extra requirement without a range: {r}"


@pytest.mark.parametrize("d", PROJECTS, ids=lambda d: d.name)
def test_distribution_metadata(d: Path) -> None:
    m = _meta(d)
    assert m["license"] == "MIT" and m["license-files"] == ["LICENSE"]
    assert (d / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    readme = d / m["readme"]
    assert readme.is_file() and len(readme.read_text()) > 200, f"{m['name']}: no long description"
    assert m["authors"] and any(c.startswith("Programming Language :: Python :: 3.11")
                                for c in m["classifiers"])
    pkgs = [p for p in (d / "src").iterdir() if (p / "__init__.py").is_file()]
    assert pkgs
    for p in pkgs:
        assert (p / "py.typed").is_file(), f"{p} lacks py.typed"  # PEP 561: the wheel ships its hints
    # Every dependency has a version range: no open-ended requirement reaches users.
    for r in m["dependencies"]:
        assert re.search(r"[<>=]=?", r), f"{m['name']}: {r} has no version range"


def test_pypi_description_does_not_send_readers_to_repo_scripts() -> None:
    text = (ROOT / _meta(ROOT)["readme"]).read_text()
    assert "scripts/" not in text and ".ci/" not in text and 'pip install "rlx-core[cpu]"' in text
