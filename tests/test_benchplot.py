"""`rlx bench ... --plot` and `rlx bench plot`: the chart file is written and is a valid SVG (or PNG)
with one line per runtime; bad names fail before anything is measured. No benchmark runs here:
the measuring workers are replaced by fixed rows."""

from __future__ import annotations

import importlib.util
import json
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rlx_core import bench
from rlx_core.benchplot import Point, _YScale, latency_series, nice_ticks, render_svg, write_plot
from rlx_core.cli import cli
from rlx_core.errors import InputError, RLXError

SVG = "{http://www.w3.org/2000/svg}"
ROOT = Path(__file__).resolve().parents[1]


def _row(runtime: str, batch: int, ms: float) -> dict[str, Any]:
    return {"runtime": runtime, "model": "mlp", "batch": batch, "seq": 128, "p50_s": ms / 1e3,
            "p10_s": 0.9 * ms / 1e3, "p90_s": 1.2 * ms / 1e3, "peak_rss_mb": 100.0}


ROWS = [_row("rlx", 1, 0.05), _row("ort", 1, 0.04), _row("rlx", 8, 0.2), _row("ort", 8, 0.09),
        _row("rlx", 128, 1.0), _row("ort", 128, 1.3),
        {"runtime": "torch", "model": "mlp", "batch": 1, "seq": 128, "error": "ImportError: no torch"}]


def _parse(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    return root


def _series(root: ET.Element) -> dict[str, int]:
    """runtime -> number of plotted points."""
    return {g.get("data-runtime", ""): len(g.findall(f"{SVG}circle"))
            for g in root.iter(f"{SVG}g") if g.get("class") == "series"}


def test_svg_has_a_line_per_runtime_with_error_bars(tmp_path: Path) -> None:
    series = latency_series(ROWS)
    assert list(series) == ["rlx", "ort"]  # the failed torch row is left out
    assert [p.batch for p in series["rlx"]] == [1, 8, 128]
    out = write_plot(tmp_path / "chart.svg", series, title="mlp <test> & co")
    root = _parse(out)
    assert _series(root) == {"rlx": 3, "ort": 3}
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert "mlp <test> & co" in texts  # escaped in the file, intact once parsed
    assert any("log scale" in t for t in texts)  # 0.04 .. 1.56 ms spans 20x: log axes
    assert any("p10-p90" in t for t in texts)
    tips = [t.text or "" for t in root.iter(f"{SVG}title")]
    assert "rlx batch 8: p50 0.2 ms (p10 0.18, p90 0.24)" in tips


def test_scales() -> None:
    assert nice_ticks(4.2) == [0, 1, 2, 3, 4, 5]
    assert nice_ticks(0.0) == [0.0, 1.0]
    lin = _YScale.of([10.0, 12.0, 15.0])
    assert not lin.log and lin.lo == 0 and lin.hi >= 15
    log = _YScale.of([0.04, 1.56])
    assert log.log and log.lo <= 0.04 and log.hi >= 1.56 and 1.0 in log.ticks
    # one runtime at one batch without percentiles still makes a chart
    root = ET.fromstring(render_svg({"rlx": [Point(1, 0.001)]}, title="t"))
    assert _series(root) == {"rlx": 1}


def test_bad_names_and_png(tmp_path: Path) -> None:
    series = latency_series(ROWS)
    with pytest.raises(InputError, match=r"unknown format \.jpg") as e:
        write_plot(tmp_path / "chart.jpg", series, title="t")
    assert ".svg" in str(e.value.fix)
    with pytest.raises(InputError, match="no successful measurements"):
        write_plot(tmp_path / "chart.svg", latency_series(ROWS[-1:]), title="t")
    png = tmp_path / "chart.png"
    if importlib.util.find_spec("matplotlib") is None:
        with pytest.raises(RLXError, match="needs matplotlib") as e:
            write_plot(png, series, title="t")
        assert "rlx-core[plot]" in str(e.value.fix)
        assert not png.exists()
    else:
        write_plot(png, series, title="t")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_infer_plot_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []

    def fake_run_one(runtime: str, model: str, batch: int, seq: int, quick: bool) -> dict[str, Any]:
        calls.append((runtime, batch))
        return {**_row(runtime, batch, 0.1 * batch), "compile_s": 0.5}

    monkeypatch.setattr(bench, "run_one", fake_run_one)
    monkeypatch.setattr(bench, "gemm_roofline", lambda: 1e11)
    monkeypatch.setattr(bench, "onnx_path", lambda model: tmp_path / "unused.onnx")
    monkeypatch.setenv("COLUMNS", "400")  # error boxes never wrap the messages checked below
    runner = CliRunner()
    chart, js = tmp_path / "mlp.svg", tmp_path / "mlp.json"
    r = runner.invoke(cli, ["bench", "infer", "mlp", "--batch", "1", "--batch", "8", "--peers", "ort",
                            "--plot", str(chart), "--json", str(js)], prog_name="rlx")
    assert r.exit_code == 0, r.output
    assert _series(_parse(chart)) == {"rlx": 2, "ort": 2}
    assert "p10_s" in json.loads(js.read_text())["results"][0]
    # the saved JSON re-plots, and several files get one line per file and runtime
    again = tmp_path / "again.svg"
    r = runner.invoke(cli, ["bench", "plot", str(js), "-o", str(again)], prog_name="rlx")
    assert r.exit_code == 0, r.output
    assert _series(_parse(again)) == {"rlx": 2, "ort": 2}
    other = tmp_path / "other.json"
    other.write_text(js.read_text())
    r = runner.invoke(cli, ["bench", "plot", str(js), str(other), "-o", str(again)], prog_name="rlx")
    assert r.exit_code == 0, r.output
    assert set(_series(_parse(again))) == {"mlp/rlx", "mlp/ort", "other/rlx", "other/ort"}
    # a bad chart name fails before anything is measured
    calls.clear()
    r = runner.invoke(cli, ["bench", "infer", "mlp", "--plot", str(tmp_path / "x.gif")], prog_name="rlx")
    assert r.exit_code != 0 and "unknown format .gif" in r.output and not calls
    train = tmp_path / "train.json"  # train-mlp results: one batch, nothing to sweep
    train.write_text(json.dumps({"results": {"rlx": {"images_per_s": 1.0}}}))
    for bad, why in ((train, "no `rlx bench infer` results"), (chart, "cannot read benchmark results")):
        r = runner.invoke(cli, ["bench", "plot", str(bad), "-o", str(again)], prog_name="rlx")
        assert r.exit_code != 0 and why in r.output, r.output


def test_microbenchmarks_are_not_in_the_test_run() -> None:
    # bench/micro holds pytest-benchmark files named test_*.py: only testpaths keeps CI from running them.
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "tests" in ini["testpaths"] and not any(p.startswith("bench") for p in ini["testpaths"])
    assert (ROOT / "bench" / "micro" / "test_kernels.py").exists()
