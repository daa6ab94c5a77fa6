"""``rlx conformance BACKEND``: run the suite with a progress bar, write the certificate."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command("conformance", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("backend")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the certificate as JSON here.")
@click.option("--markdown", "md_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the certificate as Markdown here.")
@click.option("--results", "results_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write every result here (passed ones too), for tests to reuse (RLX_CERT_DIR).")
@click.option("-k", "keyword", help="Only checks whose id matches (substrings with and/or/not).")
@click.option("--xfails", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Expected-failure manifest (default: the plugin's conformance-xfails.txt).")
@click.option("--list", "list_only", is_flag=True, help="List the check ids and exit.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@click.option("--world", type=int, default=None,
              help="Run the collective ops' cases across N ranks (through mpirun) instead of the suite.")
def conformance(backend: str, json_path: Path | None, md_path: Path | None, results_path: Path | None,
                keyword: str | None, xfails: Path | None, list_only: bool, quiet: bool,
                world: int | None = None) -> None:
    """Certify BACKEND (e.g. `cpu` or `cuda:1`) with the shared conformance suite.

    Runs every op x dtype x generated case, the model graphs and the contract checks; prints a
    summary and exits 0 only when the backend is certified (no failure, error or stale xfail).
    A skipped check means that variant is NOT certified.

    \b
    Examples:
      rlx conformance cpu --json cert.json --markdown cert.md
      rlx conformance cpu -k "matmul and f32"
      pytest -p rlx_conformance --rlx-backend cpu      (same suite as pytest tests)
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from .checks import collect
    from .runner import keyword_filter, open_context, run_suite

    if world is not None:  # the collective cases live with the ops, their runner in rlx_core.distributed
        from rlx_core.plugin import run_world_conformance

        code = run_world_conformance(backend, world, keyword=keyword,
                                     md_path=str(md_path) if md_path else None, quiet=quiet)
        raise SystemExit(code)
    out = Console()
    if list_only:
        open_context(backend)  # the plugin's own ops (rlx_ops) have checks too
        sel = keyword_filter(keyword)
        for c in collect():
            if sel(c.id):
                click.echo(c.id)
        return
    if quiet or not sys.stderr.isatty():
        cert = run_suite(backend, keyword=keyword, xfails=xfails)
    else:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TextColumn("{task.fields[last]}"),
                      console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(f"conformance {backend}", total=None, last="")

            def progress(i: int, n: int, check: object, outcome: object) -> None:
                bar.update(task, completed=i, total=n, last=getattr(check, "id", "")[:50])

            cert = run_suite(backend, keyword=keyword, xfails=xfails, progress=progress)
    counts = cert.counts()
    t = Table(title=f"conformance: {cert.backend} on {cert.device}", show_header=True)
    t.add_column("kind")
    for s in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        t.add_column(s, justify="right")
    for kind in ("contract", "op", "graph"):
        rs = [r for r in cert.results if r.kind == kind]
        t.add_row(kind, *[str(sum(r.status == s for r in rs)) for s in
                          ("passed", "failed", "error", "skipped", "xfailed", "xpassed")])
    out.print(t)
    bad = [r for r in cert.results if r.status in ("failed", "error", "xpassed")]
    for r in bad[:30]:
        out.print(f"[red]{r.status.upper()}[/] {r.id}: {r.message[:300]}", highlight=False, markup=True)
    if len(bad) > 30:
        out.print(f"... and {len(bad) - 30} more (see the certificate)")
    for s in cert.stale_xfails:
        out.print(f"[yellow]stale xfail[/] {s}: no such check")
    if json_path:
        cert.write_json(json_path)
        out.print(f"certificate (JSON): {json_path}")
    if results_path:
        from .reuse import run_env

        cert.write_results(results_path, env=run_env())
    if md_path:
        cert.write_markdown(md_path)
        out.print(f"certificate (Markdown): {md_path}")
    style = "bold green" if cert.certified else "bold red"
    out.print(f"[{style}]{cert.verdict}[/]: {counts['passed']} passed, {counts['failed']} failed, "
              f"{counts['error']} errors, {counts['skipped']} skipped (not certified), "
              f"{counts['xfailed']} xfailed in {cert.seconds:.1f}s")
    raise SystemExit(0 if cert.certified else 1)
