"""Hooks ``rlx_exporters`` and ``rlx_cli_commands``: `rlx export` targets and `rlx NAME-...` commands come
from plugins, never from naming conventions; conflicts and broken hooks are reported, never crash `rlx`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from _plugintools import plugin_source
from click.testing import CliRunner, Result
from conftest import PluginFactory

from rlx_core import GraphBuilder
from rlx_core._hub import Hub, reset_hub
from rlx_core.cli import cli
from rlx_core.errors import PluginError
from rlx_core.extensions import collect, split_target
from rlx_core.ir.serialize import save
from rlx_core.records import ExporterInfo

# An exporter given as options + function: the core builds MODEL/--output/--bind/--json around it.
FUNCTION_EXPORTER = '''
import json
import click
from rlx_core.records import ExporterInfo

def _write(graph, out_dir, bindings, greeting):
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "model.txt").write_text(f"{{greeting}} {{graph.name}} {{len(graph.nodes)}}")
    return {{"files": 1, "greeting": greeting}}

@hookimpl
def rlx_exporters():
    return [ExporterInfo(target="{target}", help="a text file naming the graph", function=_write,
                         options=(click.Option(["--greeting"], default="hello", show_default=True,
                                               help="First word of the file."),))]
'''

# An exporter given as a click command, named lazily ("module:attr") like the in-tree ones.
COMMAND_EXPORTER = '''
import click
from rlx_core.records import ExporterInfo

@click.command("export")
@click.argument("model")
@click.option("--target", required=True)
@click.option("--shout", is_flag=True, help="Write in capitals.")
def export_command(model, target, shout):
    click.echo(("EXPORTED " if shout else "exported ") + model)

@hookimpl
def rlx_exporters():
    return [ExporterInfo(target="{target}", help="prints what it would export",
                         command=__name__ + ":export_command")]
'''

COMMANDS = '''
import click

@click.command("{name}")
@click.option("--count", default=1, type=int)
def _hello(count):
    """Say hello from the plugin."""
    click.echo("hello " * count)

@hookimpl
def rlx_cli_commands():
    return [_hello]
'''


@pytest.fixture(autouse=True)
def _restore_hub() -> Iterator[None]:
    yield
    reset_hub(Hub())


def _env(monkeypatch: pytest.MonkeyPatch, backends: str) -> None:
    monkeypatch.setenv("RLX_BACKENDS", backends)
    reset_hub(Hub())


def _rlx(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="rlx")


def _flat(text: str) -> str:
    """Help text without click's line wrapping (which may break a name after its hyphen)."""
    return re.sub(r"-\s+", "-", " ".join(text.split()))


def _model(tmp_path: Path) -> Path:
    g = GraphBuilder("tiny")
    x = g.input("x", "f32", ("batch", 3))
    g.output(x + 1.0, "y")
    save(g.build(), tmp_path / "m.rlx")
    return tmp_path / "m.rlx"


def _plugin(make_plugin: PluginFactory, dist: str, name: str, extra: str) -> None:
    make_plugin(dist, name, plugin_source(name) + textwrap.dedent(extra))


# ---------------------------------------------------------------------------------------------
# exporters


def test_in_tree_exporters_are_listed_with_their_distributions() -> None:
    pytest.importorskip("rlx_wasm")
    r = _rlx("export", "--help")
    assert r.exit_code == 0, r.output
    assert "Targets (from the installed plugins)" in r.output
    for target, dist in (("wasm", "rlx-wasm"), ("cortexm", "rlx-cortexm"), ("fpga", "rlx-fpga")):
        assert target in r.output and dist in _flat(r.output)


def test_target_help_is_the_exporters_own(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("rlx_fpga")
    for args in (["--target", "fpga", "--help"], ["-t", "fpga", "-h"], ["--target=fpga", "--help"]):
        r = _rlx("export", *args)
        assert r.exit_code == 0, r.output
        assert "--parallel" in r.output and "Verilog" in r.output
    r = _rlx("export", "-t", "wasm", "--help")
    assert "--no-simd" in r.output and "--parallel" not in r.output


def test_function_exporter_runs_with_shared_and_own_options(make_plugin: PluginFactory,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    _plugin(make_plugin, "rlx-texty", "texty", FUNCTION_EXPORTER.format(target="texty"))
    _env(monkeypatch, "cpu,texty")
    r = _rlx("export", "--target", "texty", "--help")
    assert r.exit_code == 0, r.output
    for opt in ("--output", "--bind", "--json", "--greeting", "a text file naming the graph"):
        assert opt in r.output
    model = _model(tmp_path)
    r = _rlx("export", str(model), "-t", "texty", "-o", str(tmp_path / "out"), "--greeting", "hi",
             "--bind", "batch=2", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"files": 1, "greeting": "hi"}
    assert (tmp_path / "out" / "model.txt").read_text().startswith("hi tiny")
    r = _rlx("export", str(model), "--target", "texty", "-o", str(tmp_path / "o2"), "--bind", "nosuch=1")
    assert r.exit_code == 2 and "nosuch" in r.output


def test_unknown_target_names_the_installed_ones_and_the_fix(make_plugin: PluginFactory,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _plugin(make_plugin, "rlx-texty", "texty", FUNCTION_EXPORTER.format(target="texty"))
    _env(monkeypatch, "cpu,texty")
    r = _rlx("export", "m.rlx", "--target", "nowhere")
    assert r.exit_code == 1
    assert "no installed plugin exports target 'nowhere'" in r.output
    assert "texty (rlx-texty)" in r.output and "no extra for a backend named 'nowhere'" in r.output
    assert "rlx-nowhere" not in r.output  # never a package name made up from the user's input
    r = _rlx("export", "m.rlx")
    assert r.exit_code == 2 and "missing --target" in r.output and "texty" in r.output


def test_two_distributions_exporting_one_target_is_a_conflict(make_plugin: PluginFactory,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _plugin(make_plugin, "rlx-ea", "ea", COMMAND_EXPORTER.format(target="same"))
    _plugin(make_plugin, "rlx-eb", "eb", FUNCTION_EXPORTER.format(target="same"))
    _env(monkeypatch, "cpu,ea,eb")
    r = _rlx("export", "m.rlx", "--target", "same")
    assert r.exit_code == 1
    assert "'same' is provided by both rlx-ea and rlx-eb" in r.output
    r = _rlx("export", "--help")
    assert r.exit_code == 0 and "unusable" in r.output


def test_broken_exporters_are_reported_not_fatal(make_plugin: PluginFactory, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    _plugin(make_plugin, "rlx-raiser", "raiser", '''
        @hookimpl
        def rlx_exporters():
            raise RuntimeError("exporter table exploded")
    ''')
    _plugin(make_plugin, "rlx-ghost", "ghost", '''
        from rlx_core.records import ExporterInfo

        @hookimpl
        def rlx_exporters():
            return [ExporterInfo(target="ghost", help="its module is missing",
                                 command="no_such_module_xyz:export_command")]
    ''')
    _plugin(make_plugin, "rlx-good", "good", COMMAND_EXPORTER.format(target="good"))
    _env(monkeypatch, "cpu,raiser,ghost,good")
    r = _rlx("export", "--help")
    assert r.exit_code == 0, r.output
    assert "good" in r.output and "exporter table exploded" in r.output
    r = _rlx("export", "x.rlx", "--target", "good", "--shout")
    assert r.exit_code == 0 and "EXPORTED x.rlx" in r.output
    r = _rlx("export", "x.rlx", "--target", "ghost")
    assert r.exit_code == 1 and "no_such_module_xyz" in r.output and "rlx-ghost" in r.output
    reset_hub(Hub())
    rep = json.loads(_rlx("doctor", "--json").stdout)
    by = {b["name"]: b for b in rep["backends"]}
    assert by["raiser"]["status"] == "FAIL" and "exporter table exploded" in by["raiser"]["reason"]
    assert by["ghost"]["status"] == "FAIL" and "no_such_module_xyz" in by["ghost"]["reason"]
    assert by["good"]["status"] == "PASS" and by["good"]["exporters"] == ["good"]
    assert by["cpu"]["status"] == "PASS"


def test_exporter_record_is_validated() -> None:
    with pytest.raises(PluginError, match="neither"):
        ExporterInfo(target="x", help="h")
    with pytest.raises(PluginError, match="one non-empty line"):
        ExporterInfo(target="x", help="a\nb", command="m:c")
    with pytest.raises(PluginError, match="invalid"):
        ExporterInfo(target="../x", help="h", command="m:c")


def test_split_target() -> None:
    assert split_target(["m", "--target", "wasm", "-o", "d"]) == ("wasm", ["m", "-o", "d"])
    assert split_target(["--target=fpga", "-h"]) == ("fpga", ["-h"])
    assert split_target(["-tcortexm", "m"]) == ("cortexm", ["m"])
    assert split_target(["m", "-o", "d"]) == (None, ["m", "-o", "d"])


# ---------------------------------------------------------------------------------------------
# plugin commands


def test_plugin_command_runs_and_is_listed(make_plugin: PluginFactory,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _plugin(make_plugin, "rlx-greeter", "greeter", COMMANDS.format(name="greeter-hello"))
    _env(monkeypatch, "cpu,greeter")
    r = _rlx("greeter-hello", "--count", "2")
    assert r.exit_code == 0 and r.output.strip() == "hello hello", r.output
    r = _rlx("plugins")
    assert r.exit_code == 0, r.output
    assert "greeter-hello" in r.output and "Say hello from the plugin." in r.output
    assert "rlx-greeter" in r.output
    data = json.loads(_rlx("plugins", "--json").stdout)
    assert data["commands"] == [{"name": "greeter-hello", "help": "Say hello from the plugin.",
                                 "backend": "greeter", "distribution": "rlx-greeter"}]
    assert _rlx("--help").exit_code == 0
    assert _rlx("nosuchthing").exit_code == 2  # an ordinary unknown command: click's usage error


def test_command_conflicts_name_both_distributions(make_plugin: PluginFactory,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _plugin(make_plugin, "rlx-acme", "acme", COMMANDS.format(name="acme-x"))
    _plugin(make_plugin, "rlx-acme-x", "acme-x", COMMANDS.format(name="acme-x"))
    _plugin(make_plugin, "rlx-cache", "cache", COMMANDS.format(name="cache"))
    _env(monkeypatch, "cpu,acme,acme-x,cache")
    r = _rlx("acme-x")
    assert r.exit_code == 1 and "'acme-x' is provided by both rlx-acme and rlx-acme-x" in r.output
    # The core's own command always wins; the clash is reported where plugins are listed.
    assert _rlx("cache", "--help").exit_code == 0
    ext = collect(Hub(env={"RLX_BACKENDS": "cache"}), core_commands=frozenset({"cache"}))
    (err,) = ext.failures["cache"]
    assert "rlx-core" in err.what and "rlx-cache" in err.what
    r = _rlx("plugins")
    assert r.exit_code == 1 and "rlx-core and rlx-cache" in r.output and "rlx-acme-x" in r.output
    reset_hub(Hub())
    rep = json.loads(_rlx("doctor", "--json").stdout)
    (cache,) = [b for b in rep["backends"] if b["name"] == "cache"]
    assert cache["status"] == "FAIL" and "rlx-core" in cache["reason"]


def test_command_outside_the_namespace_or_a_raising_hook(make_plugin: PluginFactory,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _plugin(make_plugin, "rlx-squat", "squat", COMMANDS.format(name="deploy"))
    _plugin(make_plugin, "rlx-boom", "boom", '''
        @hookimpl
        def rlx_cli_commands():
            raise ValueError("no commands today")
    ''')
    _env(monkeypatch, "cpu,squat,boom")
    assert _rlx("deploy").exit_code == 2  # never looked up: not in any plugin's namespace
    r = _rlx("boom-go")
    assert r.exit_code == 1 and "no commands today" in r.output and "rlx-boom" in r.output
    assert _rlx("--help").exit_code == 0
    reset_hub(Hub())
    rep = json.loads(_rlx("doctor", "--json").stdout)
    by = {b["name"]: b for b in rep["backends"]}
    assert by["squat"]["status"] == "FAIL" and "outside its namespace" in by["squat"]["reason"]
    assert by["boom"]["status"] == "FAIL" and "no commands today" in by["boom"]["reason"]


def test_rlx_help_imports_no_plugin() -> None:
    code = ("import sys; from rlx_core.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "mods = [m for m in sys.modules if m.startswith('rlx_') and m not in ('rlx_core',)"
            " and not m.startswith('rlx_core.')]\n"
            "print('PLUGINS', mods, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "PLUGINS [] False" in out, out
