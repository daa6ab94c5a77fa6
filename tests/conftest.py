"""Shared fixtures: fresh hubs, and throw-away plugin distributions found through real entry points."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rlx_core import _hub as hub_module
from rlx_core._hub import Hub, reset_hub

_HUB_ENV = ("RLX_BACKENDS", "RLX_DISABLE_PLUGINS", "RLX_PLUGIN_IMPORT_TIMEOUT")

# pytest-xdist workers inherit COLUMNS from the controller's terminal (80 columns), so rich would
# wrap and crop the CLI's captured output there but not in a serial run; both runs must see the same.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests never read or write the user's ~/.cache/rlx.
    monkeypatch.setenv("RLX_CACHE_DIR", str(tmp_path_factory.mktemp("rlx-cache")))
    monkeypatch.delenv("RLX_BACKENDS", raising=False)
    monkeypatch.delenv("RLX_DISABLE_PLUGINS", raising=False)
    monkeypatch.delenv("RLX_DISPATCH_REPORT", raising=False)
    # A test that built the process-wide hub under its own RLX_BACKENDS (and reset it before its
    # monkeypatch restored the environment) must not decide which backends the next test sees.
    current = hub_module._HUB
    if current is not None and any(current.env.get(k) != os.environ.get(k) for k in _HUB_ENV):
        reset_hub(Hub())


@pytest.fixture
def fresh_hub() -> Iterator[Hub]:
    h = reset_hub(Hub())
    yield h
    reset_hub(Hub())


PluginFactory = Callable[..., Path]


@pytest.fixture
def make_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PluginFactory]:
    """Write a real distribution (dist-info + entry points + module) onto sys.path.

    ``make_plugin(dist, backend, module_source, version="1.0")`` returns its folder; the entry point
    ``backend = <module>`` is in the group ``rlx.backends``, exactly as pip would install it.
    """
    created: list[str] = []

    def make(dist: str, backend: str, source: str, version: str = "1.0",
             module: str | None = None) -> Path:
        root = tmp_path / f"site-{dist}"
        root.mkdir(exist_ok=True)
        mod = module or f"{dist.replace('-', '_')}_plugin"
        (root / f"{mod}.py").write_text(textwrap.dedent(source))
        info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[rlx.backends]\n{backend} = {mod}\n")
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        created.append(mod)
        return root

    yield make
    for mod in created:
        sys.modules.pop(mod, None)
