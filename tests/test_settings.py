"""The settings registry: every ``RLX_*`` variable declared once (rlx_core.settings), parsed one way,
listed by ``rlx doctor --settings`` and in docs/CLI.md."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner

from rlx_core import settings
from rlx_core._hub import Hub, reset_hub
from rlx_core.cli import cli
from rlx_core.errors import RLXError, SettingError
from rlx_core.settings import Setting, declare

ROOT = Path(__file__).resolve().parent.parent

#: ``RLX_`` names in the source that are not environment variables: C macros and linker symbols of
#: generated firmware (rlx-cortexm), and the marker file hostile-name tests look for.
NOT_SETTINGS = frozenset({"RLX_ARENA_BYTES", "RLX_INBOX", "RLX_INBOX_BYTES", "RLX_INBOX_DATA",
                          "RLX_STACK_SIZE", "RLX_MODEL_H", "RLX_CUDA_PREAMBLE", "RLX_PWNED",
                          "RLX_MYDEV_THREADS",  # the example in the docs of declare()
                          # macros and symbols in generated HIP / Hexagon C / CUDA source
                          "RLX_A", "RLX_CONSTANT_BYTES", "RLX_HIP_OFFLINE", "RLX_GID", "RLX_FULL"})


def _doc_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("settings_doc", ROOT / "scripts" / "settings_doc.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def scratch() -> Iterator[None]:
    """Settings declared by a test leave the registry afterwards."""
    before = dict(settings._REGISTRY)
    yield
    settings._REGISTRY.clear()
    settings._REGISTRY.update(before)


# -- parsing ----------------------------------------------------------------------------------------

@pytest.mark.usefixtures("scratch")
def test_each_type_parses() -> None:
    flag = declare("RLX_TEST_FLAG", "bool", False, "A test flag.", owner="tests")
    for text in ("1", "true", "YES", " On "):
        assert flag.get({"RLX_TEST_FLAG": text}) is True
    for text in ("0", "False", "no", "OFF"):
        assert flag.get({"RLX_TEST_FLAG": text}) is False
    assert flag.get({}) is False and flag.get({"RLX_TEST_FLAG": "  "}) is False  # unset or blank: default
    n = declare("RLX_TEST_N", "int", 8, "A count.", owner="tests", min=1, max=1 << 20)
    assert n.get({"RLX_TEST_N": "1_024"}) == 1024 and n.get({}) == 8
    x = declare("RLX_TEST_X", "float", 1.5, "Seconds.", owner="tests", min=0)
    assert x.get({"RLX_TEST_X": "0.25"}) == 0.25
    names = declare("RLX_TEST_NAMES", "list", None, "Names.", owner="tests")
    assert names.get({"RLX_TEST_NAMES": " cuda, cpu ,,"}) == ["cuda", "cpu"] and names.get({}) is None
    where = declare("RLX_TEST_DIR", "path", None, "A folder.", owner="tests")
    assert where.get({"RLX_TEST_DIR": "/tmp/x"}) == Path("/tmp/x")
    mode = declare("RLX_TEST_MODE", "choice", "auto", "A mode.", owner="tests", choices=("auto", "host"))
    assert mode.get({"RLX_TEST_MODE": "HOST"}) == "host" and mode.get({}) == "auto"
    text = declare("RLX_TEST_TEXT", "str", None, "Text.", owner="tests")
    assert text.get({"RLX_TEST_TEXT": " cuda:1 "}) == "cuda:1"


@pytest.mark.usefixtures("scratch")
def test_bad_values_are_errors_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    flag = declare("RLX_TEST_FLAG", "bool", True, "A test flag.", owner="tests")
    n = declare("RLX_TEST_N", "int", 8, "A count.", owner="tests", min=1)
    x = declare("RLX_TEST_X", "float", 1.5, "Seconds.", owner="tests", min=0, max=60)
    mode = declare("RLX_TEST_MODE", "choice", "auto", "A mode.", owner="tests", choices=("auto", "host"))
    cases = [(flag, "2", "boolean"), (flag, "disable", "boolean"), (n, "many", "integer >= 1"),
             (n, "0", "integer >= 1"), (n, "1.5", "integer"), (x, "nan", "number"), (x, "inf", "number"),
             (x, "-1", "from 0 to 60"), (x, "61", "from 0 to 60"), (mode, "gpu", "auto, host")]
    for s, raw, allowed in cases:
        with pytest.raises(SettingError) as e:
            s.get({s.name: raw})
        assert f"{s.name}={raw!r}" in e.value.what and allowed in e.value.what
        assert e.value.where == f"environment variable {s.name}"
        assert e.value.fix and "unset it for the default" in e.value.fix
        assert isinstance(e.value, RLXError) and isinstance(e.value, ValueError)
    monkeypatch.setenv("RLX_TEST_FLAG", "maybe")  # os.environ is the default mapping
    with pytest.raises(SettingError, match="RLX_TEST_FLAG='maybe'"):
        flag.get()


@pytest.mark.usefixtures("scratch")
def test_declared_once() -> None:
    a = declare("RLX_TEST_ONCE", "int", 1, "Once.", owner="tests")
    assert declare("RLX_TEST_ONCE", "int", 1, "Once.", owner="tests") is a  # a re-import: no-op
    assert settings.lookup("RLX_TEST_ONCE") is a
    with pytest.raises(SettingError, match="declared twice"):
        declare("RLX_TEST_ONCE", "int", 2, "Once.", owner="other")
    for bad in (dict(name="TEST_X"), dict(name="RLX_test"), dict(type="number"), dict(doc=" "),
                dict(type="choice")):
        kw = dict(name="RLX_TEST_BAD", type="int", default=None, doc="Bad.") | bad
        with pytest.raises(SettingError):
            Setting(**kw)  # type: ignore[arg-type]
    with pytest.raises(SettingError, match="no setting named"):
        settings.lookup("RLX_NOT_DECLARED")


def test_existing_error_types_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_core.errors import BackendNotFoundError

    with pytest.raises(BackendNotFoundError, match="RLX_PLUGIN_IMPORT_TIMEOUT='-3'"):
        Hub(env={"RLX_PLUGIN_IMPORT_TIMEOUT": "-3"})._import(_entry())
    assert Hub(env={"RLX_BACKENDS": " cuda ,cpu"}).names() == ["cuda", "cpu"]
    assert Hub(env={"RLX_DISABLE_PLUGINS": "all"}).entries() == {}


def _entry() -> object:
    from rlx_core._hub import PluginEntry

    return PluginEntry("x", "x", "x", "0", entry_point=object())


# -- declared once, everywhere ---------------------------------------------------------------------

def test_every_rlx_name_in_the_source_is_declared() -> None:
    """What keeps "declared once" true: an ``RLX_`` name used in src/, plugins/ or conformance/
    that no declaration (core, or an in-tree plugin's settings module) knows fails here."""
    loaded = _doc_script().load_in_tree_settings()
    assert {"rlx_cpu.settings", "rlx_cuda.settings", "rlx_wasm.settings"} <= set(loaded)
    declared = {s.name for s in settings.all_settings()}
    used: dict[str, str] = {}
    for top in ("src", "plugins", "conformance"):
        for path in (ROOT / top).rglob("*.py"):
            for name in re.findall(r"RLX_[A-Z0-9_]+", path.read_text(encoding="utf-8")):
                used.setdefault(name, str(path.relative_to(ROOT)))
    # A name ending in "_" is a prefix in prose ("RLX_CPU_*").
    missing = {n: p for n, p in used.items() if n not in declared | NOT_SETTINGS and not n.endswith("_")}
    assert not missing, f"undeclared RLX_ settings (declare them in their owner's settings): {missing}"
    unused = declared - set(used)
    assert not unused, f"declared but never used: {unused}"


def test_nothing_reads_rlx_variables_around_the_registry() -> None:
    """One parser: no ``os.environ.get("RLX_...")`` / ``os.getenv`` of an RLX_ name outside it."""
    pat = re.compile(r"""(environ\.get\(|getenv\(|environ\[)\s*["']RLX_[A-Z0-9_]+["']""")
    hits = []
    for top in ("src", "plugins", "conformance"):
        for path in (ROOT / top).rglob("*.py"):
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pat.search(line) and not re.search(r"environ\[[^\]]+\]\s*=[^=]", line):
                    hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, "read these through their Setting (rlx_core.settings):\n" + "\n".join(hits)


def test_plugins_return_their_settings_from_the_hook(fresh_hub: Hub) -> None:
    from rlx_cpu import settings as cpu_settings

    got = fresh_hub.load("cpu").list_of("rlx_settings", Setting)
    assert got == cpu_settings.SETTINGS and all(s.owner == "rlx-cpu" for s in got)
    assert settings.lookup("RLX_CPU_THREADS") is cpu_settings.THREADS


# -- rlx doctor --settings, docs ---------------------------------------------------------------------

def _doctor(monkeypatch: pytest.MonkeyPatch, *args: str, **env: str) -> tuple[int, str]:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    reset_hub(Hub())
    try:
        r = CliRunner().invoke(cli, ["doctor", "--settings", *args], prog_name="rlx")
    finally:
        reset_hub(Hub())
    return r.exit_code, r.stdout


def test_doctor_lists_every_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLX_DEBUG", raising=False)
    code, out = _doctor(monkeypatch, "--json", RLX_BACKENDS="cpu", RLX_CPU_CHAIN="off", RLX_FUSION="no")
    assert code == 0, out
    rep = json.loads(out)
    rows = {r["name"]: r for r in rep["settings"]}
    # Plugins outside RLX_BACKENDS are listed too: one sets a plugin's variables before selecting it.
    assert {"RLX_BACKENDS", "RLX_NO_CACHE", "RLX_CPU_THREADS", "RLX_WASM_SIMD"} <= set(rows)
    assert rows["RLX_CPU_CHAIN"] | {"value": False, "source": "env", "raw": "off", "owner": "rlx-cpu"} == \
        rows["RLX_CPU_CHAIN"]
    assert rows["RLX_FUSION"]["value"] is False and rows["RLX_DEBUG"]["source"] == "default"
    assert rows["RLX_MAX_SPECIALIZATIONS"]["value"] == 16 and rep["invalid"] == 0
    code, text = _doctor(monkeypatch)
    assert code == 0 and "RLX_CPU_CHAIN = off" in text and "rlx-core" in text and "rlx-wasm" in text


def test_doctor_flags_an_invalid_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = _doctor(monkeypatch, "--json", RLX_BACKENDS="cpu", RLX_CPU_THREADS="many", RLX_DEBUG="maybe")
    assert code == 1
    rep = json.loads(out)
    bad = {r["name"]: r["error"] for r in rep["settings"] if r["error"]}
    assert set(bad) == {"RLX_CPU_THREADS", "RLX_DEBUG"} and rep["invalid"] == 2
    assert "RLX_CPU_THREADS='many' is not an integer" in bad["RLX_CPU_THREADS"]["what"]
    code, text = _doctor(monkeypatch)
    assert code == 1 and "invalid: RLX_DEBUG='maybe'" in text and "2 invalid setting(s)" in text


def test_a_bad_debug_flag_is_an_error_of_other_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLX_DEBUG", "sometimes")
    r = CliRunner().invoke(cli, ["ops"], prog_name="rlx")
    assert r.exit_code == 1 and "RLX_DEBUG='sometimes'" in r.output and "Traceback" not in r.output


def test_docs_settings_block_is_current() -> None:
    doc = _doc_script()
    text = doc.DOC.read_text()
    assert text == doc.render(text), "docs/CLI.md is out of date: run python scripts/settings_doc.py --write"
    for s in settings.all_settings():
        assert f"| `{s.name}` |" in text
