"""Discovery: two phases, isolation of broken plugins, API versions, conflicts, env selection."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from _plugintools import plugin_source
from conftest import PluginFactory

from rlx_core import API_VERSION, GraphBuilder
from rlx_core._hub import Hub
from rlx_core.errors import BackendNotFoundError, PluginConflictError, PluginError
from rlx_core.runtime import Session


def _add_graph() -> object:
    g = GraphBuilder("add")
    x = g.input("x", "f32", (3,))
    g.output(x + x)
    return g.build()


def test_listing_does_not_import_plugins(make_plugin: PluginFactory) -> None:
    make_plugin("rlx-lazy", "lazy", "raise RuntimeError('imported too early')\n")
    h = Hub()
    assert "lazy" in h.names()  # phase 1 lists it ...
    assert "cpu" in h.names()
    with pytest.raises(PluginError, match="imported too early"):  # ... phase 2 imports it on demand
        h.load("lazy")


def test_import_rlx_core_and_listing_import_no_plugin_or_numpy() -> None:
    code = ("import sys, rlx_core, rlx_core._hub as h; names = h.Hub().names(); "
            "assert 'cpu' in names, names; "
            "bad = [m for m in ('numpy', 'rlx_cpu', 'rlx_cpu.plugin') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_broken_import_is_reported_and_isolated(make_plugin: PluginFactory) -> None:
    make_plugin("rlx-broken", "broken", "import cupy_that_does_not_exist\n")
    h = Hub()
    with pytest.raises(PluginError) as e:
        h.load("broken")
    msg = str(e.value)
    assert "rlx-broken" in msg and "ModuleNotFoundError" in msg and "cupy_that_does_not_exist" in msg
    assert "RLX_DISABLE_PLUGINS=broken" in msg
    assert "broken" in h.failures()
    # The other plugins are unaffected.
    out = Session("cpu", hub=h, use_cache=False).run(_add_graph(), x=np.ones(3, np.float32))
    assert out["add_0"].tolist() == [2, 2, 2]


def test_wrong_api_major_is_refused(make_plugin: PluginFactory) -> None:
    make_plugin("rlx-future", "future", plugin_source("future", api="2.0"))
    h = Hub()
    with pytest.raises(PluginError) as e:
        h.load("future")
    msg = str(e.value)
    assert "API 2.0" in msg and f"provides API {API_VERSION}" in msg and "rlx-future" in msg



def test_minor_api_difference_is_accepted(make_plugin: PluginFactory) -> None:
    make_plugin("rlx-minor", "minor", plugin_source("minor", api="1.7"))
    assert Hub().load("minor").info.api_version == "1.7"


def test_raising_hook_names_plugin_and_hook_and_spares_others(make_plugin: PluginFactory) -> None:
    make_plugin("rlx-raiser", "raiser", plugin_source("raiser", kernels_body="raise RuntimeError('boom')"))
    h = Hub()
    backend = h.load("raiser")  # identity hooks work; the kernels hook raises
    with pytest.raises(PluginError) as e:
        Session("raiser", hub=h, use_cache=False).compile(_add_graph())
    msg = str(e.value)
    assert "rlx-raiser" in msg and "rlx_kernels" in msg and "boom" in msg
    assert backend.name == "raiser"
    out = Session("cpu", hub=h, use_cache=False).run(_add_graph(), x=np.ones(3, np.float32))
    assert out["add_0"].sum() == 6


def test_duplicate_backend_name_names_both_distributions(make_plugin: PluginFactory) -> None:
    make_plugin("rlx-dup-a", "dup", plugin_source("dup"), module="dup_a_plugin")
    make_plugin("rlx-dup-b", "dup", plugin_source("dup"), module="dup_b_plugin")
    h = Hub()
    with pytest.raises(PluginConflictError) as e:
        h.load("dup")
    msg = str(e.value)
    assert "rlx-dup-a" in msg and "rlx-dup-b" in msg and "uninstall one" in msg
    assert h.try_load("cpu") is not None


def test_name_mismatch_is_an_error(make_plugin: PluginFactory) -> None:
    make_plugin("rlx-liar", "liar", plugin_source("honest"))
    with pytest.raises(PluginError, match="calls itself 'honest'"):
        Hub().load("liar")


def test_a_working_third_party_plugin_runs(make_plugin: PluginFactory) -> None:
    make_plugin("rlx-good", "good", plugin_source("good"))
    h = Hub()
    exe = Session("good", hub=h, use_cache=False).compile(_add_graph())
    assert exe.run(x=np.arange(3, dtype=np.float32))["add_0"].tolist() == [0, 2, 4]
    assert exe.report is not None and exe.report.entries[0].kernels == ("good.add",)


def test_rlx_backends_is_an_ordered_allow_list(make_plugin: PluginFactory) -> None:
    make_plugin("rlx-good", "good", plugin_source("good"))
    h = Hub(env={"RLX_BACKENDS": "good,cpu"})
    assert h.names() == ["good", "cpu"]
    assert h.default_backend() == "good"
    h2 = Hub(env={"RLX_BACKENDS": "cpu"})
    with pytest.raises(BackendNotFoundError, match="not in RLX_BACKENDS"):
        h2.load("good")


def test_allow_list_failures_are_loud(make_plugin: PluginFactory) -> None:
    h = Hub(env={"RLX_BACKENDS": "nonexistent"})
    with pytest.raises(BackendNotFoundError, match="nonexistent"):
        h.default_backend()


def test_disable_plugins(make_plugin: PluginFactory) -> None:
    make_plugin("rlx-good", "good", plugin_source("good"))
    h = Hub(env={"RLX_DISABLE_PLUGINS": "good"})
    assert "good" not in h.names()
    with pytest.raises(BackendNotFoundError, match="RLX_DISABLE_PLUGINS"):
        h.load("good")
    assert Hub(env={"RLX_DISABLE_PLUGINS": "all"}).names() == []


def test_unknown_backend_lists_installed_ones() -> None:
    with pytest.raises(BackendNotFoundError) as e:
        Hub().load("tpu9000")
    assert "cpu" in str(e.value) and "rlx doctor" in str(e.value)
    assert "rlx-tpu9000" not in str(e.value)  # no package name guessed from the typo


def test_in_process_registration() -> None:
    from rlx_cpu import plugin as cpu_plugin

    h = Hub(autoload=False)
    assert h.names() == []
    h.register(cpu_plugin, "cpu")
    assert h.names() == ["cpu"]
