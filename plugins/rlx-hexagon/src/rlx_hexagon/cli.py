"""``rlx hexagon-compile-check``: every kernel the conformance programs generate, compiled for Hexagon HVX
(the stand-in for ``rlx conformance hexagon``, which cannot execute here); ``rlx hexagon-qemu-check``:
the conformance cases run as scalar V67 code under qemu-hexagon. Imports click only."""

from __future__ import annotations

import click


@click.command("hexagon-compile-check", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--cpu", default=None, help="Hexagon core (-mcpu); default RLX_HEXAGON_CPU (hexagonv73).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def compile_check_command(cpu: str | None, as_json: bool) -> None:
    """Compile every C function the conformance suite's programs generate for hexagon:0 with clang's
    Hexagon target (HVX, 128-byte vectors). The verdict is "code generated and compiled"."""
    from rlx_core.plugin import echo_json

    from .check import compile_check

    res = compile_check(cpu=cpu, log=None if as_json else click.echo)
    if as_json:
        echo_json(res.summary())
    else:
        click.echo(f"verdict: {res.summary()['verdict']}")


@click.command("hexagon-qemu-check", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-k", "keyword", default=None, help="Only cases whose id contains this text.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def qemu_check_command(keyword: str | None, as_json: bool) -> None:
    """Run every conformance op and HIR case hexagon:0 claims as scalar Hexagon V67 code under
    qemu-hexagon (apt-get install qemu-user), compared by the suite's own checks. This executes the
    generated C, not the HVX object, and certifies nothing. Exit 1 when a case fails."""
    from rlx_core.plugin import echo_json

    from .qemu import conformance_sweep

    res = conformance_sweep(None if keyword is None else (lambda c: keyword in c.id),
                            log=None if as_json else click.echo)
    s = res.summary()
    if as_json:
        echo_json(s)
    else:
        click.echo(f"{s['cases']} cases: {s['passed']} passed, {s['failed']} failed, {s['error']} errors, "
                   f"{s['not_claimed']} not claimed ({s['seconds']} s)")
        click.echo(f"verdict: {s['verdict']}")
    if res.failures:
        raise SystemExit(1)
