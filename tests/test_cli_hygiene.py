"""Issue 16 items 3, 6 and 9: the public listing API, CLI hygiene, and authoring traps."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
from _plugintools import plugin_source
from conftest import PluginFactory

import rlx_core
from rlx_core._hub import Hub
from rlx_core.errors import BackendNotFoundError
from rlx_core.records import BackendInfo, DeviceInfo

# -- item 3: rlx_core.hub() / backends() / devices() ------------------------------------------------


def test_hub_stays_callable_after_importing_session() -> None:
    # The submodule used to shadow the lazily exported function once anything imported it.
    code = ("import rlx_core; from rlx_core import Session; import rlx_core.runtime; "
            "h = rlx_core.hub(); assert type(h).__name__ == 'Hub', h; assert rlx_core.hub() is h")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert callable(rlx_core.hub)


def test_backends_and_devices_list_typed_records(make_plugin: PluginFactory) -> None:
    make_plugin("rlx-listed", "listed", plugin_source("listed"))
    h = Hub(env={"RLX_BACKENDS": "listed,cpu,notinstalled"})
    infos = rlx_core.backends(from_hub=h)
    assert [b.name for b in infos] == ["listed", "cpu"]  # selection order; not installed: not listed
    assert all(isinstance(b, BackendInfo) for b in infos)
    devs = rlx_core.devices(from_hub=h)
    assert [d.name for d in devs] == ["listed:0", "cpu:0"]
    assert all(isinstance(d, DeviceInfo) and d.available for d in devs)
    assert [d.name for d in rlx_core.devices("cpu", from_hub=h)] == ["cpu:0"]
    with pytest.raises(BackendNotFoundError):
        rlx_core.devices("notinstalled", from_hub=h)


def test_backends_names_a_broken_plugin_and_lists_the_rest(make_plugin: PluginFactory) -> None:
    make_plugin("rlx-crash", "crash", "raise RuntimeError('no driver here')\n")
    h = Hub(env={"RLX_BACKENDS": "crash,cpu"})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        names = [b.name for b in rlx_core.backends(from_hub=h)]
    assert names == ["cpu"]
    assert any("rlx-crash" in str(w.message) and "no driver here" in str(w.message) for w in seen)


def test_devices_include_unavailable_ones_with_reason(make_plugin: PluginFactory) -> None:
    src = plugin_source("absent").replace("available=True", "available=False, reason='unplugged'")
    make_plugin("rlx-absent", "absent", src)
    h = Hub(env={"RLX_BACKENDS": "absent"})
    assert rlx_core.devices(from_hub=h) == []
    [d] = rlx_core.devices(include_unavailable=True, from_hub=h)
    assert (d.name, d.available, d.reason) == ("absent:0", False, "unplugged")
