"""Run the suite against one backend and produce a certificate."""

from __future__ import annotations

import datetime as _dt
import re
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlx_core.plugin import Hub, Session, parse_device

from .certificate import Certificate, Result
from .checks import Check, Context, Outcome, collect

XFAILS_FILE = "conformance-xfails.txt"


def parse_xfails(text: str, source: str = XFAILS_FILE) -> dict[str, str]:
    """``<check id>  # <reason>`` per line; blank lines and ``#`` comment lines are ignored.

    A line without a reason is an error: an expected failure must say why.
    """
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        tid, sep, reason = line.partition("#")
        tid, reason = tid.strip(), reason.strip()
        if not sep or not reason:
            raise ValueError(f"{source}:{n}: {tid!r} has no reason; write '<check id>  # <why it fails>'")
        out[tid] = reason
    return out


def find_xfails(backend: Any) -> Path | None:
    """The plugin's manifest: next to its module, or at its distribution root (src layout)."""
    mod = getattr(backend.plugin, "__file__", None)
    if not mod:
        return None
    here = Path(mod).resolve().parent
    for d in (here, here.parent, here.parent.parent, here.parent.parent.parent):
        p = d / XFAILS_FILE
        if p.is_file():
            return p
    return None


def _shown(path: Path) -> str:
    """The xfails file as a certificate records it: relative to the working directory when under
    it, else ``<package>/<file>``, so a certificate names no machine's home or checkout path."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return f"{path.parent.name}/{path.name}"


def keyword_filter(expr: str | None) -> Callable[[str], bool]:
    """pytest-like ``-k``: substrings combined with ``and``, ``or``, ``not`` and parentheses."""
    if not expr:
        return lambda _id: True
    tokens = re.findall(r"\(|\)|[^\s()]+", expr)
    code = []
    for t in tokens:
        if t in ("and", "or", "not", "(", ")"):
            code.append(t)
        else:
            code.append(f"({t!r} in s)")
    src = " ".join(code)
    try:
        fn = eval(f"lambda s: {src}", {"__builtins__": {}})
        fn("")
    except SyntaxError as e:
        raise ValueError(f"invalid -k expression {expr!r}") from e
    return fn


def open_context(backend: str, hub: Hub | None = None) -> Context:
    """Load ``backend`` (``"cpu"`` or ``"cpu:0"``) and open the session the checks run in. Loading
    first also registers the ops the plugin provides (``rlx_ops``), so :func:`collect` has their
    checks. Raises :class:`~rlx_core.plugin.RLXError` (naming the installed backends and the fix)
    for a backend or device that does not exist."""
    h = hub or Hub()
    name, idx = parse_device(backend)
    b = h.load(name)
    device = b.device(idx)
    return Context(b, device, h, Session(device.name, hub=h, use_cache=False))


def load_manifest(ctx: Context, xfails: str | Path | None = None) -> tuple[Path | None, dict[str, str]]:
    """The expected-failure manifest: ``xfails`` or the plugin's own, and its entries."""
    xf_path = Path(xfails) if xfails else find_xfails(ctx.backend)
    return xf_path, (parse_xfails(xf_path.read_text(), str(xf_path)) if xf_path else {})


def run_check(check: Check, ctx: Context, manifest: dict[str, str], outcome: Outcome | None = None) -> Result:
    """Run one check and apply the manifest: the one place a check becomes a result, for
    :func:`run_suite` and the pytest route alike. ``outcome``: the check's outcome from a batched
    program (:mod:`rlx_conformance.batch`), used instead of running it."""
    if outcome is not None:
        out = outcome
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                out = check.run(ctx)
            except Exception as e:  # a crash inside a check is an error of the backend, reported
                tb = traceback.extract_tb(e.__traceback__)
                loc = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
                out = Outcome("error", f"{type(e).__name__}: {e}{loc}")
    if check.id in manifest:
        reason = manifest[check.id]
        if out.status in ("failed", "error"):
            out = Outcome("xfailed", f"{reason} ({out.message})", out.path, out.kernels)
        elif out.status == "passed":
            out = Outcome("xpassed", f"listed in {XFAILS_FILE} ({reason}) but passes: remove the line",
                          out.path, out.kernels)
    return Result(check.id, check.kind, check.variant, out.status, out.message, out.path, check.op,
                  check.dtype, out.kernels)


def make_certificate(ctx: Context, results: list[Result], *, keyword: str | None = None,
                     xfails_file: Path | None = None, stale_xfails: list[str] | None = None,
                     seconds: float = 0.0) -> Certificate:
    from . import SUITE_VERSION, __version__

    b, device = ctx.backend, ctx.device
    return Certificate(
        backend=b.name, plugin_distribution=b.entry.distribution, plugin_version=b.info.version,
        core_version=__import__("rlx_core").__version__, api_version=b.info.api_version,
        suite_version=f"{SUITE_VERSION} (rlx-conformance {__version__})", device=device.name,
        device_details=dict(device.details), date=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        results=results, keyword=keyword, xfails_file=_shown(xfails_file) if xfails_file else None,
        stale_xfails=stale_xfails or [], seconds=seconds)


def run_suite(backend: str, *, hub: Hub | None = None, keyword: str | None = None,
              xfails: str | Path | None = None, checks: list[Check] | None = None,
              progress: Callable[[int, int, Check, Outcome], None] | None = None,
              batch: bool = True) -> Certificate:
    """Certify ``backend`` (``"cpu"`` or ``"cpu:0"``). Returns the certificate; never raises for a
    failing check (only for a backend that cannot be loaded at all). A backend that opts in
    (``CONFORMANCE_BATCH``, :mod:`rlx_conformance.batch`) has its op checks batched unless
    ``batch`` is false; the results are the same either way."""
    from .batch import batch_size, run_batched

    ctx = open_context(backend, hub)
    xf_path, manifest = load_manifest(ctx, xfails)
    selected = keyword_filter(keyword)
    all_checks = checks if checks is not None else collect()
    todo = [c for c in all_checks if selected(c.id)]
    results: list[Result] = []
    t0 = time.perf_counter()

    def one(check: Check, outcome: Outcome | None) -> None:
        r = run_check(check, ctx, manifest, outcome)
        results.append(r)
        if progress is not None:
            progress(len(results), len(todo), check, Outcome(r.status, r.message, r.path, r.kernels))

    size = batch_size(ctx) if batch else 0
    if size:
        run_batched(todo, ctx, size, one)
    else:
        for check in todo:
            one(check, None)
    unused = sorted(set(manifest) - {c.id for c in todo}) if keyword is None else []
    return make_certificate(ctx, results, keyword=keyword, xfails_file=xf_path, stale_xfails=unused,
                            seconds=time.perf_counter() - t0)
