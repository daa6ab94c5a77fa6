"""Charts of ``rlx bench`` results: latency (p50, p10-p90 error bars) by batch, one line per runtime.

SVG is written here with the standard library alone, so ``--plot chart.svg`` works on every install
(CI included) and the file is small, diffable text any browser shows. PNG goes through matplotlib,
the optional extra ``rlx-core[plot]``, imported only when a PNG is asked for.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import click

from .errors import InputError, RLXError

FORMATS = (".svg", ".png")

#: Okabe-Ito: distinguishable with the common colour-vision deficiencies, and in greyscale by marker.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")


@dataclass(frozen=True)
class Point:
    """One measurement: latencies in seconds; ``low``/``high`` are p10/p90 when measured."""

    batch: int
    p50: float
    low: float | None = None
    high: float | None = None


def latency_series(rows: Iterable[Mapping[str, Any]], *, prefix_model: bool = False
                   ) -> dict[str, list[Point]]:
    """``rlx bench infer`` result rows -> runtime label -> points sorted by batch. Rows that failed
    (``error``) or lack ``p50_s`` are left out; with ``prefix_model`` labels read ``model/runtime``."""
    out: dict[str, list[Point]] = {}
    for r in rows:
        if "error" in r or "p50_s" not in r:
            continue
        label = f"{r.get('model', '?')}/{r['runtime']}" if prefix_model else str(r["runtime"])
        out.setdefault(label, []).append(Point(int(r["batch"]), float(r["p50_s"]), _opt(r.get("p10_s")),
                                               _opt(r.get("p90_s"))))
    return {k: sorted(v, key=lambda p: p.batch) for k, v in out.items()}


def _opt(v: Any) -> float | None:
    return None if v is None else float(v)


def check_plot_path(path: str | Path, option: str = "--plot") -> str:
    """The chart format (``.svg``/``.png``) of ``path``; raises before any measuring is done when the
    suffix is unknown or a PNG is asked for without matplotlib."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in FORMATS:
        raise InputError(f"cannot write a chart as {p.name!r}: unknown format {suffix or '(no suffix)'}",
                         where=option, fix="name the file .svg (built in) or .png (needs rlx-core[plot])")
    if suffix == ".png":
        _pyplot(p, option)
    return suffix


def write_plot(path: str | Path, series: Mapping[str, Sequence[Point]], *, title: str) -> Path:
    """Write the chart to ``path``; the suffix (.svg or .png) picks the format."""
    p = Path(path)
    suffix = check_plot_path(p)
    if not any(series.values()):
        raise InputError("no successful measurements to plot", where="--plot",
                         fix="check the errors in the table above; every runtime failed at every batch")
    if suffix == ".svg":
        p.write_text(render_svg(series, title=title), encoding="utf-8")
    else:
        _write_png(p, series, title=title)
    return p


# -- scales ----------------------------------------------------------------------------------------

def nice_ticks(hi: float, count: int = 5) -> list[float]:
    """Ticks 0, s, 2s, ... covering ``[0, hi]`` with s = 1, 2 or 5 times a power of ten."""
    if not hi > 0 or not math.isfinite(hi):
        return [0.0, 1.0]
    raw = hi / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    n = math.ceil(hi / step - 1e-9)
    return [round(i * step, 12) for i in range(n + 1)]


def _fmt(v: float) -> str:
    return f"{v:.6g}"


@dataclass(frozen=True)
class _XScale:
    """Batches on a log2 axis when they span 4x or more (1, 8, 32, 128 spread evenly), else linear."""

    lo: float
    hi: float
    log: bool

    @staticmethod
    def of(batches: Sequence[int]) -> _XScale:
        lo, hi = min(batches), max(batches)
        log = lo > 0 and hi / lo >= 4
        return _XScale(math.log2(lo) if log else lo, math.log2(hi) if log else hi, log)

    def frac(self, b: float) -> float:
        v = math.log2(b) if self.log else b
        return 0.5 if self.hi == self.lo else (v - self.lo) / (self.hi - self.lo)


@dataclass(frozen=True)
class _YScale:
    """Milliseconds: linear from 0, or log10 when the values span 20x or more (batch 1 and batch 128
    of one model, or a long p90 tail, would otherwise flatten everything else against the axis)."""

    lo: float
    hi: float
    log: bool
    ticks: tuple[float, ...]

    @staticmethod
    def of(values: Sequence[float]) -> _YScale:
        vals = [v for v in values if v > 0 and math.isfinite(v)]
        top = max(vals, default=1.0)
        if not vals or top / min(vals) < 20:
            t = nice_ticks(top * 1.05)
            return _YScale(0.0, t[-1], False, tuple(t))
        lo_d, hi_d = math.floor(math.log10(min(vals))), math.ceil(math.log10(top))
        steps = (1, 2, 5) if hi_d - lo_d <= 3 else (1,)
        ticks = [m * 10.0**d for d in range(lo_d, hi_d + 1) for m in steps]
        lo = max(t for t in ticks if t <= min(vals))
        hi = min(t for t in ticks if t >= top)
        return _YScale(lo, hi, True, tuple(round(t, 12) for t in ticks if lo <= t <= hi))

    def frac(self, v: float) -> float:
        if self.log:
            lo = math.log10(self.lo)
            return (math.log10(max(v, self.lo)) - lo) / (math.log10(self.hi) - lo)
        return v / self.hi


# -- SVG -------------------------------------------------------------------------------------------

W, H = 760, 440
LEFT, RIGHT, TOP, BOTTOM = 72, 190, 44, 56


def render_svg(series: Mapping[str, Sequence[Point]], *, title: str, xlabel: str = "batch size",
               ylabel: str = "latency per call, ms") -> str:
    """The chart as a standalone SVG document."""
    batches = sorted({p.batch for pts in series.values() for p in pts})
    xs = _XScale.of(batches)
    ys = _YScale.of([v * 1e3 for pts in series.values() for p in pts
                     for v in (p.p50, p.low, p.high) if v is not None])
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    inset = 0.05 * pw  # keep the first and last batch off the frame
    n = max(len(series), 1)

    def px(b: float, i: int = -1) -> float:
        # series i is nudged sideways so error bars at one batch do not hide each other
        dodge = 0.0 if i < 0 else (i - (n - 1) / 2) * 5.0
        return LEFT + inset + xs.frac(b) * (pw - 2 * inset) + dodge

    def py(ms: float) -> float:
        return TOP + ph - ys.frac(ms) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
           f"<title>{escape(title)}</title>",
           f'<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>',
           f'<text x="{LEFT + pw / 2:.1f}" y="24" text-anchor="middle" font-size="15" '
           f'font-weight="bold">{escape(title)}</text>']
    for t in ys.ticks:  # grid and y ticks
        y = py(t)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + pw}" y2="{y:.1f}" stroke="#e0e0e0"/>')
        out.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    for b in batches:
        x = px(b)
        out.append(f'<line x1="{x:.1f}" y1="{TOP + ph}" x2="{x:.1f}" y2="{TOP + ph + 5}" stroke="black"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + ph + 20}" text-anchor="middle">{b}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>')
    out.append(f'<text x="{LEFT + pw / 2:.1f}" y="{H - 14}" text-anchor="middle">'
               f"{escape(xlabel + (', log scale' if xs.log else ''))}</text>")
    out.append(f'<text transform="translate(18 {TOP + ph / 2:.1f}) rotate(-90)" text-anchor="middle">'
               f"{escape(ylabel + (', log scale' if ys.log else ''))}</text>")
    # one line per runtime: p50 points joined, p10-p90 as an error bar with caps
    for i, (label, pts) in enumerate(series.items()):
        if not pts:
            continue
        color = PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{px(p.batch, i):.1f},{py(p.p50 * 1e3):.1f}" for p in pts)
        out.append(f'<g class="series" data-runtime="{escape(label)}">')
        out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
        for p in pts:
            x, y = px(p.batch, i), py(p.p50 * 1e3)
            tip = f"{label} batch {p.batch}: p50 {_fmt(p.p50 * 1e3)} ms"
            if p.low is not None and p.high is not None:
                y0, y1 = py(p.low * 1e3), py(p.high * 1e3)
                out.append(f'<line x1="{x:.1f}" y1="{y0:.1f}" x2="{x:.1f}" y2="{y1:.1f}" stroke="{color}"/>')
                for yy in (y0, y1):
                    out.append(f'<line x1="{x - 4:.1f}" y1="{yy:.1f}" x2="{x + 4:.1f}" y2="{yy:.1f}" '
                               f'stroke="{color}"/>')
                tip += f" (p10 {_fmt(p.low * 1e3)}, p90 {_fmt(p.high * 1e3)})"
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}">'
                       f"<title>{escape(tip)}</title></circle>")
        out.append("</g>")
        ly = TOP + 10 + 20 * i
        lx = LEFT + pw + 16
        out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 22}" y2="{ly}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<circle cx="{lx + 11}" cy="{ly}" r="3.5" fill="{color}"/>')
        # the legend column is 190 px: long labels lose their middle, never the runtime at the end
        short = label if len(label) <= 22 else label[:9] + "\u2026" + label[-12:]
        out.append(f'<text x="{lx + 30}" y="{ly + 4}"><title>{escape(label)}</title>{escape(short)}</text>')
    errbars = any(p.low is not None for pts in series.values() for p in pts)
    if errbars:
        ly = TOP + 10 + 20 * len(series) + 6
        out.append(f'<text x="{LEFT + pw + 16}" y="{ly}" font-size="11" fill="#555">'
                   "points: p50; bars: p10-p90</text>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


# -- PNG (matplotlib, optional) --------------------------------------------------------------------

def _pyplot(path: Path, option: str = "--plot") -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never needs a display
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RLXError(f"writing {path.name!r} as PNG needs matplotlib ({e})", where=option,
                       fix="pip install 'rlx-core[plot]' (matplotlib), or name the file .svg, which needs "
                           "nothing") from None
    return plt


def _write_png(path: Path, series: Mapping[str, Sequence[Point]], *, title: str) -> None:
    plt = _pyplot(path)
    fig, ax = plt.subplots(figsize=(W / 100, H / 100), dpi=100)
    batches = sorted({p.batch for pts in series.values() for p in pts})
    for i, (label, pts) in enumerate(series.items()):
        if not pts:
            continue
        b = [p.batch for p in pts]
        ms = [p.p50 * 1e3 for p in pts]
        yerr = None
        if all(p.low is not None and p.high is not None for p in pts):
            yerr = [[m - (p.low or 0) * 1e3 for m, p in zip(ms, pts)],
                    [(p.high or 0) * 1e3 - m for m, p in zip(ms, pts)]]
        ax.errorbar(b, ms, yerr=yerr, label=label, color=PALETTE[i % len(PALETTE)], marker="o", capsize=4)
    if _XScale.of(batches).log:
        ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ys = _YScale.of([v * 1e3 for pts in series.values() for p in pts
                     for v in (p.p50, p.low, p.high) if v is not None])
    if ys.log:
        from matplotlib.ticker import FuncFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _fmt(v)))  # 0.1, 1, 10 (not 10^-1)
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel("batch size")
    ax.set_ylabel("latency per call, ms")
    ax.set_title(title)
    ax.grid(True, axis="y", color="#e0e0e0")
    ax.legend(title="points: p50; bars: p10-p90", fontsize=9, title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


# -- rlx bench plot: charts from saved --json results ----------------------------------------------

def load_rows(paths: Sequence[str | Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """The result rows of ``rlx bench infer --json`` files (runtimes named ``FILE-STEM/runtime`` when
    there are several files) and each file's machine and date."""
    import json

    rows: list[dict[str, Any]] = []
    about: list[str] = []
    for path in paths:
        p = Path(path)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise InputError(f"cannot read benchmark results from {p}: {e}", where=str(p),
                             fix="pass the file `rlx bench infer ... --json FILE` wrote") from None
        res = data.get("results") if isinstance(data, dict) else None
        if not isinstance(res, list) or not all(isinstance(r, dict) and "runtime" in r and "batch" in r
                                                for r in res):
            raise InputError(f"{p} holds no `rlx bench infer` results (a 'results' list of rows with "
                             "'runtime' and 'batch')", where=str(p),
                             fix="pass the file `rlx bench infer ... --json FILE` wrote; train-mlp results "
                                 "have no batch sweep to plot")
        if len(paths) > 1:  # one line per file and runtime: "before/rlx", "after/rlx"
            res = [{**r, "runtime": f"{p.stem}/{r['runtime']}"} for r in res]
        rows.extend(res)
        about.append(f"{str(data.get('machine', '?')).strip()}, {data.get('date', '?')}")
    return rows, about


@click.command("plot", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              help="The chart: FILE.svg (built in) or FILE.png (needs rlx-core[plot]).")
@click.option("--title", default=None, help="Chart title. [default: the models, machine and date]")
def plot_command(results: tuple[str, ...], out: str, title: str | None) -> None:
    """Chart saved `rlx bench infer --json` results: latency by batch per runtime.

    \b
    Examples:
      rlx bench infer minilm --batch 1 --batch 8 --batch 32 --json minilm.json
      rlx bench plot minilm.json -o minilm.svg
      rlx bench plot before.json after.json -o both.png
    """
    check_plot_path(out, "-o/--output")
    rows, about = load_rows(results)
    models = sorted({str(r.get("model", "?")) for r in rows})
    series = latency_series(rows, prefix_model=len(models) > 1)
    default = f"{', '.join(models)}: latency by batch"
    if len(set(about)) == 1:
        default += f" ({about[0]})"
    click.echo(f"chart: {write_plot(out, series, title=title or default)}")
