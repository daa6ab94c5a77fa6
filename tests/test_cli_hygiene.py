"""Issue 16 items 3, 6 and 9: the public listing API, CLI hygiene, and authoring traps."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from _plugintools import plugin_source
from click.testing import CliRunner, Result
from conftest import PluginFactory

import rlx_core
from rlx_core._hub import Hub, reset_hub
from rlx_core.cli import EXIT_BROKEN_PIPE, cli
from rlx_core.errors import BackendNotFoundError, IRError
from rlx_core.records import BackendInfo, DeviceInfo


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    monkeypatch.setenv("COLUMNS", "120")
    reset_hub(Hub())
    yield
    monkeypatch.delenv("RLX_BACKENDS", raising=False)
    reset_hub(Hub())


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="rlx")


def _tiny_model(tmp_path: Path) -> Path:
    g = rlx_core.GraphBuilder("tiny")
    x = g.input("x", "f32", (4,))
    g.output(g.relu(x + x), "y")
    path = tmp_path / "tiny.rlx"
    rlx_core.save(g.build(), path)
    return path

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


# -- item 6: CLI hygiene ------------------------------------------------------------------------------


def test_python_m_rlx_core_and_a_closed_pipe_exit_quietly() -> None:
    # `python -m rlx_core` is the CLI (a missing __main__ would exit 1 with "No module named").
    for args in (["ops"], ["ops", "--json"]):  # rich text and click.echo JSON
        # The reader is gone before the command writes: every write fails with EPIPE, deterministically.
        p = subprocess.Popen([sys.executable, "-m", "rlx_core", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        assert p.stdout is not None and p.stderr is not None
        p.stdout.close()
        err = p.stderr.read().decode()
        assert p.wait() == EXIT_BROKEN_PIPE, err
        assert err == ""


def test_run_with_an_npy_as_model_says_what_a_model_file_is(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.ones(3, np.float32))
    r = invoke("run", str(tmp_path / "x.npy"))
    assert r.exit_code == 1
    # rich wraps the panel at word boundaries wherever the (tmp) path ends: compare the words only
    words = " ".join(re.sub("[\u2500-\u257f]", " ", r.stderr).split())
    assert "expected .rlx or .onnx" in words and "--input NAME=FILE.npy" in words
    assert "Traceback" not in r.output


def test_doctor_fails_when_every_backend_is_skipped(make_plugin: PluginFactory,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    src = plugin_source("absent").replace("available=True", "available=False, reason='unplugged'")
    make_plugin("rlx-absent", "absent", src)
    monkeypatch.setenv("RLX_BACKENDS", "absent")
    reset_hub(Hub())
    r = invoke("doctor")
    assert r.exit_code == 2, r.output
    assert "No usable backend" in r.stdout and "unplugged" in r.stdout
    r = invoke("doctor", "--json")
    assert r.exit_code == 2 and json.loads(r.stdout)["summary"]["passed"] == 0


def test_run_reports_the_first_run_apart_from_the_steady_one(tmp_path: Path) -> None:
    model = _tiny_model(tmp_path)
    r = invoke("run", str(model), "--random", "--json")
    assert r.exit_code == 0, r.output
    seconds = json.loads(r.stdout)["seconds"]
    assert set(seconds) == {"compile", "first_run", "run"}
    r = invoke("run", str(model), "--random")
    assert "first run (warm-up, JIT)" in r.stdout and "then ran in" in r.stdout


class _Tty:
    def __init__(self, tty: bool) -> None:
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass


def test_progress_lines_only_on_a_terminal_and_not_quiet() -> None:
    from rlx_core.cliutil import Progress

    tty = _Tty(True)
    with Progress(stream=tty).step("compiling for cpu"):
        pass
    assert tty.text.startswith("compiling for cpu ...") and tty.text.endswith("\n")
    with pytest.raises(RuntimeError), Progress(stream=tty).step("running"):
        raise RuntimeError("boom")
    assert tty.text.endswith("running ... failed\n")
    for stream, quiet in ((_Tty(False), False), (_Tty(True), True)):
        with Progress(quiet, stream=stream).step("loading"):
            pass
        assert stream.text == ""
    assert "--quiet" in invoke("embed", "--help").stdout


def test_export_help_with_a_model_is_the_targets_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("rlx_wasm")
    monkeypatch.setenv("RLX_BACKENDS", "cpu,wasm")
    reset_hub(Hub())
    model = _tiny_model(tmp_path)
    for args in ([str(model), "--target", "wasm", "--help"], ["--help", str(model), "-t", "wasm"]):
        r = invoke("export", *args)
        assert r.exit_code == 0, r.output
        assert "--no-simd" in r.stdout  # the wasm exporter's own option, not the generic help


def test_cli_md_command_table_is_generated_and_current() -> None:
    import importlib.util

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("commands_doc", root / "scripts" / "commands_doc.py")
    assert spec is not None and spec.loader is not None
    doc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doc)
    text = (root / "docs" / "CLI.md").read_text()
    assert text == doc.render(text), "docs/CLI.md is out of date: run python scripts/commands_doc.py --write"
    table = text[text.index(doc.BEGIN):text.index(doc.END)]
    for name, _ in doc.commands():
        assert f"[`rlx {name}`](#" in table, f"docs/CLI.md has no section for `rlx {name}`"


# -- item 9: authoring traps --------------------------------------------------------------------------


def test_naming_an_output_adds_no_node_so_an_add_only_backend_runs_it(make_plugin: PluginFactory) -> None:
    make_plugin("rlx-addonly", "addonly", plugin_source("addonly"))  # claims add on f32, nothing else
    g = rlx_core.GraphBuilder("named")
    x = g.input("x", "f32", (3,))
    y = g.output(x + x, "y")
    g.output(y + x, "z")  # a named output may still feed later nodes
    graph = g.build()
    assert [n.op for n in graph.nodes] == ["add", "add"] and graph.outputs == ("y", "z")
    assert [n.outputs for n in graph.nodes] == [("y",), ("z",)]
    assert [n.name for n in graph.nodes] == ["add_0", "add_1"]  # nodes keep their names (errors name them)
    h = Hub(env={"RLX_BACKENDS": "addonly"})
    out = rlx_core.Session("addonly", hub=h, use_cache=False).run(graph, x=np.ones(3, np.float32))
    assert out["y"].tolist() == [2, 2, 2] and out["z"].tolist() == [3, 3, 3]


def test_output_names_that_cannot_be_renamed_get_a_copy() -> None:
    g = rlx_core.GraphBuilder("copies")
    x = g.input("x", "f32", (3,))
    h = x + x
    g.output(x, "x_out")  # an input keeps its name (the caller's interface): copied
    g.output(h, "a")
    g.output(h, "b")  # already an output under another name: copied
    graph = g.build()
    assert graph.op_counts() == {"add": 1, "reshape": 2} and graph.outputs == ("x_out", "a", "b")
    with pytest.raises(IRError, match="already used"):
        g.output(g.relu(x), "a")
